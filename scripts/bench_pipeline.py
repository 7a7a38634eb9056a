#!/usr/bin/env python3
"""The streaming driver: serial versus pipelined wall time, and the chunk step eager versus CUDA graph.

Two measurements, one JSON:

- ``pipeline``: :func:`audiomask.bench.overlap.pipeline_section` (the latency
  benchmark's pipeline section) for the full-size Phi-4MM encoder (random
  weights, bf16 on CUDA) behind the real front end: ``B`` calibrated so that
  the front end's and the encoder's time per cycle are comparable, then serial
  versus pipelined runs; ``cpu_s``, ``gpu_s``, ``serial_wall_s``,
  ``pipelined_wall_s`` and ``overlap`` are also copied to the top level. With
  ``--more-batches``, the same at other batch sizes (CPU and GPU no longer
  balanced), and ``overlap_of_serial_times``: the overlap formula with the
  serial run's times (the pipelined run's own ``cpu_s`` is larger: its two
  threads share cores and the GIL).
- ``step``: one chunk step of the full-size encoder (``B`` = 1 and 16, 1.28 s
  chunks) through :meth:`Phi4MMSlots.step`, eager and as CUDA graphs:
  host time of the call, GPU time (events), and latency from the call to the
  output being complete on the device (p50/p99).

Usage (the H200): python3 scripts/bench_pipeline.py --out bench/results/pipeline_h200.json
Smoke test on a CPU: python3 scripts/bench_pipeline.py --quick --out /tmp/pipeline.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.models import build_model
from audiomask.bench.overlap import drive, pipeline_section, pipeline_threads
from audiomask.bench.timing import MS_PER_S, Budget, percentiles
from audiomask.models import Phi4MMEncoder
from audiomask.streaming import Phi4MMSlots

CHUNK_TOKENS = 16  # 16 tokens x 80 ms = 1.28 s chunks
LEFT_CHUNKS = 2
CYCLES = 60
REPEATS = 3  # serial and pipelined runs each, interleaved; the median is kept
MAX_BATCH = 1024
STEP_BATCHES = (1, 16)
STEP_REPEATS = 200
STEP_WARMUP = 10  # the first steps capture the graphs and warm the allocator


def more_batches_rows(model, batches: list[int], cycles: int) -> list[dict]:
    """Serial versus pipelined at fixed batch sizes, one run each."""
    rows = []
    for batch in batches:
        serial = drive(model, batch, cycles, CHUNK_TOKENS, LEFT_CHUNKS, overlap=False)
        pipelined = drive(model, batch, cycles, CHUNK_TOKENS, LEFT_CHUNKS, overlap=True)
        rows.append(
            {
                "batch": batch,
                "cpu_s": pipelined.cpu_s,
                "gpu_s": pipelined.gpu_s,
                "serial_cpu_s": serial.cpu_s,
                "serial_gpu_s": serial.gpu_s,
                "serial_wall_s": serial.wall_s,
                "pipelined_wall_s": pipelined.wall_s,
                "overlap": pipelined.overlap(),
                "overlap_of_serial_times": (serial.cpu_s + serial.gpu_s - pipelined.wall_s)
                / min(serial.cpu_s, serial.gpu_s),
                "pipelined_over_max_of_sums": pipelined.wall_s / max(pipelined.cpu_s, pipelined.gpu_s),
                "speedup": serial.wall_s / pipelined.wall_s,
            }
        )
        print({key: round(value, 4) if isinstance(value, float) else value for key, value in rows[-1].items()})
    return rows


def step_section(encoder: Phi4MMEncoder, repeats: int) -> list[dict]:
    """Host time, GPU time and call-to-done latency of one chunk step, eager and graph."""
    rows = []
    for batch in STEP_BATCHES:
        for cuda_graph in (False, True):
            slots = Phi4MMSlots(encoder, batch, CHUNK_TOKENS, LEFT_CHUNKS, cuda_graph=cuda_graph)
            frames = CHUNK_TOKENS * encoder.config.time_reduction
            chunk = np.random.default_rng(0).standard_normal((batch, frames, encoder.config.input_size))
            chunk = chunk.astype(np.float32)
            valid = np.full(batch, frames)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            host, gpu, latency = [], [], []
            for i in range(repeats + STEP_WARMUP):
                torch.cuda.synchronize()
                began = time.perf_counter()
                start.record()
                slots.step(chunk, valid)
                end.record()
                queued = time.perf_counter()
                end.synchronize()
                finished = time.perf_counter()
                if i >= STEP_WARMUP:
                    host.append((queued - began) * MS_PER_S)
                    gpu.append(start.elapsed_time(end))
                    latency.append((finished - began) * MS_PER_S)
            row = {"batch": batch, "cuda_graph": cuda_graph, "dtype": str(slots.dtype)}
            for name, values in (("host_ms", host), ("gpu_ms", gpu), ("latency_ms", latency)):
                row.update({f"{name}_{key}": value for key, value in percentiles(values).items()})
            rows.append(row)
            print(
                f"step B={batch} {'graph' if cuda_graph else 'eager'}: host p50 {row['host_ms_p50']:.2f} ms, "
                f"gpu p50 {row['gpu_ms_p50']:.2f} ms, latency p50 {row['latency_ms_p50']:.2f} / "
                f"p99 {row['latency_ms_p99']:.2f} ms",
                flush=True,
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``argv`` without the program name; default ``sys.argv[1:]``); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cycles", type=int, default=CYCLES, help="cycles of each serial and pipelined run")
    parser.add_argument("--seconds", type=float, default=240.0, help="time budget of the pipeline section")
    parser.add_argument("--more-batches", type=int, nargs="*", default=[64], help="serial vs pipelined at these too")
    parser.add_argument("--quick", action="store_true", help="the benchmark's quick models, a few cycles (smoke test)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model("phi4mm_full", device, quick=args.quick)
    cycles = 4 if args.quick else args.cycles
    started = time.perf_counter()
    result = {**capture_environment(sys.argv), "model": model.info()}
    pipeline = pipeline_section(
        model,
        CHUNK_TOKENS,
        LEFT_CHUNKS,
        cycles,
        1 if args.quick else REPEATS,
        MAX_BATCH,
        Budget(args.seconds),
        pipeline_threads(),
    )
    result["pipeline"] = pipeline
    for key in ("cpu_s", "gpu_s", "serial_wall_s", "pipelined_wall_s", "overlap"):
        result[key] = pipeline[key]  # the headline figures, also at the top level
    result["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print({key: round(value, 4) if isinstance(value, float) else value for key, value in pipeline.items()})
    result["pipeline_more_batches"] = more_batches_rows(
        model, [b for b in args.more_batches if b != pipeline["batch"]], cycles
    )
    if device.type == "cuda":
        result["step"] = step_section(model.asr.encoder, STEP_REPEATS)
    result["seconds"] = time.perf_counter() - started
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
