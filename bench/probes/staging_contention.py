"""Is the staging memcpy inside a large ``to_device`` slower than alone, and why?

bench/results/transfer_h200.json (31b50ca): ``to_device`` of 16 / 64 MiB took 0.126 / 0.468 ms more
than the staging memcpy timed apart (busy_steady, p50), and bench/probes/to_device_phases_h200.json
timed the memcpy inside the call at 1.16 ms for 64 MiB against 0.87 ms alone. Two suspects: the DMA
of the previous copy, still reading host memory while the next payload is staged (back-to-back copies
of 64 MiB take ~1.2 ms each on the bus), and the closed gate of the copy queued before the memcpy
(the GPU polls a word in host memory). Host ms (p50, p99) of torch's ``copy_`` into a pinned buffer:

- ``alone``: the device idle;
- ``beside_dma``: right after queueing a copy of another pinned buffer of the same size (its DMA runs
  through the memcpy);
- ``gate_closed``: with a copy queued behind a closed gate (opened after the memcpy);
- ``to_device`` and ``to_device_back_to_back``: the whole call, from an idle device and right after
  the previous call (whose copy may still run);
- ``small_after_memcpy``: ``to_device`` of 16 KiB right after the staging memcpy of the row's size,
  against ``small_alone`` (after a synchronise only): what a large memcpy, which runs on every core
  (the calling thread included) and refills their caches with payload, costs the host code after it.

Usage (H200): python3 bench/probes/staging_contention.py --out bench/probes/staging_contention_h200.json
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np
import torch
from _probe import out_path, percentiles

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, MiB, _gate, to_device

SIZES = (4 * MiB, 16 * MiB, 64 * MiB)
REPS = 60
WARMUP = 3


def main() -> int:
    out = out_path(__doc__)
    stream = torch.cuda.current_stream()
    word_tensor, word = _gate.new_word()
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, 16 * KiB, dtype=np.uint8)
    rows = []
    gate_values = itertools.count(1)
    for nbytes in SIZES:
        source = torch.from_numpy(rng.integers(0, 256, nbytes, dtype=np.uint8))
        staging = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        other = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        result = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        spare = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        times: dict[str, list[float]] = {
            k: []
            for k in (
                "alone",
                "beside_dma",
                "gate_closed",
                "to_device",
                "to_device_back_to_back",
                "small_alone",
                "small_after_memcpy",
            )
        }
        for i in range(REPS + WARMUP):
            torch.cuda.synchronize()
            start = time.perf_counter()
            staging.copy_(source)
            alone = time.perf_counter() - start

            torch.cuda.synchronize()
            spare.copy_(other, non_blocking=True)
            start = time.perf_counter()
            staging.copy_(source)
            beside_dma = time.perf_counter() - start

            torch.cuda.synchronize()
            value = next(gate_values)
            if not _gate.close(stream, word, value):
                raise RuntimeError("the driver refused cuStreamWaitValue32")
            result.copy_(staging, non_blocking=True)
            start = time.perf_counter()
            try:
                staging.copy_(source)
            finally:
                _gate.open_(word, value)
            gate_closed = time.perf_counter() - start

            torch.cuda.synchronize()
            start = time.perf_counter()
            to_device(source, "cuda")
            cold = time.perf_counter() - start
            start = time.perf_counter()
            to_device(source, "cuda")
            back_to_back = time.perf_counter() - start

            torch.cuda.synchronize()
            start = time.perf_counter()
            to_device(small, "cuda")
            small_alone = time.perf_counter() - start
            torch.cuda.synchronize()
            staging.copy_(source)
            start = time.perf_counter()
            to_device(small, "cuda")
            small_after = time.perf_counter() - start
            if i >= WARMUP:
                measured = (alone, beside_dma, gate_closed, cold, back_to_back, small_alone, small_after)
                for key, seconds in zip(times, measured):
                    times[key].append(seconds * 1e3)
        row = {"bytes": nbytes} | {k: percentiles(v) for k, v in times.items()}
        rows.append(row)
        print(row, flush=True)
    torch.cuda.synchronize()
    del word_tensor
    write_result(out, {"environment": capture_environment(sys.argv), "reps": REPS, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
