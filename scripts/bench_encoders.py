#!/usr/bin/env python3
"""Per-chunk time of the full-size Phi-4MM encoder streaming chunk by chunk (random weights, bf16).

The encoder (24 blocks, 1024 dims, 16 heads, 1536 feed-forward units) streams
``B`` utterances at once; every ``push`` carries exactly one chunk of
``chunk_size * 8`` feature frames per stream, so it runs one cache-aware chunk
step. Each chunk is timed three ways:

- ``host_ms``: the host time of ``push`` (building the masks, staging and
  submitting the copies, launching every kernel: eager PyTorch, no CUDA graph);
- ``gpu_ms``: CUDA events around ``push`` on an idle device: what the GPU
  takes from the start of the step to its end, idle gaps between launches
  included (single-stream latency is launch-bound);
- ``gpu_busy_ms``: the same events with ``--gate-ms`` of GPU work queued
  ahead (``torch.cuda._sleep``), so that the whole step is enqueued before the
  GPU reaches the start event: the GPU's execution time alone.
  ``gate_held`` says the start event had not run when ``push`` returned (the
  step was fully queued behind the gate, and ``push`` never waited for the GPU).

Every chunk's figures are in the report, with p50/p95/p99 per batch size,
and ``audio_s_per_s``: seconds of audio encoded per second of ``gpu_busy_ms``.

Why a push waited, when ``gate_held`` is below 1 (CUDA only, one extra push each):

- ``sync_calls``: ``"none"`` if a push runs under
  ``torch.cuda.set_sync_debug_mode("error")`` without raising, else the error
  (a synchronising call: ``.item()``, a D2H copy, ``nonzero``, ...).
- ``kernels_per_push``: CUDA kernels and memcpy/memset a push launches
  (torch.profiler). The host blocks in a launch once ~1000 launches are
  pending (the device's launch queue), so an eager step of more than that many
  kernels queued behind a gate waits for the GPU without any synchronising call.
- ``top_kernels``: the largest GPU-time entries of that push (profiler table).

Usage (the H200): python3 scripts/bench_encoders.py --out bench/results/encoders_h200.json
Smoke test on a CPU: python3 scripts/bench_encoders.py --tiny --chunks 3 --batch-sizes 2
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.harness import QueueFiller
from audiomask.bench.models import TINY_PHI4MM
from audiomask.bench.timing import MS_PER_S, percentiles
from audiomask.constants import FRAME_MS
from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder
from audiomask.streaming import Phi4MMSlots


def run(
    encoder: Phi4MMEncoder,
    batch_size: int,
    args: argparse.Namespace,
    filler: QueueFiller | None,
) -> dict:
    """Stream ``args.warmup + args.chunks`` chunks twice (idle, then gated); per-chunk times."""
    config = encoder.config
    slots = Phi4MMSlots(encoder, batch_size, args.chunk_size, args.left_chunk)
    chunk_frames = args.chunk_size * config.time_reduction
    features = torch.randn(batch_size, chunk_frames, config.input_size)  # host features, as a front end makes
    cuda = filler is not None
    times: dict[str, list[float]] = {"host_ms": [], "gpu_ms": [], "gpu_busy_ms": []}
    gate_held = []
    diagnostics: dict = {}
    for gated in (False, True) if cuda else (False,):
        for index in range(args.warmup + args.chunks):
            if cuda:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if gated:
                    filler.fill(args.gate_ms)
                start.record()
            began = time.perf_counter()
            outputs = slots.push(features)
            host_ms = (time.perf_counter() - began) * MS_PER_S
            if cuda:
                end.record()
                held = not start.query()
                end.synchronize()
            if outputs.shape != (batch_size, args.chunk_size, config.hidden_size):  # one chunk in, one out
                raise RuntimeError(f"push returned {tuple(outputs.shape)} for one chunk per stream")
            if index < args.warmup:
                continue
            if not gated:
                times["host_ms"].append(host_ms)
            if cuda:
                times["gpu_busy_ms" if gated else "gpu_ms"].append(start.elapsed_time(end))
                if gated:
                    gate_held.append(held)
        if gated:  # in the steady state: the caches are full, every chunk whole
            diagnostics = diagnose(slots, features)
        slots.flush()
    row: dict = {"batch_size": batch_size, "chunks": args.chunks}
    for name, samples in times.items():
        if samples:
            row[name] = percentiles(samples)
    if gate_held:
        row["gate_held"] = float(np.mean(gate_held))
        chunk_audio_s = chunk_frames * FRAME_MS / MS_PER_S
        row["audio_s_per_s"] = batch_size * chunk_audio_s / (row["gpu_busy_ms"]["p50"] / MS_PER_S)
    row.update(diagnostics)
    row["per_chunk"] = times
    return row


def diagnose(slots, features: torch.Tensor) -> dict:
    """Whether a push makes a synchronising call, and what it launches (see the module docstring)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        slots.push(features)
        sync_calls = "none"
    except RuntimeError as error:
        sync_calls = str(error).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        slots.push(features)
        torch.cuda.synchronize()
    device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=15, max_name_column_width=60)
    return {"sync_calls": sync_calls, "kernels_per_push": len(device_events), "top_kernels": table}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``argv`` without the program name; default ``sys.argv[1:]``); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 256], help="streams per step")
    parser.add_argument("--chunk-size", type=int, default=16, help="tokens per chunk (16 tokens = 1.28 s)")
    parser.add_argument("--left-chunk", type=int, default=18, help="chunks of left context (the config default)")
    parser.add_argument("--chunks", type=int, default=64, help="timed chunks per batch size")
    parser.add_argument("--warmup", type=int, default=8, help="untimed chunks first (fill the caches, warm up)")
    parser.add_argument("--gate-ms", type=float, default=200.0, help="GPU work queued ahead of gated steps (ms)")
    parser.add_argument("--tiny", action="store_true", help="a 2-block toy config: a smoke test, not a measurement")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    cuda = torch.cuda.is_available()
    config = TINY_PHI4MM if args.tiny else Phi4MMAudioConfig()
    torch.manual_seed(0)
    encoder = Phi4MMEncoder(config).eval()  # PyTorch's default initialisation: random weights
    dtype = torch.bfloat16 if cuda else torch.float32
    encoder.to("cuda" if cuda else "cpu", dtype)
    report: dict = {
        **capture_environment(sys.argv),
        "config": dataclasses.asdict(config),
        "parameters": sum(p.numel() for p in encoder.parameters()),
        "dtype": str(dtype).removeprefix("torch."),
        "chunk_size": args.chunk_size,
        "left_chunk": args.left_chunk,
        "chunk_ms": args.chunk_size * config.time_reduction * FRAME_MS,
        "gate_ms": args.gate_ms,
    }
    filler = QueueFiller("cuda") if cuda else None
    if filler is not None:
        report["gate_ms_measured"] = filler.measure(args.gate_ms)
    report["runs"] = []
    with torch.inference_mode():
        for batch_size in args.batch_sizes:
            row = run(encoder, batch_size, args, filler)
            report["runs"].append(row)
            summary = {key: value["p50"] for key, value in row.items() if isinstance(value, dict) and "p50" in value}
            extra = {key: row[key] for key in ("gate_held", "sync_calls", "kernels_per_push") if key in row}
            print(f"B={batch_size}: p50 " + ", ".join(f"{key} {value:.3f}" for key, value in summary.items()), extra)
    report["seconds"] = time.perf_counter() - began
    if args.out:
        write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
