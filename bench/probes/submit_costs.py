"""What each CUDA call and each step of a ring submit costs on the host, idle vs busy GPU; staging engines cold vs hot.

Modes of a timing (median / p99 in ms):
- ``idle``: back to back, nothing queued on the GPU
- ``busy``: back to back, inside one long fill of the current stream (host threads hot)
- ``first``: one call per repetition, right after a 50 ms fill, the device synchronised before it
  (the state of a busy repetition in scripts/bench_transfer.py: host threads idled ~50 ms)

Usage (H200): python3 bench/probes/submit_costs.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import time
import traceback

import numpy as np
import torch

from audiomask.transfer import KiB, MiB, PinnedRing, stage_copy, to_device
from audiomask.transfer import staging as staging_module
from audiomask.transfer.harness import QueueFiller, pin_per_copy
from audiomask.transfer.ring import _current_stream, _slot_event, _slot_views

DEV = torch.device("cuda", 0)
filler = QueueFiller(DEV)
cur = torch.cuda.current_stream(DEV)
side = torch.cuda.Stream(DEV)
results: dict = {}


def stats(v: list[float]) -> tuple[float, float]:
    return float(np.median(v)), float(np.percentile(v, 99))


def timed(fn, mode: str, reps: int) -> tuple[float, float, float | None]:
    """(p50, p99, fraction of reps that found the queue still busy after) of fn's host ms."""
    times, busy_after = [], 0
    torch.cuda.synchronize()
    if mode == "busy":
        filler.fill(100 + reps * 1.0, cur)
    for _ in range(reps):
        if mode == "first":
            torch.cuda.synchronize()
            filler.fill(50, cur)
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
        if mode == "first":
            busy_after += not cur.query()
    if mode == "busy":
        busy_after = reps * (not cur.query())
    torch.cuda.synchronize()
    p50, p99 = stats(times)
    return p50, p99, (busy_after / reps if mode != "idle" else None)


def show(name: str, fn, modes=("idle", "busy"), reps: int = 300, first_reps: int = 15, setup=None, teardown=None):
    row = {}
    try:
        for mode in modes:
            if setup:
                setup()
            try:
                row[mode] = timed(fn, mode, first_reps if mode == "first" else reps)
            finally:
                if teardown:
                    teardown()
    except Exception:  # noqa: BLE001 - a probe reports and carries on
        row["error"] = traceback.format_exc(limit=2)
    results[name] = row
    cells = "  ".join(
        f"{m}={v[0]:.4f}/{v[1]:.4f}" + (f" q{v[2]:.1f}" if v[2] is not None and v[2] < 1 else "")
        for m, v in row.items()
        if m != "error"
    )
    print(f"{name:34s} {cells} {row.get('error', '')}", flush=True)


