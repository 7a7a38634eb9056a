"""Where the host time of a pinned submit goes while the GPU is busy, and what the floor is.

The transfer bench found every pinned non_blocking copy costing 0.15-0.27 ms of host time behind a
busy stream (idle: ~0.03 ms). This probe times single driver calls and whole submit recipes in three
states, p50/p99 ms over many reps:

- ``idle``: nothing queued
- ``busy``: inside one long ``_sleep`` on the consumer stream, a little host work between reps
- ``after_launch``: like busy, but a tiny kernel is launched on the consumer right before each rep
  (does a call pay for the previous launch's submission?)
- ``wake``: the GPU drains while the host works, then ~3 ms of work is queued on the idle GPU and
  the call follows at once (the state of the transfer bench's ``busy`` rows)
- ``wake_settled``: as ``wake``, with 1 ms of host work between queueing and the call

Recipes compare torch's ``copy_`` from torch-allocated pinned memory (the caching host allocator
records its own event per copy) with ``copy_`` from memory pinned by ``cudaHostRegister`` (no
allocator bookkeeping) and with raw cudart calls through ctypes (no torch dispatch at all).

Usage (H200): python3 bench/probes/submit_floor.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numpy as np
import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, MiB, PinnedRing
from audiomask.transfer.harness import QueueFiller, pin_per_copy

DEV = torch.device("cuda", 0)
filler = QueueFiller(DEV)
cur = torch.cuda.current_stream(DEV)
side = torch.cuda.Stream(DEV)
work_a, work_b, work_out = torch.rand(1 << 18), torch.rand(1 << 18), torch.empty(1 << 18)
tick = torch.zeros(1, device=DEV)
results: dict = {}


def cudart() -> ctypes.CDLL:
    """The cudart that torch loaded (found in this process's maps), so ctypes calls share its context."""
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcudart" in line})
    for path in paths:
        return ctypes.CDLL(path)
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("no libcudart found")


RT = cudart()
RT.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
RT.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
RT.cudaStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
RT.cudaEventQuery.argtypes = [ctypes.c_void_p]
RT.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
RT.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
H2D = 1


def raw_event() -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    assert RT.cudaEventCreateWithFlags(ctypes.byref(handle), 2) == 0  # cudaEventDisableTiming
    return handle


def registered(nbytes: int) -> tuple[np.ndarray, torch.Tensor]:
    """Page-aligned numpy memory pinned with cudaHostRegister, and a torch view of it."""
    raw = np.empty(nbytes + 4096, np.uint8)
    offset = (-raw.ctypes.data) % 4096
    array = raw[offset : offset + nbytes]
    assert RT.cudaHostRegister(array.ctypes.data, nbytes, 0) == 0
    return array, torch.from_numpy(array)


def hot_drain() -> None:
    while not cur.query():
        torch.mul(work_a, work_b, out=work_out)
    torch.cuda.synchronize()


def host_work_for(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        torch.mul(work_a, work_b, out=work_out)


def timed_wake(fn, settle_ms: float, reps: int, before=None) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        hot_drain()
        if before is not None:
            before()
        filler.fill(3.0, cur)
        host_work_for(settle_ms)
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return float(np.median(times)), float(np.percentile(times, 99))


def timed(fn, mode: str, reps: int, before=None) -> tuple[float, float]:
    if mode in ("wake", "wake_settled"):
        return timed_wake(fn, 1.0 if mode == "wake_settled" else 0.0, min(reps, 100), before)
    times = []
    torch.cuda.synchronize()
    if mode != "idle":
        filler.fill(60 + reps * 0.5, cur)
    for _ in range(reps):
        torch.mul(work_a, work_b, out=work_out)  # the host stays hot, as a driver's does
        if before is not None:
            before()
        if mode == "after_launch":
            tick.add_(1)
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    busy = not cur.query()
    torch.cuda.synchronize()
    if mode != "idle" and not busy:
        print(f"  warning: the queue drained during {mode}")
    return float(np.median(times)), float(np.percentile(times, 99))


MODES = ("idle", "busy", "after_launch")
WAKE_MODES = MODES + ("wake", "wake_settled")


def show(name: str, fn, reps: int = 300, before=None, modes=MODES) -> None:
    row = {mode: timed(fn, mode, reps, before) for mode in modes}
    results[name] = row
    print(f"{name:44s} " + "  ".join(f"{m}={v[0]:.4f}/{v[1]:.4f}" for m, v in row.items()), flush=True)


def on_side(fn):
    def run():
        torch.cuda.set_stream(side)
        try:
            fn()
        finally:
            torch.cuda.set_stream(cur)

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(DEV)}, cudart {RT._name}")
    done = torch.cuda.Event()
    done.record(side)
    side.synchronize()
    ev, rev = torch.cuda.Event(), raw_event()
    show("noop", lambda: None)
    show("completed event.query", done.query)
    show("consumer.query", cur.query)
    show("event.record(side)", lambda: ev.record(side), modes=WAKE_MODES)
    show("event.wait(cur)", lambda: ev.wait(cur))
    show("raw cudaEventQuery completed", lambda: RT.cudaEventQuery(rev))
    show("raw cudaEventRecord(side)", lambda: RT.cudaEventRecord(rev, side.cuda_stream))
    show("raw cudaStreamWaitEvent(cur)", lambda: RT.cudaStreamWaitEvent(cur.cuda_stream, rev, 0))
    show("set_stream side+back", lambda: (torch.cuda.set_stream(side), torch.cuda.set_stream(cur)))
    for n in (16 * KiB, 1 * MiB):
        tag = f"{n // KiB}K"
        hostalloc = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        reg_np, reg = registered(n)
        pageable = torch.empty(n, dtype=torch.uint8)
        dst = torch.empty(n, dtype=torch.uint8, device=DEV)
        show(f"copy_ {tag} hostalloc->dst on side", on_side(lambda: dst.copy_(hostalloc, non_blocking=True)))
        show(f"copy_ {tag} registered->dst on side", on_side(lambda: dst.copy_(reg, non_blocking=True)))
        show(f"copy_ {tag} hostalloc->dst on cur", lambda: dst.copy_(hostalloc, non_blocking=True))
        show(f"copy_ {tag} registered->dst on cur", lambda: dst.copy_(reg, non_blocking=True), modes=WAKE_MODES)
        show(
            f"raw memcpyAsync {tag} registered on side",
            lambda: RT.cudaMemcpyAsync(dst.data_ptr(), reg_np.ctypes.data, n, H2D, side.cuda_stream),
        )

        def torch_submit():
            torch.cuda.set_stream(side)
            dst.copy_(reg, non_blocking=True)
            ev.record(side)
            torch.cuda.set_stream(cur)
            ev.wait(cur)

        show(f"submit torch {tag} registered (copy,rec,wait)", torch_submit)
        dst_ptr, src_ptr, side_handle, cur_handle = (
            dst.data_ptr(),
            reg_np.ctypes.data,
            side.cuda_stream,
            cur.cuda_stream,
        )

        def raw_submit():
            RT.cudaMemcpyAsync(dst_ptr, src_ptr, n, H2D, side_handle)
            RT.cudaEventRecord(rev, side_handle)
            RT.cudaStreamWaitEvent(cur_handle, rev, 0)

        show(f"submit raw {tag} (memcpy,rec,wait)", raw_submit)

        def raw_submit_query():
            RT.cudaEventQuery(rev)
            raw_submit()

        show(f"submit raw {tag} + query", raw_submit_query)
        show(f"pin_per_copy {tag}", lambda: pin_per_copy(pageable, DEV), modes=WAKE_MODES)
        show(f"alloc {tag} on side", on_side(lambda: torch.empty(n, dtype=torch.uint8, device=DEV)))

        ring = PinnedRing(slot_bytes=max(n, 4 * MiB), num_slots=4)
        staged_box: list = []

        def lease():
            staged_box.append(ring.stage((n,), np.uint8))

        def ring_submit():
            staged_box.pop().to(DEV)

        show(f"ring_in_place submit {tag}", ring_submit, before=lease, modes=WAKE_MODES)

        def ring_submit_out():
            staged_box.pop().to(DEV, out=dst)

        show(f"ring_in_place submit {tag} out=", ring_submit_out, before=lease)
    if args.json:
        write_result(Path(args.json), {"environment": capture_environment(sys.argv), "ms_p50_p99": results})


if __name__ == "__main__":
    main()
