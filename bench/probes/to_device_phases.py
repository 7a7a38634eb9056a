"""Where ``to_device`` spends its host time, phase by phase and call by call, at every size.

bench/results/transfer_h200.json (commit 374c94b): ``to_device`` of 4 / 16 / 64 MiB took 0.16 /
0.13 / 0.36 ms more than its staging memcpy timed apart (p50, busy_steady), while
bench/probes/gated_copy_h200.json found a gated copy within 0.02 ms of the memcpy; and the ring's
host p99 lost to ``pin_memory()`` per copy at 16 KiB idle (0.039 vs 0.028 ms), 256 KiB idle
(0.093 vs 0.038) and 64 KiB busy_steady (0.131 vs 0.091). This probe wraps the ring's phases with
timers (acquire and, within it, reclaim and growth; the result's allocation; the gate; the copy;
the staging memcpy; the release with its event record; the lean path's consumer copy) and times
``to_device`` of numpy payloads, and ``pin_memory()`` per copy beside it, in three GPU states:
``idle`` (synchronised before each call), ``busy`` (~50 ms queued on an idle GPU every 20 calls)
and ``steady`` (the queue topped up to >= 40 ms before every call, outside the timed region, as
the transfer benchmark's busy_steady). Per size and state it reports the whole call (p50, p99),
each phase's p50, the paired overhead (the call minus its own staging memcpy, call by call: what
the call costs beyond the time needed to stage its payload), and the phases of the slowest 2 % of
calls.

Usage (H200): python3 bench/probes/to_device_phases.py --out bench/probes/to_device_phases_h200.json
"""

from __future__ import annotations

import gc
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch
from _probe import out_path, percentiles

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, MiB, PinnedRing, _gate, _pool, to_device
from audiomask.transfer import ring as ring_module
from audiomask.transfer import staging as staging_module
from audiomask.transfer.harness import QueueFeed, QueueFiller, pin_per_copy

SIZES = (16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)
REPS = 400
WARMUP = 20
BUSY_MS = 50.0
REFILL_EVERY = 20
STEADY_MS = 40.0
SLOW_SHARE = 0.02
MEMCPY = ("staging memcpy", "lean memcpy")

CALL: dict[str, float] = defaultdict(float)  # phases of the call being timed, ms


def timed(name: str, function: Callable) -> Callable:
    """``function``, its host ms added to CALL[name] on every call."""

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            CALL[name] += (time.perf_counter() - start) * 1e3

    return wrapper


class _TimedNumpy:
    """numpy, but ``copyto`` timed: the lean path's staging memcpy."""

    copyto = staticmethod(timed("lean memcpy", np.copyto))

    def __getattr__(self, name: str):
        return getattr(np, name)


def instrument() -> None:
    _pool.SlotPool.acquire = timed("acquire", _pool.SlotPool.acquire)
    _pool.SlotPool._reclaim = timed("reclaim (in acquire)", _pool.SlotPool._reclaim)
    _pool.SlotPool._grow = timed("grow (in acquire)", _pool.SlotPool._grow)
    _pool.SlotPool.release = timed("release (event record)", _pool.SlotPool.release)
    ring_module.Staged._allocate = timed("allocate result", ring_module.Staged._allocate)
    ring_module.Staged._copy = timed("queue copy_", ring_module.Staged._copy)
    ring_module.PinnedRing._copy_on_consumer = timed("lean submit", ring_module.PinnedRing._copy_on_consumer)
    ring_module.np = _TimedNumpy()
    _gate.close = timed("close gate", _gate.close)
    staging_module.stage_copy = timed("staging memcpy", staging_module.stage_copy)


def run(call: Callable[[], object], state: str, filler: QueueFiller, feed: QueueFeed) -> list[tuple[float, dict]]:
    """(whole ms, phases) of REPS calls of ``call`` in ``state``; each result dropped untimed."""
    records = []
    gc.collect()
    gc.disable()
    try:
        for i in range(REPS + WARMUP):
            if state == "idle" or (state == "busy" and i % REFILL_EVERY == 0):
                torch.cuda.synchronize()
                if state == "busy":
                    filler.fill(BUSY_MS)
            elif state == "steady":
                feed.top_up()
            CALL.clear()
            start = time.perf_counter()
            result = call()
            whole = (time.perf_counter() - start) * 1e3
            del result
            if i >= WARMUP:
                records.append((whole, dict(CALL)))
    finally:
        gc.enable()
    torch.cuda.synchronize()
    return records


def summary(records: list[tuple[float, dict]]) -> dict:
    wholes = [whole for whole, _ in records]
    names = sorted({name for _, phases in records for name in phases})
    phase_p50 = {name: percentiles([p.get(name, 0.0) for _, p in records])["p50"] for name in names}
    paired = [whole - sum(p.get(name, 0.0) for name in MEMCPY) for whole, p in records]
    slow = sorted(records, key=lambda r: r[0])[-max(1, int(len(records) * SLOW_SHARE)) :]
    return {
        "whole_ms": percentiles(wholes),
        "phases_p50_ms": phase_p50,
        "paired_overhead_ms": percentiles(paired),
        "slowest": {
            "calls": len(slow),
            "whole_ms_mean": float(np.mean([w for w, _ in slow])),
            "phases_ms_mean": {name: float(np.mean([p.get(name, 0.0) for _, p in slow])) for name in names},
            "with_growth": sum("grow (in acquire)" in p for _, p in slow),
        },
    }


def main() -> int:
    out = out_path(__doc__)
    filler = QueueFiller("cuda")
    feed = QueueFeed(filler, torch.cuda.current_stream(), STEADY_MS)
    instrument()
    ring = PinnedRing()
    rng = np.random.default_rng(0)
    rows = []
    for nbytes in SIZES:
        payload = rng.integers(0, 256, nbytes, dtype=np.uint8)
        source = torch.from_numpy(payload)
        for state in ("idle", "busy", "steady"):
            grows = ring.stats().grows
            row = {"bytes": nbytes, "state": state}
            row["ring"] = summary(run(lambda data=payload: to_device(data, "cuda", ring=ring), state, filler, feed))
            row["pin_per_copy"] = summary(run(lambda t=source: pin_per_copy(t, "cuda"), state, filler, feed))
            row["grows"] = ring.stats().grows - grows
            row["slots"] = ring.stats().slots
            rows.append(row)
            print(
                f"{nbytes >> 10:6d} KiB {state:6s} ring p50 {row['ring']['whole_ms']['p50']:.4f} "
                f"p99 {row['ring']['whole_ms']['p99']:.4f} paired {row['ring']['paired_overhead_ms']['p50']:.4f} | "
                f"pin p50 {row['pin_per_copy']['whole_ms']['p50']:.4f} p99 {row['pin_per_copy']['whole_ms']['p99']:.4f}"
                f" | grows {row['grows']} slots {row['slots']}",
                flush=True,
            )
            print("   phases", {k: round(v, 4) for k, v in row["ring"]["phases_p50_ms"].items()}, flush=True)
            print(
                "   slowest", {k: round(v, 4) for k, v in row["ring"]["slowest"]["phases_ms_mean"].items()}, flush=True
            )
    write_result(out, {"environment": capture_environment(sys.argv), "reps": REPS, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
