"""Where does a ring submit's host time go behind a busy stream? Step-by-step timings, idle vs busy.

Usage (H200): python3 bench/probes/submit_breakdown.py
"""

import gc
import time

import numpy as np
import torch

from audiomask.transfer import KiB, MiB, PinnedRing, to_device
from audiomask.transfer.harness import QueueFiller

REPEATS = 40
filler = QueueFiller("cuda")
side = torch.cuda.Stream()
current = torch.cuda.current_stream()


def timed(steps, busy):
    """steps: list of (name, fn); run in order after optional 50 ms fill; per-step host ms medians."""
    rows = {name: [] for name, _ in steps}
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        if busy:
            filler.fill(50.0)
        for name, fn in steps:
            t = time.perf_counter()
            fn()
            rows[name].append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return {name: (float(np.median(v)), float(np.percentile(v, 99))) for name, v in rows.items()}


def show(title, steps):
    for busy in (False, True):
        res = timed(steps, busy)
        print(f"{title:28s} busy={int(busy)} " + "  ".join(f"{n}={m:.3f}/{p:.3f}" for n, (m, p) in res.items()))


gc.disable()
pinned = torch.empty(1 * MiB, dtype=torch.uint8, pin_memory=True)
dst = torch.empty(1 * MiB, dtype=torch.uint8, device="cuda")
ev = torch.cuda.Event()

show("event.record side", [("rec", lambda: ev.record(side))])
show("query current", [("q", lambda: current.query()), ("rec", lambda: ev.record(side))])


def copy_on(stream, n):
    with torch.cuda.stream(stream):
        dst[:n].copy_(pinned[:n], non_blocking=True)


def alloc_on(stream, n):
    with torch.cuda.stream(stream):
        return torch.empty(n, dtype=torch.uint8, device="cuda")


for n in (16 * KiB, 1 * MiB):
    show(f"pinned copy side {n // KiB}K", [("copy", lambda n=n: copy_on(side, n))])
    show(f"rec, then copy side {n // KiB}K", [("rec", lambda: ev.record(side)), ("copy", lambda n=n: copy_on(side, n))])
    show(f"alloc side {n // KiB}K", [("alloc", lambda n=n: alloc_on(side, n))])
    show(f"alloc current {n // KiB}K", [("alloc", lambda n=n: torch.empty(n, dtype=torch.uint8, device="cuda"))])
    show("wait_event current", [("rec", lambda: ev.record(side)), ("wait", lambda: current.wait_event(ev))])

ring = PinnedRing()
for n in (16 * KiB, 1 * MiB, 16 * MiB):
    data = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    show(f"to_device {n // KiB}K", [("to_device", lambda d=data: to_device(d, "cuda", ring=ring))])
    show(
        f"to_device x2 {n // KiB}K",
        [
            ("first", lambda d=data: to_device(d, "cuda", ring=ring)),
            ("second", lambda d=data: to_device(d, "cuda", ring=ring)),
        ],
    )
    out = torch.empty(n, dtype=torch.uint8, device="cuda")
    show(f"to_device out= {n // KiB}K", [("to_device", lambda d=data, o=out: to_device(d, "cuda", ring=ring, out=o))])
    show(
        f"to_device stream=cur {n // KiB}K",
        [("to_device", lambda d=data: to_device(d, "cuda", ring=ring, stream=current))],
    )
