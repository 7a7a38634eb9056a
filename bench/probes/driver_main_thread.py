"""Where does the main thread of an overlapped driver spend a cycle when the front end runs in a process?

The latency benchmark's pipeline section (bench/results/latency_h200.json, c3774f8) had the
process-mode driver at 1.15x max(T_cpu, T_gpu) with the shipped model, B = 16, 320 ms chunks,
~1.3 ms a cycle on each side: the main thread's own work between encoder steps (planning, the
process's hand-over, collecting and decoding the results) is in neither T_cpu nor T_gpu. This
probe runs that workload (``--cycles`` timed cycles after the same warm-up as the benchmark's
``drive``) under cProfile and prints the main thread's top functions, then times it again
without the profiler for wall, T_cpu, T_gpu and their ratio.

Usage (H200): python3 bench/probes/driver_main_thread.py --cycles 96 --out bench/probes/driver_main_thread_h200.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.latency import _streaming_chunking
from audiomask.bench.models import build_model
from audiomask.bench.overlap import drive, pipeline_threads

TOP = 30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cycles", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--model", default="shipped")
    args = parser.parse_args()
    torch.set_num_threads(pipeline_threads())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args.model, device)
    chunk_size, left_chunk = _streaming_chunking(model)

    def run() -> dict:
        stats = drive(
            model,
            args.batch,
            args.cycles,
            chunk_size,
            left_chunk,
            overlap=True,
            frontend_process=True,
        )
        return {
            "wall_s": stats.wall_s,
            "cpu_s": stats.cpu_s,
            "gpu_s": stats.gpu_s,
            "enqueue_s": sum(c.enqueue_s for c in stats.cycles),
            "wait_s": sum(c.wait_s for c in stats.cycles),
            "wall_over_max": stats.wall_s / max(stats.cpu_s, stats.gpu_s),
        }

    timed = [run() for _ in range(3)]
    for row in timed:
        print({key: round(value, 5) for key, value in row.items()}, flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    profiled = run()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(TOP)
    print(text.getvalue(), flush=True)
    write_result(
        args.out,
        {
            "environment": capture_environment(sys.argv),
            "model": args.model,
            "batch": args.batch,
            "cycles": args.cycles,
            "timed": timed,
            "profiled": profiled,
            "profile_top": text.getvalue(),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
