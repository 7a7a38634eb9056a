"""Where a large ``to_device`` spends its host time beyond the staging memcpy, phase by phase.

bench/results/transfer_h200.json (commit 374c94b): ``to_device`` of 4 / 16 / 64 MiB took 0.16 /
0.13 / 0.36 ms more than its staging memcpy (p50, busy), while bench/probes/gated_copy_h200.json
found a gated copy within 0.02 ms of the memcpy. This probe wraps the ring's phases with timers
(the acquire, the result's allocation, the gate, the copy, the staging memcpy, the release) and
times ``to_device`` of numpy payloads idle and busy (~50 ms queued), reporting per phase the p50
host ms and the share of the whole, and the ring's slots after each block.

Usage (H200): python3 bench/probes/to_device_phases.py --out bench/probes/to_device_phases_h200.json
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch
from _probe import out_path, percentiles, time_calls

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import MiB, PinnedRing, _gate, _pool, to_device
from audiomask.transfer import ring as ring_module
from audiomask.transfer import staging as staging_module
from audiomask.transfer.harness import QueueFiller

SIZES = (4 * MiB, 16 * MiB, 64 * MiB)
REPS = 100

PHASES: dict[str, list[float]] = defaultdict(list)


def timed(name: str, function: Callable) -> Callable:
    """``function``, its host ms appended to PHASES[name] on every call."""

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            PHASES[name].append((time.perf_counter() - start) * 1e3)

    return wrapper


def instrument() -> None:
    _pool.SlotPool.acquire = timed("acquire", _pool.SlotPool.acquire)
    _pool.SlotPool.release = timed("release (event record)", _pool.SlotPool.release)
    ring_module.Staged._allocate = timed("allocate result", ring_module.Staged._allocate)
    ring_module.Staged._copy = timed("queue copy_", ring_module.Staged._copy)
    _gate.close = timed("close gate", _gate.close)
    staging_module.stage_copy = timed("staging memcpy", staging_module.stage_copy)


def main() -> int:
    out = out_path(__doc__)
    filler = QueueFiller("cuda")
    instrument()
    ring = PinnedRing()
    rng = np.random.default_rng(0)
    rows = []
    for nbytes in SIZES:
        payload = rng.integers(0, 256, nbytes, dtype=np.uint8)
        for busy in (False, True):
            to_device(payload, "cuda", ring=ring)  # grows the ring to this size outside the timed reps
            PHASES.clear()
            whole = time_calls(lambda _, data=payload: to_device(data, "cuda", ring=ring), busy, filler, reps=REPS)
            phases = {name: percentiles(times)["p50"] for name, times in PHASES.items()}
            row = {
                "bytes": nbytes,
                "busy": busy,
                "to_device": whole,
                "phases_p50_ms": phases,
                "unaccounted_p50_ms": whole["p50"] - sum(phases.values()),
                "gated": bool(PHASES.get("close gate")),
                "slots": ring.stats().slots,
                "grows": ring.stats().grows,
            }
            rows.append(row)
            print(row, flush=True)
    torch.cuda.synchronize()
    write_result(out, {"environment": capture_environment(sys.argv), "reps": REPS, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
