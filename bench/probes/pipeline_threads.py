"""Why the overlapped driver is 1.10x max(T_cpu, T_gpu) on the H200: torch's thread count and batch size.

In the latency benchmark's full run (bench/results/latency_h200.json, pipeline section: the shipped
model, B = 16, 320 ms chunks), the front end took 0.038 s in the serial run and 0.073 s when it
overlapped the encoder step: the worker thread that computes features and the main thread that
launches the step slowed each other down. Two suspects: torch's intra-op pool has as many threads
as there are cores, so with the main thread also running, one pool thread is descheduled and each
parallel region waits for it; and the two threads' Python parts take turns on the GIL, which weighs
most when a cycle is a few milliseconds. This probe runs the benchmark's serial and overlapped
driver (:func:`audiomask.bench.overlap.drive`) at several torch thread counts and batch sizes and
reports, for each, the front end and encoder times of both runs, the walls, and the overlapped wall
over max(T_cpu, T_gpu) measured both on the overlapped run (the benchmark's figure) and on the
serial one (the stages' own costs).

``--switch-ms`` runs each under other thread switch intervals of the interpreter (5 ms by
default: a thread that wants the GIL may wait that long for one running Python bytecode).
``--wait block`` also runs each configuration with the driver waiting for a cycle's results on a
blocking-sync event (``torch.cuda.Event(blocking=True)``: the host thread sleeps in the driver
instead of spinning on a core): a third suspect, a spinning main thread that takes the core of
one of the pool's threads.

Usage (H200): python3 bench/probes/pipeline_threads.py --out bench/probes/pipeline_threads_h200.json
              python3 bench/probes/pipeline_threads.py --threads 15 13 --batches 32 --wait spin block --out F
              python3 bench/probes/pipeline_threads.py --threads 2 1 --batches 2 --cycles 4 --out /tmp/p.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import torch

import audiomask.stream
from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.latency import _streaming_chunking
from audiomask.bench.models import build_model
from audiomask.bench.overlap import _median_run, drive
from audiomask.transfer import to_host

CORES = os.cpu_count() or 1


def _blocking_to_host(tensor: torch.Tensor, *, out: torch.Tensor | None = None):
    """``to_host`` whose ``done`` is a blocking-sync event recorded right after the copy."""
    host, done = to_host(tensor, out=out)
    if done is not None:
        done = torch.cuda.Event(blocking=True)
        done.record()
    return host, done


@contextlib.contextmanager
def waiting(mode: str):
    """The driver waits for its results spinning (torch's default event) or sleeping (``block``)."""
    if mode == "spin":
        yield
        return
    original = audiomask.stream.to_host
    audiomask.stream.to_host = _blocking_to_host
    try:
        yield
    finally:
        audiomask.stream.to_host = original


def measure(model: object, batch: int, cycles: int, repeats: int) -> dict:
    """Serial and overlapped runs of ``batch`` streams, ``repeats`` of each interleaved; the medians' figures."""
    chunk_size, left_chunk = _streaming_chunking(model)  # type: ignore[arg-type]
    serial_runs, pipelined_runs = [], []
    for _ in range(repeats):
        serial_runs.append(drive(model, batch, cycles, chunk_size, left_chunk, overlap=False))  # type: ignore[arg-type]
        pipelined_runs.append(drive(model, batch, cycles, chunk_size, left_chunk, overlap=True))  # type: ignore[arg-type]
    serial, pipelined = _median_run(serial_runs), _median_run(pipelined_runs)
    return {
        "batch": batch,
        "cycles": cycles,
        "serial_cpu_s": serial.cpu_s,
        "serial_gpu_s": serial.gpu_s,
        "serial_wall_s": serial.wall_s,
        "pipelined_cpu_s": pipelined.cpu_s,
        "pipelined_gpu_s": pipelined.gpu_s,
        "pipelined_wall_s": pipelined.wall_s,
        "wall_over_own_max": pipelined.wall_s / max(pipelined.cpu_s, pipelined.gpu_s),
        "wall_over_serial_max": pipelined.wall_s / max(serial.cpu_s, serial.gpu_s),
        "frontend_slowdown": pipelined.cpu_s / serial.cpu_s,
        "speedup": serial.wall_s / pipelined.wall_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=sorted({CORES, max(1, CORES - 1), max(1, CORES // 2), 4}, reverse=True),
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--cycles", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="shipped", choices=["shipped", "phi4mm_full"])
    parser.add_argument("--wait", nargs="+", default=["spin"], choices=["spin", "block"])
    parser.add_argument(
        "--switch-ms",
        type=float,
        nargs="+",
        default=[sys.getswitchinterval() * 1e3],
        help="Python's thread switch interval(s) to run under, ms (default: this interpreter's, 5 ms)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    model = build_model(args.model, device)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batches:
            for mode in args.wait:
                for switch_ms in args.switch_ms:
                    sys.setswitchinterval(switch_ms / 1e3)
                    with waiting(mode):
                        row = {
                            "torch_threads": threads,
                            "wait": mode,
                            "switch_ms": switch_ms,
                            **measure(model, batch, args.cycles, args.repeats),
                        }
                    rows.append(row)
                    print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    report = {"environment": capture_environment(sys.argv), "model": args.model, "cores": CORES, "runs": rows}
    write_result(Path(args.out), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
