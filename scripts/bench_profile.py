"""Where an encoder step's GPU time goes: its kernels by family (``torch.profiler``), for the capacity rows.

Profiles the throughput benchmark's ``encoder_step`` row (the same slots,
chunking and start groups as ``scripts/bench_latency.py``) at a given count of
streams: device milliseconds per step, kernels per step, the share of each
kernel family (GEMM, convolution, attention, norm, layout conversion, copy,
reduction, elementwise) and the largest kernels (``audiomask.bench.profile``).

    python scripts/bench_profile.py --model qwen3_asr_0.6b --streams 8192 --out bench/results/profile_qwen3_h200.json
    python scripts/bench_profile.py --model phi4mm_full --streams 4096 --out bench/results/profile_phi4mm_h200.json
    python scripts/bench_profile.py --model shipped --streams 64 --steps 20 --device cpu --out bench/results/profile_shipped_cpu.json

``--cuda-graph`` replays Phi-4MM's steps from CUDA graphs, as the benchmark does
(the profiler then sees the graphs' kernels, where CUPTI reports them);
``--quick``: tiny stand-ins, a smoke run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.latency import streaming_chunking
from audiomask.bench.models import MODEL_NAMES, build_model
from audiomask.bench.profile import profile_step


def main(argv: Sequence[str] | None = None) -> int:
    """Profile the rows asked for (``argv`` without the program name); the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODEL_NAMES, required=True)
    parser.add_argument("--streams", type=int, nargs="+", required=True, help="streams per step, one report each")
    parser.add_argument("--steps", type=int, default=8, help="profiled steps (Qwen3-ASR: a multiple of 8)")
    parser.add_argument("--cuda-graph", action="store_true", help="Phi-4MM: replay the steps from CUDA graphs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="tiny stand-ins: a smoke run, not a measurement")
    parser.add_argument("--out", type=Path, required=True, help="the JSON report")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args.model, torch.device(args.device), quick=args.quick)
    chunking = dict(zip(("chunk_size", "left_chunk"), streaming_chunking(model))) if model.is_phi4mm else {}
    report: dict = {**capture_environment(sys.argv), "model": model.info(), "chunking": chunking, "rows": []}
    for streams in args.streams:
        row = profile_step(model, streams, steps=args.steps, cuda_graph=args.cuda_graph, **chunking)
        report["rows"].append(row)
        shares = ", ".join(f"{name} {entry['share']:.0%}" for name, entry in row["families"].items())
        print(f"{streams} streams: {row['ms_per_step']:.1f} ms a step, {row['kernels_per_step']:.0f} kernels: {shares}")
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
