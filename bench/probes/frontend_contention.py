"""What slows the driver's front end down when the main thread works beside it: the GIL or the cores?

Under overlap the driver's worker thread computes a cycle's features while the main thread launches
the encoder step and decodes the last cycle's results; on the H200 the front end then took 1.7-2.3x
its serial time (bench/probes/pipeline_threads_h200*.json), whatever torch's thread count, the wait
for results (spin or blocking) or the interpreter's switch interval. This probe times one cycle's
front end (:meth:`StreamingDriver._features`, B streams, 320 ms blocks) on a worker thread while the
main thread does one of:

- ``alone``: waits for the worker (the serial driver's front end);
- ``python``: runs a pure-Python loop (holds the GIL but for the interpreter's forced switches; one core);
- ``c_spin``: spins in C without the GIL (numpy sums over an array that fits in L2; one core);
- ``gpu_spin``: queues ~1 ms of GPU work and waits for it, spinning in the driver without the GIL (CUDA only);
- ``driver``: what the overlapped driver's main thread does: encode a cycle and collect the last one.

GIL contention shows as ``python`` (and ``driver``) slow, ``c_spin`` not; core contention as ``c_spin`` slow too.

Usage (H200): python3 bench/probes/frontend_contention.py --out bench/probes/frontend_contention_h200.json
              python3 bench/probes/frontend_contention.py --threads 2 1 --batch 4 --calls 10 --out /tmp/c.json
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.latency import _streaming_chunking
from audiomask.bench.models import build_model
from audiomask.bench.signals import shared_noise
from audiomask.bench.timing import percentiles
from audiomask.transfer.harness import QueueFiller

MODES = ("alone", "python", "c_spin", "gpu_spin", "driver")


def main_thread_work(mode: str, driver, plan, stop: threading.Event, filler: QueueFiller | None) -> int:
    """Run ``mode``'s work on this thread until ``stop`` is set; how many rounds it did."""
    rounds = 0
    small = np.ones(16 * 1024, dtype=np.float64)  # 128 KiB: in L2
    in_flight = None
    while not stop.is_set():
        if mode == "alone":
            stop.wait()
        elif mode == "python":
            total = 0
            for i in range(20_000):
                total += i * i
        elif mode == "c_spin":
            for _ in range(200):
                small.sum()
        elif mode == "gpu_spin":
            filler.fill(1.0)  # type: ignore[union-attr]
            torch.cuda.synchronize()
        elif mode == "driver":
            record = driver._encode(plan)
            if in_flight is not None:
                driver._collect(in_flight)
            in_flight = record
        rounds += 1
    if in_flight is not None:
        driver._collect(in_flight)
    return rounds


def measure(driver, plan, mode: str, calls: int, filler: QueueFiller | None) -> dict:
    """Front-end ms per call on a worker thread while this thread does ``mode``."""
    times: list[float] = []

    def worker() -> None:
        for _ in range(calls):
            started = time.perf_counter()
            driver._features(plan)
            times.append((time.perf_counter() - started) * 1e3)

    stop = threading.Event()
    thread = threading.Thread(target=lambda: (worker(), stop.set()))
    thread.start()
    rounds = main_thread_work(mode, driver, plan, stop, filler)
    thread.join()
    return {"mode": mode, "frontend_ms": percentiles(times), "main_rounds": rounds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[max(1, (os.cpu_count() or 1) - 1), 8])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    model = build_model("shipped", device)
    chunk_size, left_chunk = _streaming_chunking(model)
    driver = model.driver(args.batch, chunk_size, left_chunk, overlap=False)
    filler = QueueFiller(device) if cuda else None
    try:
        source, starts = shared_noise(args.batch, 4 * driver.block_samples)
        streams = [driver.open() for _ in range(args.batch)]
        for stream, start in zip(streams, starts):
            driver.feed(stream, source[start : start + 4 * driver.block_samples])
        plan = driver._plan(None)
        driver._features(plan)
        driver._encode(plan)  # captures the graphs outside the timed calls
        rows = []
        for threads in args.threads:
            torch.set_num_threads(threads)
            for mode in MODES:
                if mode == "gpu_spin" and not cuda:
                    continue
                row = {"torch_threads": threads, **measure(driver, plan, mode, args.calls, filler)}
                rows.append(row)
                print(row, flush=True)
    finally:
        driver.close()
    write_result(args.out, {"environment": capture_environment(sys.argv), "batch": args.batch, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
