"""The host floor of one host->device copy from pinned memory: torch's calls against the CUDA runtime's.

The transfer criteria still unmet (#2: a mask built in place submitted in under 0.1 ms at 16-64 MiB,
to_device within 0.1 ms of its staging memcpy from 4 MiB; #7: the ring's host time lowest of the copy
strategies) are judged against submits of 0.1-0.2 ms at 64 MiB, where the bare ``copy_`` from an
already pinned tensor costs 0.19 ms itself (bench/results/transfer_h200.json). This probe splits that
floor: the device allocation, torch's ``copy_`` into a preallocated tensor, ``Tensor.to``, and the same
copy and event record made straight through the CUDA runtime (``ctypes``: no dispatcher, no
TensorIterator, no pinned-block lookup). Host ms p50 / p99 per call, idle (synchronised before each
rep) and busy (~50 ms queued every 20 reps). Usage (H200):
python3 bench/probes/copy_floor.py --out bench/probes/copy_floor_h200.json
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import torch
from _probe import out_path, time_calls

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, MiB, PinnedRing, to_device
from audiomask.transfer.harness import QueueFiller, pin_per_copy

SIZES = (16 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)
HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice


def cudart() -> ctypes.CDLL:
    """The CUDA runtime library torch has loaded (found in this process's memory map)."""
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcudart" in line})
    if not paths:
        raise RuntimeError("libcudart is not loaded in this process (statically linked into torch?)")
    library = ctypes.CDLL(paths[0])
    library.cudaMemcpyAsync.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    library.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return library


def main() -> int:
    out = out_path(__doc__)
    runtime = cudart()
    filler = QueueFiller("cuda")
    device = torch.device("cuda", 0)
    ring = PinnedRing()
    rng = np.random.default_rng(0)
    rows = []
    mismatches = 0
    for nbytes in SIZES:
        payload = rng.integers(0, 256, nbytes, dtype=np.uint8)
        pageable = torch.from_numpy(payload)
        pinned = pageable.pin_memory()
        destination = torch.empty(nbytes, dtype=torch.uint8, device=device)
        event = torch.cuda.Event()
        event.record()
        stream = torch.cuda.current_stream(device)

        def runtime_copy(_: object, pinned=pinned, destination=destination) -> None:
            code = runtime.cudaMemcpyAsync(
                destination.data_ptr(), pinned.data_ptr(), pinned.numel(), HOST_TO_DEVICE, stream.cuda_stream
            )
            if code:
                raise RuntimeError(f"cudaMemcpyAsync returned {code}")

        def runtime_copy_and_event(_: object, pinned=pinned, destination=destination) -> None:
            runtime_copy(None, pinned, destination)
            runtime.cudaEventRecord(event.cuda_event, stream.cuda_stream)

        def in_place_submit(_: object, nbytes=nbytes) -> torch.Tensor:
            with ring.stage((nbytes,), np.uint8) as staged:
                return staged.to(device)

        calls = {
            "empty": lambda _, n=nbytes: torch.empty(n, dtype=torch.uint8, device=device),
            "copy_into": lambda _, p=pinned, d=destination: d.copy_(p, non_blocking=True),
            "to": lambda _, p=pinned: p.to(device, non_blocking=True),
            "event_record_torch": lambda _: event.record(stream),
            "runtime_copy_into": runtime_copy,
            "runtime_copy_and_event": runtime_copy_and_event,
            "in_place_submit": in_place_submit,
            "to_device": lambda _, p=payload: to_device(p, device, ring=ring),
            "pin_per_copy": lambda _, t=pageable: pin_per_copy(t, device),
        }
        if nbytes <= 1 * MiB:
            calls["pageable"] = lambda _, t=pageable: t.to(device, non_blocking=True)
        for busy in (False, True):
            row = {"bytes": nbytes, "busy": busy}
            for name, call in calls.items():
                row[name] = time_calls(call, busy, filler, reps=300 if not busy else 200)
            rows.append(row)
            print(
                {k: v if not isinstance(v, dict) else (round(v["p50"], 4), round(v["p99"], 4)) for k, v in row.items()}
            )
        torch.cuda.synchronize()
        destination.zero_()
        runtime_copy(None)
        torch.cuda.synchronize()
        mismatches += int(not torch.equal(destination.cpu(), pageable))
    print("mismatches", mismatches)
    write_result(out, {"environment": capture_environment(sys.argv), "mismatches": mismatches, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
