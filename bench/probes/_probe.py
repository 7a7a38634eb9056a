"""What the transfer probes share: host time of a call, idle or behind a busy queue, and the command line.

Run the probes from the repository root (``python3 bench/probes/NAME.py --out FILE``): this
directory is then first on the import path.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from audiomask.transfer.harness import QueueFiller

REPS = 200
WARMUP = 5
BUSY_MS = 50.0
REFILL_EVERY = 20  # busy reps per fill: ~20 copies of < 1 ms each leave the 50 ms queue busy


def out_path(doc: str) -> Path:
    """The ``--out`` argument of a probe whose module docstring is ``doc``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args().out


def percentiles(times: list[float]) -> dict[str, float]:
    values = np.asarray(times)
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


def time_calls(
    call: Callable[[object], object],
    busy: bool,
    filler: QueueFiller,
    prepare: Callable[[], object] = lambda: None,
    reps: int = REPS,
) -> dict[str, float]:
    """Host ms (p50, p99) of ``call(prepare())`` (``prepare`` untimed) over ``reps``.

    Idle: the device is synchronised before each rep. Busy: BUSY_MS of work is
    queued every REFILL_EVERY reps, from a synchronised device.
    """
    times = []
    for i in range(reps + WARMUP):
        if not busy or i % REFILL_EVERY == 0:
            torch.cuda.synchronize()
            if busy:
                filler.fill(BUSY_MS)
        state = prepare()
        start = time.perf_counter()
        call(state)
        if i >= WARMUP:
            times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return percentiles(times)
