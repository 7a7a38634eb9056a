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
- ``gpu_spin``: queues ~1 ms of GPU work and waits for it, spinning in the driver without the GIL (CUDA only).

The driver's own main thread (plan, encode, collect, then wait for the features) is the latency
benchmark's pipeline section; a mode that ran those steps back to back without waiting took the
threaded front end past the H200 call's time limit (two tries), as ``python`` does, and was dropped.

GIL contention shows as ``python`` (and ``driver``) slow, ``c_spin`` not; core contention as ``c_spin`` slow too.
Each mode runs with the front end on a thread (``where: thread``: the call's time on that thread) and
in a process of its own (``where: process``, :class:`~audiomask.features.process.FeatureProcess`: this
thread submits a cycle, does its work until the result is there, and the figure is the process's own
time for the cycle).

Usage (H200): python3 bench/probes/frontend_contention.py --out bench/probes/frontend_contention_h200.json
              python3 bench/probes/frontend_contention.py --threads 2 1 --batch 4 --calls 10 --out /tmp/c.json
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.latency import _streaming_chunking
from audiomask.bench.models import build_model
from audiomask.bench.signals import shared_noise
from audiomask.bench.timing import percentiles
from audiomask.features.process import FeatureProcess
from audiomask.transfer.harness import QueueFiller

MODES = ("alone", "python", "c_spin", "gpu_spin")


class MainThreadWork:
    """``mode``'s work on the main thread, in units of ~0.1-2 ms."""

    def __init__(self, mode: str, filler: QueueFiller | None) -> None:
        self.mode, self.filler = mode, filler
        self.small = np.ones(16 * 1024, dtype=np.float64)  # 128 KiB: in L2
        self.rounds = 0

    def unit(self) -> None:
        mode = self.mode
        if mode == "python":
            total = 0
            for i in range(2_000):
                total += i * i
        elif mode == "c_spin":
            for _ in range(20):
                self.small.sum()
        elif mode == "gpu_spin":
            self.filler.fill(1.0)  # type: ignore[union-attr]
            torch.cuda.synchronize()
        self.rounds += 1

    def until(self, done: Callable[[], bool]) -> None:
        if self.mode == "alone":
            while not done():
                time.sleep(1e-4)
            return
        while not done():
            self.unit()


def measure(driver, plan, mode: str, calls: int, filler: QueueFiller | None, process: FeatureProcess | None) -> dict:
    """Front-end ms per cycle while this thread does ``mode``: on a worker thread, or in ``process`` where given."""
    times: list[float] = []
    work = MainThreadWork(mode, filler)
    if process is None:
        finished = threading.Event()

        def worker() -> None:
            for _ in range(calls):
                started = time.perf_counter()
                driver._features(plan)
                times.append((time.perf_counter() - started) * 1e3)
            finished.set()

        thread = threading.Thread(target=worker)
        thread.start()
        work.until(finished.is_set)
        thread.join()
    else:
        for _ in range(calls):
            process.submit(plan.slots, plan.blocks, plan.final, plan.joins)
            work.until(lambda: process._connection.poll())
            times.append(process.result()[2] * 1e3)
    where = "thread" if process is None else "process"
    return {"mode": mode, "where": where, "frontend_ms": percentiles(times), "main_rounds": work.rounds}


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
        rows = []
        for threads in args.threads:
            torch.set_num_threads(threads)
            process = FeatureProcess(driver.frontend, args.batch, driver.chunk_frames, driver.first_block_samples)
            try:
                for where in (None, process):
                    for mode in MODES:
                        if mode == "gpu_spin" and not cuda:
                            continue
                        row = {"torch_threads": threads, **measure(driver, plan, mode, args.calls, filler, where)}
                        rows.append(row)
                        print(row, flush=True)
                        report = {"environment": capture_environment(sys.argv), "batch": args.batch, "rows": rows}
                        write_result(args.out, report)  # after every row: a run cut short keeps what it measured
            finally:
                process.close()
    finally:
        driver.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
