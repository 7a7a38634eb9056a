"""What a compiled small-copy submit would cost the host, beside the Python ring and the C++ strategies.

The ring's remaining transfer criteria (#2: beat ``pin_memory()`` per copy on host p99 at every size,
idle included; #7: the lowest host time of the copy strategies at every size, pageable included) lose
at 16 KiB-1 MiB by the microseconds of the ring's Python against one or two C++ calls
(bench/results/transfer_h200.json; bench/probes/to_device_phases_h200.json). Before deciding whether a
compiled fast path is worth a build step, this probe measures one: an extension built here with
``torch.utils.cpp_extension.load_inline`` (host C++ only) that does the staging memcpy, the result's
allocation, the ``cudaMemcpyAsync`` and the slot's event record in one call. Host ms p50 / p99, idle
(synchronised before each rep) and busy (~50 ms queued every 20 reps):

- ``pageable``: ``torch.from_numpy(a).to(device, non_blocking=True)``
- ``pin_per_copy``: ``torch.from_numpy(a).pin_memory().to(device, non_blocking=True)``
- ``to_device``: audiomask's ring, as shipped
- ``compiled_core``: the extension's call alone, into one fixed pinned slot with a premade event
- ``compiled_ring``: the extension's call between the ring pool's own acquire and release (what a
  compiled ``to_device`` for small numpy payloads would cost, less its argument checks)

Also reports the extension's build time. Usage (H200):
python3 bench/probes/compiled_submit.py --out bench/probes/compiled_submit_h200.json
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from _probe import out_path, time_calls
from torch.utils.cpp_extension import load_inline

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, MiB, PinnedRing, to_device
from audiomask.transfer import ring as ring_module
from audiomask.transfer.harness import QueueFiller, pin_per_copy

SIZES = (16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)

SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <cstring>

torch::Tensor stage_submit(py::buffer source, torch::Tensor slot, int64_t event) {
  py::buffer_info info = source.request();
  const size_t nbytes = static_cast<size_t>(info.size) * static_cast<size_t>(info.itemsize);
  std::memcpy(slot.data_ptr(), info.ptr, nbytes);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto result = torch::empty({static_cast<int64_t>(nbytes)},
                             torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, stream.device_index()));
  C10_CUDA_CHECK(cudaMemcpyAsync(result.data_ptr(), slot.data_ptr(), nbytes, cudaMemcpyHostToDevice, stream.stream()));
  C10_CUDA_CHECK(cudaEventRecord(reinterpret_cast<cudaEvent_t>(event), stream.stream()));
  return result;
}
"""


def main() -> int:
    out = out_path(__doc__)
    start = time.perf_counter()
    extension = load_inline(
        "audiomask_compiled_submit_probe",
        cpp_sources=SOURCE,
        functions=["stage_submit"],
        with_cuda=True,
        extra_cflags=["-O2"],
    )
    build_s = time.perf_counter() - start
    print(f"built in {build_s:.1f} s", flush=True)
    filler = QueueFiller("cuda")
    device = torch.device("cuda", 0)
    ring = PinnedRing()
    pool = ring._pool
    rng = np.random.default_rng(0)
    rows = []
    mismatches = 0
    for nbytes in SIZES:
        payload = rng.integers(0, 256, nbytes, dtype=np.uint8)
        tensor = torch.from_numpy(payload)
        slot = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        event = torch.cuda.Event()
        event.record()
        handle = event.cuda_event

        def compiled_core(_: object, slot=slot, handle=handle, payload=payload) -> torch.Tensor:
            return extension.stage_submit(payload, slot, handle)

        def compiled_ring(_: object, payload=payload, nbytes=nbytes) -> torch.Tensor:
            stream_ids, _stream = ring_module._current_stream_ids(device)
            leased = pool.acquire(nbytes)
            done = ring_module._slot_event(leased, device)  # the slot's own event, recorded in C++
            result = extension.stage_submit(payload, leased.buffer, done.cuda_event or _created(done))
            pool.release(leased, done, nbytes, stream_ids)
            return result

        calls = {
            "pageable": lambda _, t=tensor: t.to(device, non_blocking=True),
            "pin_per_copy": lambda _, t=tensor: pin_per_copy(t, device),
            "to_device": lambda _, p=payload: to_device(p, device, ring=ring),
            "compiled_core": compiled_core,
            "compiled_ring": compiled_ring,
        }
        for busy in (False, True):
            row = {"bytes": nbytes, "busy": busy}
            for name, call in calls.items():
                row[name] = time_calls(call, busy, filler, reps=400 if not busy else 200)
            rows.append(row)
            print(row, flush=True)
        torch.cuda.synchronize()
        mismatches += int(not torch.equal(compiled_core(None).cpu(), tensor))
    print("mismatches", mismatches)
    write_result(
        out, {"environment": capture_environment(sys.argv), "build_s": build_s, "mismatches": mismatches, "rows": rows}
    )
    return 0


def _created(event: torch.cuda.Event) -> int:
    """A fresh event's handle (torch creates the CUDA event at its first record)."""
    event.record()
    return event.cuda_event


if __name__ == "__main__":
    raise SystemExit(main())
