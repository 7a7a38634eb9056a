"""Is a large ``to_device`` slow because its submit runs on caches the staging memcpy has just flushed?

And would a copy queued *before* the staging memcpy, held back on the GPU by a host-written flag
(``cuStreamWaitValue32``), take that cost off the host?

bench/results/transfer_h200_run5.json: ``to_device`` of 16 and 64 MiB costs 0.17 and 0.23 ms more than
its staging memcpy, while a bare ``copy_`` of 64 MiB from warm caches costs ~0.008 ms
(bench/probes/pinned_kinds_h200.json). Times p50/p99 host ms, idle and busy (~50 ms queued):

- ``stage``: the staging memcpy alone (torch's ``copy_`` into a pinned slot);
- ``stage_then_copy``: staging memcpy, then allocate + ``copy_`` + event; ``copy_after_stage`` is
  the second half alone (the submit on cold caches);
- ``gated``: allocate, wait-value on the stream, ``copy_``, event (all before the memcpy, on warm
  caches), then the staging memcpy, then one store to the flag; ``gated_overhead`` = gated - stage;
- ``to_device``: audiomask's.

Every tenth idle gated copy's result is checked against its source (busy reps reuse the slot
while earlier copies are queued: timing only). Usage (H200):
python3 bench/probes/gated_copy.py --out bench/probes/gated_copy_h200.json
"""

from __future__ import annotations

import ctypes
import sys
import time

import numpy as np
import torch
from _probe import out_path, percentiles

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import MiB, to_device
from audiomask.transfer.harness import QueueFiller

SIZES = (1 * MiB, 16 * MiB, 64 * MiB)
REPS = 60
WARMUP = 3
BUSY_MS = 50.0
REFILL_EVERY = 10
WAIT_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0, safe across wrap-around


def wait_value_fn():
    cuda = ctypes.CDLL("libcuda.so.1")
    for name in ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"):
        fn = getattr(cuda, name, None)
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
            return name, fn
    raise RuntimeError("libcuda has no cuStreamWaitValue32")


def main() -> int:
    out = out_path(__doc__)
    filler = QueueFiller("cuda")
    name, wait_value = wait_value_fn()
    stream = torch.cuda.current_stream()
    flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    flag_np = flag.numpy()
    sequence = [0]
    rng = np.random.default_rng(0)
    rows = []
    mismatches = 0
    for nbytes in SIZES:
        source = torch.from_numpy(rng.integers(0, 256, nbytes, dtype=np.uint8))
        slot = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        event = torch.cuda.Event()
        for busy in (False, True):
            times: dict[str, list[float]] = {
                k: [] for k in ("stage", "stage_then_copy", "copy_after_stage", "gated", "to_device")
            }
            for i in range(REPS + WARMUP):
                for variant in ("stage", "stage_then_copy", "gated", "to_device"):
                    if busy:
                        if i % REFILL_EVERY == 0 and variant == "stage":
                            torch.cuda.synchronize()
                            filler.fill(BUSY_MS)
                    else:
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    if variant == "stage":
                        slot.copy_(source)
                    elif variant == "stage_then_copy":
                        slot.copy_(source)
                        middle = time.perf_counter()
                        result = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                        result.copy_(slot, non_blocking=True)
                        event.record(stream)
                    elif variant == "gated":
                        sequence[0] += 1
                        result = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                        error = wait_value(stream.cuda_stream, flag.data_ptr(), sequence[0], WAIT_GEQ)
                        result.copy_(slot, non_blocking=True)
                        event.record(stream)
                        try:
                            slot.copy_(source)
                        finally:
                            flag_np[0] = sequence[0]
                        if error:
                            raise RuntimeError(f"{name} returned {error}")
                    else:
                        to_device(source, "cuda")
                    end = time.perf_counter()
                    if i >= WARMUP:
                        times[variant].append((end - start) * 1e3)
                        if variant == "stage_then_copy":
                            times["copy_after_stage"].append((end - middle) * 1e3)
                    if variant == "gated" and not busy and i % 10 == 0:  # busy: the slot is reused while queued
                        torch.cuda.synchronize()
                        mismatches += int(not torch.equal(result.cpu(), source))
                        if i % 20 == 0:
                            source[0] ^= 1  # a changed payload: the check sees the new bytes, not the old
            row = {"bytes": nbytes, "busy": busy} | {k: percentiles(v) for k, v in times.items()}
            row["gated_overhead_p50"] = row["gated"]["p50"] - row["stage"]["p50"]
            row["to_device_overhead_p50"] = row["to_device"]["p50"] - row["stage"]["p50"]
            rows.append(row)
            print(row, flush=True)
    torch.cuda.synchronize()
    print("mismatches", mismatches)
    write_result(
        out,
        {"environment": capture_environment(sys.argv), "wait_value": name, "mismatches": mismatches, "rows": rows},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
