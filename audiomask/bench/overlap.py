"""Serial versus overlapped driver: does the CPU's front end hide behind the encoder step?

The workload is a batch of ``B`` streams through
:class:`~audiomask.asr.driver.StreamingDriver`, with every stream's audio there
from the start (so that the next cycle's features *can* be computed while the
current cycle is encoded: a server catching up, or batch transcription). ``B``
comes from a short serial calibration, doubling from 1, that makes the front
end's time per cycle (``cpu_s``, worker thread) and the encoder's (``gpu_s``:
CUDA events on CUDA, ``perf_counter`` on the CPU) comparable, where overlap
matters most, at a load where the larger of them takes at least
:data:`MIN_CYCLE_S` a cycle. Then the same workload runs serial (``overlap=False``: features,
encode, wait for the results, cycle after cycle) and overlapped. Reported:
``cpu_s``, ``gpu_s``, ``serial_wall_s``, ``pipelined_wall_s``, ``overlap = (T_cpu
+ T_gpu - T_wall) / min(T_cpu, T_gpu)`` of the overlapped run, its wall time
over ``max(T_cpu, T_gpu)`` (the target: within :data:`WITHIN`, 10 %) and over the sum
of per-cycle maxima (a perfect two-stage pipeline), and the host time per
chunk (``enqueue_s``: staging, launching the step, head and argmax). Each mode
runs ``repeats`` times (fewer where the budget is short), interleaved; the run
with the median wall time is kept, and ``*_wall_s_spread`` says how far the
repeats lie apart ((max - min) / median).

The section runs with torch's intra-op threads set to ``threads`` (the
benchmark passes :func:`pipeline_threads`: one core fewer than the machine
has) and puts the old count back after. Why: with as many pool threads as
cores, the main thread launching the encoder step preempts one of them, and
every parallel region of the front end then waits for the straggler. On few
cores that straggler is most of the front end's slowdown under overlap; on
many, one thread fewer changes little, and the slowdown is the two threads'
Python (the GIL), which a front end in its own process avoids
(``frontend_process=True``, timed beside the thread). Figures: docs/defaults.md.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from audiomask.asr.driver import RunStats
from audiomask.bench.models import BenchModel
from audiomask.bench.signals import shared_noise
from audiomask.bench.timing import MS_PER_S, Budget, log, percentiles
from audiomask.constants import FRAME_MS

__all__ = ["WITHIN", "drive", "pipeline_runs", "pipeline_section", "pipeline_threads"]

WITHIN = 0.10  # the target: overlapped wall within 10 % of max(T_cpu, T_gpu)
CALIBRATION_CYCLES = 6
# A cycle's larger stage (front end or encoder) takes at least this long at the calibrated B: a cycle's fixed
# costs (thread hand-offs, the planner's and the driver's Python) are then a few per cent of it, so the
# overlap measured is the stages', not the driver's overhead. Figures: docs/defaults.md.
MIN_CYCLE_S = 0.02


def pipeline_threads(cores: int | None = None) -> int:
    """Torch intra-op threads for an overlapped driver on ``cores`` cores (default: this machine's): one core fewer.

    >>> pipeline_threads(16), pipeline_threads(1)
    (15, 1)
    """
    cores = cores or os.cpu_count() or 1
    return max(1, cores - 1)


def drive(
    model: BenchModel,
    batch: int,
    cycles: int,
    chunk_size: int,
    left_chunk: int,
    *,
    overlap: bool,
    frontend_process: bool = False,
) -> RunStats:
    """``batch`` streams of ``cycles`` chunks each through a fresh driver, after a warm-up; the timed run's stats.

    ``frontend_process``: the overlapped driver computes features in a process of its own (started before
    the warm-up, so its start-up is not timed).

    The warm-up runs every ring phase of the key/value cache once (each a CUDA
    graph of its own, captured on first use), so no timed cycle pays a capture.
    """
    driver = model.driver(batch, chunk_size, left_chunk, overlap=overlap, frontend_process=frontend_process)
    try:
        source, starts = shared_noise(batch, (left_chunk + 2 + cycles) * driver.block_samples)
        warmup = (left_chunk + 2) * driver.block_samples
        driver.run([source[start : start + warmup] for start in starts])
        driver.stats = RunStats()
        length = cycles * driver.block_samples
        driver.run([source[start + warmup : start + warmup + length] for start in starts])
        return driver.stats
    finally:
        driver.close()


def _median_run(runs: list[RunStats]) -> RunStats:
    return sorted(runs, key=lambda stats: stats.wall_s)[len(runs) // 2]


def _spread(runs: list[RunStats]) -> float:
    """``(max - min) / median`` of the runs' wall times: 0 for a single run."""
    walls = [run.wall_s for run in runs]
    return (max(walls) - min(walls)) / _median_run(runs).wall_s


def pipeline_section(
    model: BenchModel,
    chunk_size: int,
    left_chunk: int,
    cycles: int,
    repeats: int,
    max_batch: int,
    budget: Budget,
    threads: int,
) -> dict:
    """Calibrate ``B``, then serial versus overlapped runs of ``cycles`` cycles; JSON-ready.

    Runs on ``threads`` torch intra-op threads (see the module docstring), recorded as ``torch_threads``.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runs = pipeline_runs(model, chunk_size, left_chunk, cycles, repeats, max_batch, budget)
    finally:
        torch.set_num_threads(previous)
    return {"torch_threads": threads, **runs}


def pipeline_runs(
    model: BenchModel, chunk_size: int, left_chunk: int, cycles: int, repeats: int, max_batch: int, budget: Budget
) -> dict:
    """:func:`pipeline_section` on torch's current thread count; JSON-ready.

    An untimed warm-up, the calibration of ``B`` (doubling up to ``max_batch``), then ``repeats`` runs
    (fewer where ``budget`` is short) of each mode, interleaved; the figures of each mode's median run.
    """
    calibration: list[dict] = []
    warmup = left_chunk + 2  # cycles each drive() runs before its timed ones
    # One final run of each mode costs this many calibration runs of the same B (cycles scale the time,
    # warm-up included). The calibration stops where even a single final run of each mode would no longer
    # fit: a balanced B with fewer repeats tells more than an unbalanced one with all of them.
    final_runs = 3 * (warmup + cycles) / (warmup + CALIBRATION_CYCLES)
    # The process's first drive pays one-time costs (CUDA graph captures, allocator and ring growth): run
    # untimed, so that neither B = 1's figures nor the budget rule see them (timed, they can stop the
    # calibration at B = 1: docs/defaults.md).
    drive(model, 1, CALIBRATION_CYCLES, chunk_size, left_chunk, overlap=False)
    batch = 1
    while True:
        began = time.perf_counter()
        stats = drive(model, batch, CALIBRATION_CYCLES, chunk_size, left_chunk, overlap=False)
        spent = time.perf_counter() - began
        calibration.append({"batch": batch, "cpu_s": stats.cpu_s, "gpu_s": stats.gpu_s, "seconds": spent})
        log(f"  pipeline calibration B={batch}: cpu {stats.cpu_s:.3f} s, gpu {stats.gpu_s:.3f} s")
        # Doubling B about doubles the cost of a run: stop while the next B and its final runs still fit.
        loaded = max(stats.cpu_s, stats.gpu_s) >= MIN_CYCLE_S * CALIBRATION_CYCLES
        if (stats.cpu_s >= stats.gpu_s and loaded) or 2 * batch > max_batch:
            break
        if budget.left() < 2 * spent * (1 + final_runs):
            break
        batch *= 2
    # The most balanced B among those loaded enough (or the largest tried, where none is).
    floor = MIN_CYCLE_S * CALIBRATION_CYCLES
    loaded_rows = [row for row in calibration if max(row["cpu_s"], row["gpu_s"]) >= floor] or calibration[-1:]
    best = min(loaded_rows, key=lambda row: abs(np.log(max(row["cpu_s"], 1e-9) / max(row["gpu_s"], 1e-9))))
    batch = best["batch"]
    # As many repeats as the budget affords (at least one of each mode).
    affordable = int(budget.left() / (best["seconds"] * final_runs)) if best["seconds"] > 0 else repeats
    repeats = max(1, min(repeats, affordable))
    serial_runs, pipelined_runs, process_runs = [], [], []
    for _ in range(repeats):
        serial_runs.append(drive(model, batch, cycles, chunk_size, left_chunk, overlap=False))
        pipelined_runs.append(drive(model, batch, cycles, chunk_size, left_chunk, overlap=True))
        process_runs.append(drive(model, batch, cycles, chunk_size, left_chunk, overlap=True, frontend_process=True))
    serial, pipelined, in_process = _median_run(serial_runs), _median_run(pipelined_runs), _median_run(process_runs)
    modes = {"serial": serial_runs, "pipelined": pipelined_runs, "process": process_runs}
    serial_max = max(serial.cpu_s, serial.gpu_s)
    sum_of_max = sum(max(c.cpu_s, c.encode_s) for c in pipelined.cycles)
    max_of_sums = max(pipelined.cpu_s, pipelined.gpu_s)
    process_max = max(in_process.cpu_s, in_process.gpu_s)
    enqueue = percentiles([c.enqueue_s * MS_PER_S for c in pipelined.cycles])
    return {
        "model": model.name,
        "batch": batch,
        "cycles": len(pipelined.cycles),
        "chunk_ms": chunk_size * model.asr.encoder.config.time_reduction * FRAME_MS,
        "left_chunk": left_chunk,
        "repeats": repeats,
        "cpu_s": pipelined.cpu_s,
        "gpu_s": pipelined.gpu_s,
        "enqueue_s": sum(c.enqueue_s for c in pipelined.cycles),
        "host_ms_per_chunk_p50": enqueue["p50"],
        "host_ms_per_chunk_p99": enqueue["p99"],
        "serial_cpu_s": serial.cpu_s,
        "serial_gpu_s": serial.gpu_s,
        "serial_wall_s": serial.wall_s,
        "pipelined_wall_s": pipelined.wall_s,
        "serial_wall_s_runs": [run.wall_s for run in serial_runs],
        "pipelined_wall_s_runs": [run.wall_s for run in pipelined_runs],
        "overlap": pipelined.overlap(),
        "serial_overlap": serial.overlap(),
        "sum_of_max_s": sum_of_max,
        "max_of_sums_s": max_of_sums,
        "pipelined_over_sum_of_max": pipelined.wall_s / sum_of_max,
        "pipelined_over_max_of_sums": pipelined.wall_s / max_of_sums,
        "within_10pct_of_max_cpu_gpu": pipelined.wall_s <= (1 + WITHIN) * max_of_sums,
        "speedup": serial.wall_s / pipelined.wall_s,
        "pipelined_over_serial_max": pipelined.wall_s / serial_max,
        # The same overlapped driver with its front end in a process of its own (frontend_process=True).
        "process_cpu_s": in_process.cpu_s,
        "process_gpu_s": in_process.gpu_s,
        "process_wall_s": in_process.wall_s,
        "process_wall_s_runs": [run.wall_s for run in process_runs],
        "process_overlap": in_process.overlap(),
        "process_over_max_of_sums": in_process.wall_s / process_max,
        "process_over_serial_max": in_process.wall_s / serial_max,
        "process_within_10pct_of_max_cpu_gpu": in_process.wall_s <= (1 + WITHIN) * process_max,
        "process_speedup": serial.wall_s / in_process.wall_s,
        **{f"{mode}_wall_s_spread": _spread(runs) for mode, runs in modes.items()},
        "min_cycle_ms": MIN_CYCLE_S * MS_PER_S,
        "calibration": calibration,
    }
