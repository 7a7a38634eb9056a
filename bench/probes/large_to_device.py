"""How far a 64 MiB ``to_device`` is over its staging memcpy, by source type, ring and what ran before.

bench/results/transfer_h200.json (963a853) had ``to_device`` of 64 MiB idle at 0.65 ms p50 against
0.85 for the memcpy alone, bench/probes/staging_contention_h200.json at 1.87 against 0.94: this probe
times, in one process, median host ms over 35 calls (5 more untimed) of:

- ``to_device`` of a numpy array and of a CPU tensor, through a ring of its own and through the
  default ring, each from a synchronised device (two rounds: the first pays the slots' pinning);
- the same after other memory traffic (a 64 MiB memcpy and a 64 MiB copy to the device) right
  before each call;
- ``to_device`` and the memcpy back to back, with no synchronise between calls (each call's
  memcpy then overlaps the previous call's transfer);
- ``memcpy``: the staging memcpy alone into a pinned buffer of torch's, in each of those states.

Usage (H200): python3 bench/probes/large_to_device.py --out bench/probes/large_to_device_h200.json
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from _probe import out_path

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import MiB, PinnedRing, to_device

NBYTES = 64 * MiB
CALLS = 40
UNTIMED = 5


def median_ms(call: Callable[[], object], before: Callable[[], object], synchronise: bool) -> float:
    times = []
    for _ in range(CALLS):
        before()
        if synchronise:
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return float(np.median(times[UNTIMED:]))


def main() -> int:
    out = out_path(__doc__)
    payload = np.random.default_rng(0).integers(0, 256, NBYTES, dtype=np.uint8)
    tensor = torch.from_numpy(payload)
    staging = torch.empty(NBYTES, dtype=torch.uint8, pin_memory=True)
    other = torch.empty(NBYTES, dtype=torch.uint8, pin_memory=True)
    spare = torch.empty(NBYTES, dtype=torch.uint8, device="cuda")
    ring = PinnedRing()
    calls = {
        "to_device numpy, own ring": lambda: to_device(payload, "cuda", ring=ring),
        "to_device tensor, own ring": lambda: to_device(tensor, "cuda", ring=ring),
        "to_device numpy, default ring": lambda: to_device(payload, "cuda"),
        "to_device tensor, default ring": lambda: to_device(tensor, "cuda"),
        "memcpy": lambda: staging.copy_(tensor),
    }

    def traffic() -> None:
        staging.copy_(tensor)
        spare.copy_(other, non_blocking=True)

    rows = []
    for state, before, synchronise in (
        ("synchronised, round 1", lambda: None, True),
        ("synchronised, round 2", lambda: None, True),
        ("after traffic", traffic, True),
        ("back to back", lambda: None, False),
    ):
        for name, call in calls.items():
            row = {"state": state, "call": name, "ms_p50": median_ms(call, before, synchronise)}
            rows.append(row)
            print(row, flush=True)
    write_result(out, {"environment": capture_environment(sys.argv), "bytes": NBYTES, "calls": CALLS, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
