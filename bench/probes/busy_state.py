"""Which part of the transfer bench's busy_hot state makes every copy cost ~0.15-0.3 ms of host time.

bench/probes/submit_floor.py timed the same calls at 0.01-0.06 ms with the GPU busy. The bench's
busy_hot repetition differs in: the queue is 50 ms long (the probe's 3 ms), the host runs torch's
16 intra-op threads for the whole 50 ms drain, and the timed call is one per repetition. Each variant
here changes one of those; the rows time the same calls, one per repetition, p50/p99 ms.

Usage (H200): python3 bench/probes/busy_state.py [--json OUT.json]   (reruns itself for OMP_WAIT_POLICY)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, PinnedRing
from audiomask.transfer.harness import HostWorkload, QueueFiller, pin_per_copy

REPS = 30
DEV = torch.device("cuda", 0)


def run_variant(fill_ms: float, settle_ms: float, threads: int | None, drain: str) -> dict:
    if threads:
        torch.set_num_threads(threads)
    filler, workload = QueueFiller(DEV), HostWorkload(DEV)
    cur, side = torch.cuda.current_stream(DEV), torch.cuda.Stream(DEV)
    ring = PinnedRing()
    pageable = torch.empty(16 * KiB, dtype=torch.uint8)
    pinned = torch.empty(16 * KiB, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(16 * KiB, dtype=torch.uint8, device=DEV)
    event = torch.cuda.Event()
    box: list = []
    calls = {
        "event.record(side)": (lambda: event.record(side), None),
        "pageable .to 16K": (lambda: pageable.to(DEV, non_blocking=True), None),
        "pinned copy_ 16K on cur": (lambda: dst.copy_(pinned, non_blocking=True), None),
        "pin_per_copy 16K": (lambda: pin_per_copy(pageable, DEV), None),
        "ring_in_place 16K": (lambda: box.pop().to(DEV), lambda: box.append(ring.stage((16 * KiB,), np.uint8))),
    }
    rows = {}
    for name, (call, before) in calls.items():
        times = []
        for _ in range(REPS + 2):
            if drain == "hot":
                workload.wait_idle()
            else:
                torch.cuda.synchronize()
            if before is not None:
                before()
            filler.fill(fill_ms, cur)
            if settle_ms:
                workload.run_for(settle_ms)
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e3)
        times = times[2:]
        rows[name] = (float(np.median(times)), float(np.percentile(times, 99)))
    torch.cuda.synchronize()
    return {"threads": torch.get_num_threads(), "rows": rows}


VARIANTS = {  # name -> (fill ms, settle ms, torch threads or None, drain)
    "bench busy_hot (fill 50, settle 1)": (50.0, 1.0, None, "hot"),
    "fill 3, settle 1": (3.0, 1.0, None, "hot"),
    "fill 50, settle 10": (50.0, 10.0, None, "hot"),
    "fill 50, settle 1, 4 threads": (50.0, 1.0, 4, "hot"),
    "fill 50, settle 1, 1 thread": (50.0, 1.0, 1, "hot"),
    "fill 50, no settle, blocking drain": (50.0, 0.0, None, "sync"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--variant")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(*VARIANTS[args.variant])))
        return
    results = {}
    runs = [(name, {}) for name in VARIANTS] + [("bench busy_hot (fill 50, settle 1)", {"OMP_WAIT_POLICY": "PASSIVE"})]
    for name, env in runs:
        label = name + (" OMP_WAIT_POLICY=PASSIVE" if env else "")
        out = subprocess.run(
            [sys.executable, __file__, "--variant", name],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode:
            print(label, "failed:", out.stderr[-2000:])
            continue
        result = json.loads(out.stdout.strip().splitlines()[-1])
        results[label] = result
        print(f"== {label} (torch threads {result['threads']})")
        for row, (p50, p99) in result["rows"].items():
            print(f"   {row:26s} {p50:.4f} / {p99:.4f}")
    if args.json:
        write_result(Path(args.json), {"environment": capture_environment(sys.argv), "ms_p50_p99": results})


if __name__ == "__main__":
    main()