def section_calls() -> None:
    print("== single calls (ms p50/p99)")
    a16, b16 = np.zeros(16 * KiB, np.uint8), np.ones(16 * KiB, np.uint8)
    show("noop", lambda: None, ("idle", "busy", "first"))
    show("py_work sum(range(300))", lambda: sum(range(300)), ("idle", "busy", "first"))
    show("np.copyto 16K pageable", lambda: np.copyto(a16, b16), ("idle", "busy", "first"))
    show("torch.cuda.current_device", torch.cuda.current_device)
    show("torch.cuda.current_stream(dev)", lambda: torch.cuda.current_stream(DEV))
    show("_cuda_getCurrentStream raw", lambda: torch._C._cuda_getCurrentStream(0))
    show("set_stream side+back", lambda: (torch.cuda.set_stream(side), torch.cuda.set_stream(cur)))

    def ctx():
        with torch.cuda.stream(side):
            pass

    show("with torch.cuda.stream(side)", ctx)
    done = torch.cuda.Event()
    done.record(side)
    side.synchronize()
    show("event.query completed", done.query, ("idle", "busy", "first"))
    show("side.query (idle stream)", side.query)
    show("cur.query (busy stream)", cur.query)
    ev = torch.cuda.Event()
    show("event.record(side) reused", lambda: ev.record(side), ("idle", "busy", "first"))
    show("Event()+record(side)+drop", lambda: torch.cuda.Event().record(side), ("idle", "busy", "first"))
    show("event.wait(cur)", lambda: ev.wait(cur), ("idle", "busy", "first"))
    held = []
    show("empty 16K on cur", lambda: held.append(torch.empty(16 * KiB, dtype=torch.uint8, device=DEV)))
    held.clear()
    on_side = (lambda: torch.cuda.set_stream(side), lambda: torch.cuda.set_stream(cur))
    show(
        "empty 16K on side (current)",
        lambda: held.append(torch.empty(16 * KiB, dtype=torch.uint8, device=DEV)),
        ("idle", "busy", "first"),
        setup=on_side[0],
        teardown=on_side[1],
    )
    held.clear()

    def alloc_record_free():
        t = torch.empty(16 * KiB, dtype=torch.uint8, device=DEV)
        t.record_stream(cur)
        del t

    show(
        "empty+record_stream(cur)+free side",
        alloc_record_free,
        ("idle", "busy", "first"),
        setup=on_side[0],
        teardown=on_side[1],
    )

    for n in (16 * KiB, 1 * MiB, 16 * MiB, 64 * MiB):
        src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(n, dtype=torch.uint8, device=DEV)
        modes, reps = ("idle", "busy", "first"), (300 if n <= MiB else 60)

        def show_on_side(label: str, call, modes=modes, reps=reps) -> None:
            show(label, call, modes, reps, setup=on_side[0], teardown=on_side[1])

        show_on_side(f"copy_ {n // KiB}K hostalloc on side", lambda: dst.copy_(src, non_blocking=True))
        show(f"copy_ {n // KiB}K hostalloc on cur", lambda: dst.copy_(src, non_blocking=True), modes, reps)
        if n in (16 * KiB, 16 * MiB):
            mm = mmap.mmap(-1, n)
            reg = np.frombuffer(mm, dtype=np.uint8)
            err = torch.cuda.cudart().cudaHostRegister(reg.ctypes.data, n, 0)
            rt = torch.from_numpy(reg)
            print(f"  cudaHostRegister -> {err}; is_pinned={rt.is_pinned()}")
            show_on_side(f"copy_ {n // KiB}K registered on side", lambda: dst.copy_(rt, non_blocking=True))
            try:
                from cuda.bindings import driver as cu

                dptr, sptr, hs = cu.CUdeviceptr(dst.data_ptr()), src.data_ptr(), cu.CUstream(side.cuda_stream)
                show(
                    f"cuMemcpyHtoDAsync {n // KiB}K side", lambda: cu.cuMemcpyHtoDAsync(dptr, sptr, n, hs), modes, reps
                )
            except Exception as error:  # noqa: BLE001
                print(f"  cuda.bindings unavailable: {error!r}")
            torch.cuda.synchronize()
            del rt
            torch.cuda.cudart().cudaHostUnregister(reg.ctypes.data)


