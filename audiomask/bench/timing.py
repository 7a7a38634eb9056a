"""Small helpers every benchmark section shares: percentiles, time budgets and progress lines."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

__all__ = ["Budget", "log", "percentiles"]

_STARTED = time.perf_counter()  # progress lines count seconds from the benchmark's import


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """``p50``, ``p95``, ``p99`` and ``max`` of ``samples`` (any unit; numpy's linear interpolation).

    >>> percentiles([1.0, 2.0, 3.0, 4.0, 5.0])["p50"]
    3.0
    """
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("samples must not be empty")
    return {
        "p50": float(np.percentile(values, 50)),
        "p95": float(np.percentile(values, 95)),
        "p99": float(np.percentile(values, 99)),
        "max": float(values.max()),
    }


class Budget:
    """Wall-clock seconds a section may still spend; sections check it between measurements.

    >>> budget = Budget(60.0)
    >>> budget.expired(), 0 < budget.left() <= 60
    (False, True)
    """

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds!r}")
        self.seconds = float(seconds)
        self._deadline = time.perf_counter() + self.seconds

    def left(self) -> float:
        """Seconds left (negative once overrun)."""
        return self._deadline - time.perf_counter()

    def expired(self) -> bool:
        return self.left() <= 0


def log(message: str) -> None:
    """Print a progress line, prefixed with the seconds since the benchmark started, at once."""
    print(f"[{time.perf_counter() - _STARTED:7.1f} s] {message}", flush=True)
