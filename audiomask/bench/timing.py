"""Small helpers every benchmark section shares: percentiles, time budgets and progress lines."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

__all__ = ["MS_PER_S", "NS_PER_S", "Budget", "log", "percentiles", "time_interleaved"]

MS_PER_S = 1000  # the benchmarks report milliseconds
NS_PER_S = 1_000_000_000  # time.perf_counter_ns() counts nanoseconds

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


def time_interleaved(methods: Mapping[str, Callable[[], object]], rounds: int, warmup: int) -> dict[str, np.ndarray]:
    """``{name: (rounds,) int64 nanoseconds}`` per call, calling the methods in turn, round by round.

    Each method is first called ``warmup`` times untimed. Interleaving makes drift in the machine's speed
    (other processes, clocks) hit every method alike, so that ratios measured side by side hold.

    >>> times = time_interleaved({"a": lambda: None, "b": lambda: sum(range(100))}, rounds=3, warmup=1)
    >>> sorted(times), times["a"].shape, times["a"].dtype
    (['a', 'b'], (3,), dtype('int64'))
    """
    for method in methods.values():
        for _ in range(warmup):
            method()
    times = {name: np.empty(rounds, dtype=np.int64) for name in methods}
    for index in range(rounds):
        for name, method in methods.items():
            began = time.perf_counter_ns()
            method()
            times[name][index] = time.perf_counter_ns() - began
    return times


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