def section_submit() -> None:
    print("== submits (ms p50/p99), sizes 16K 1M 16M 64M")
    ring = PinnedRing()
    copy_stream = ring.copy_stream(DEV)
    for n in (16 * KiB, 1 * MiB, 16 * MiB, 64 * MiB):
        data = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        tensor = torch.from_numpy(data)
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        keep = []
        modes = ("idle", "first")
        show(f"to_device {n // KiB}K (kept)", lambda: keep.append(to_device(data, DEV, ring=ring)), modes, reps=100)
        keep.clear()
        show(f"pin_per_copy {n // KiB}K (kept)", lambda: keep.append(pin_per_copy(tensor, DEV)), modes, reps=100)
        keep.clear()
        show(
            f"pinned.to(dev) {n // KiB}K on cur",
            lambda: keep.append(pinned.to(DEV, non_blocking=True)),
            modes,
            reps=100,
        )
        keep.clear()
        # step by step, as Staged._submit does it (one call per rep after a fill)
        steps: dict[str, list[float]] = {}
        for mode in ("idle", "first"):
            steps = {}
            for _ in range(40 if mode == "idle" else 15):
                torch.cuda.synchronize()
                if mode == "first":
                    filler.fill(50, cur)
                marks = [("start", time.perf_counter())]

                def mark(name):
                    marks.append((name, time.perf_counter()))

                staged = ring._stage_checked((n,), torch.uint8)
                mark("acquire")
                consumer = _current_stream(DEV)
                mark("current_stream")
                slot = staged._slot
                done = _slot_event(slot, DEV)
                device = torch.cuda.current_device()
                mark("event+current_device")
                torch.cuda.set_stream(copy_stream)
                mark("set_stream copy")
                result = torch.empty((n,), dtype=torch.uint8, device=DEV)
                mark("empty")
                tensor, array = ring._staging_views(staged)
                if n < staging_module.parallel_copy_bytes():
                    np.copyto(array, data, casting="unsafe")
                else:
                    stage_copy(tensor, data)
                mark("stage")
                result.copy_(_slot_views(slot, staged._parts[0])[0], non_blocking=True)
                mark("copy_")
                done.record(copy_stream)
                mark("record")
                torch.cuda.set_stream(consumer)
                mark("set_stream back")
                done.wait(consumer)
                mark("wait")
                result.record_stream(consumer)
                mark("record_stream")
                ring._pool.release(slot, done, n)
                staged._slot = None
                mark("release")
                del result
                mark("free")
                assert device == 0
                for (_, a), (name, b) in zip(marks, marks[1:]):
                    steps.setdefault(name, []).append((b - a) * 1e3)
            line = "  ".join(f"{k}={np.median(v):.4f}/{np.max(v):.4f}" for k, v in steps.items())
            print(f"  steps {n // KiB}K {mode}: {line}", flush=True)
            results[f"steps {n // KiB}K {mode}"] = {k: stats(v) for k, v in steps.items()}
        keep.clear()
        torch.cuda.synchronize()


def section_engines() -> None:
    print("== staging engines (ms p50/p99): hot loop; after a 50 ms sleep; after a 50 ms GPU sync with 50 ms queued")
    print(f"  torch threads {torch.get_num_threads()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print("  " + torch.__config__.parallel_info().replace("\n", "\n  "))
    ring = PinnedRing(max_pinned_bytes=1 << 30)
    for n in (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB):
        data = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        tensor = torch.from_numpy(data)
        with ring.stage(n, np.uint8) as staged:
            array, view = staged.array, staged.tensor
            engines = {"numpy": lambda: np.copyto(array, data), "torch": lambda: view.copy_(tensor)}
            for engine, fn in engines.items():
                row = {}
                for cond in ("hot", "sleep50", "gpu50"):
                    times = []
                    for _ in range(30 if cond == "hot" else 15):
                        if cond == "sleep50":
                            time.sleep(0.05)
                        elif cond == "gpu50":
                            filler.fill(50, cur)
                            torch.cuda.synchronize()
                            filler.fill(50, cur)
                        t = time.perf_counter()
                        fn()
                        times.append((time.perf_counter() - t) * 1e3)
                    row[cond] = stats(times)
                torch.cuda.synchronize()
                results[f"engine {engine} {n // KiB}K"] = row
                print(
                    f"  {engine:5s} {n // KiB:6d}K " + "  ".join(f"{c}={v[0]:.3f}/{v[1]:.3f}" for c, v in row.items()),
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--sections", default="calls,submit,engines")
    args = parser.parse_args()
    gc.disable()
    began = time.perf_counter()
    for section in args.sections.split(","):
        try:
            {"calls": section_calls, "submit": section_submit, "engines": section_engines}[section]()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        print(f"-- {time.perf_counter() - began:.1f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
