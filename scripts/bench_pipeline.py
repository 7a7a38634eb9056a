#!/usr/bin/env python3
"""The streaming driver: serial versus pipelined wall time, and the chunk step eager versus CUDA graph.

Two measurements, one JSON (issue 5, acceptance 4 and build point 4):

- ``pipeline``: the real front end (:class:`~audiomask.features.Phi4MMFrontend`)
  and the real encoder (the full-size Phi-4MM config, random weights, bf16 on
  CUDA) behind :class:`~audiomask.stream.StreamingDriver`, for a batch of
  ``B`` streams of random speech-like noise. ``B`` is picked by a short serial
  calibration so that the front end's time per cycle (``cpu_s``, worker
  thread) and the encoder's (``gpu_s``, CUDA events) are comparable. Then the
  same workload runs serial (features, encode, wait for the results, cycle
  after cycle) and pipelined (the next cycle's features on the worker thread
  while the GPU encodes). Reported: ``cpu_s``, ``gpu_s``,
  ``serial_wall_s``, ``pipelined_wall_s``, ``overlap = (T_cpu + T_gpu -
  T_wall) / min(T_cpu, T_gpu)`` of the pipelined run, and how far its wall
  time is from ``sum over cycles of max(cpu, gpu)`` (the bound of a perfect
  two-stage pipeline) and from ``max(T_cpu, T_gpu)``.
- ``step``: one chunk step of the full-size encoder (``B`` = 1 and 16,
  1.28 s chunks) through :meth:`Phi4MMStream.step_frames`, eager and as
  CUDA graphs: host time of the call, GPU time (events), and latency from the
  call to the output being complete on the device (p50/p99).

Usage (the H200): python3 scripts/bench_pipeline.py --out bench/results/pipeline_h200.json
Smoke test on a CPU: python3 scripts/bench_pipeline.py --tiny --cycles 4 --out /tmp/pipeline.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchenv import capture_environment, write_result  # noqa: E402

from audiomask.decode import CTCHead  # noqa: E402
from audiomask.encoders import Phi4MMAudioConfig, Phi4MMEncoder  # noqa: E402
from audiomask.stream import RunStats, StreamingDriver  # noqa: E402

SAMPLE_RATE = 16_000  # Hz
CHUNK_TOKENS = 16  # 16 tokens x 80 ms = 1.28 s chunks
LEFT_CHUNKS = 2
VOCAB = 32  # characters of a CTC head
CALIBRATION_BATCHES = (16, 32, 64, 128, 256, 512)
CALIBRATION_CYCLES = 6
STEP_BATCHES = (1, 16)
STEP_REPEATS = 200
WITHIN = 0.10  # acceptance: pipelined wall within 10 % of the max(cpu, gpu) bound
TINY = Phi4MMAudioConfig(
    hidden_size=16,
    intermediate_size=16,
    num_blocks=1,
    num_attention_heads=2,
    ext_pw_out_channel=16,
    depthwise_separable_out_channel=16,
    nemo_conv_channels=4,
)


def build(config: Phi4MMAudioConfig, device: torch.device) -> tuple[Phi4MMEncoder, CTCHead]:
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    encoder = Phi4MMEncoder(config).eval().to(device, dtype)
    head = CTCHead(config.hidden_size, VOCAB).eval().to(device, dtype)
    return encoder, head


def signals(count: int, cycles: int, samples_per_cycle: int, seed: int = 0) -> list[np.ndarray]:
    """Noise long enough for ``cycles`` cycles of every stream (the front end's cost does not depend on content)."""
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(cycles * samples_per_cycle)).astype(np.float32) for _ in range(count)]


def drive(encoder, head, batch: int, cycles: int, *, overlap: bool) -> RunStats:
    driver = StreamingDriver(
        encoder, head, batch_size=batch, chunk_size=CHUNK_TOKENS, left_chunk=LEFT_CHUNKS, overlap=overlap
    )
    driver.run(signals(batch, 2, driver.block_samples))  # warm-up: graph capture, allocator, worker thread
    driver.stats = RunStats()
    driver.run(signals(batch, cycles, driver.block_samples, seed=1))
    driver.close()
    if encoder.parameters().__next__().device.type == "cuda":
        torch.cuda.synchronize()
    return driver.stats


def calibrate(encoder, head, batches: tuple[int, ...]) -> tuple[int, list[dict]]:
    """The batch whose serial front-end and encoder times per cycle are closest (by ratio), and every row."""
    calibration = []
    for batch in batches:
        stats = drive(encoder, head, batch, CALIBRATION_CYCLES, overlap=False)
        calibration.append({"batch": batch, "cpu_s": stats.cpu_s, "gpu_s": stats.gpu_s})
        print(f"calibration B={batch}: cpu {stats.cpu_s:.3f} s, gpu {stats.gpu_s:.3f} s", flush=True)
    best = min(calibration, key=lambda row: abs(np.log(row["cpu_s"] / max(row["gpu_s"], 1e-9))))
    return best["batch"], calibration


def overlap_section(encoder, head, batch: int, cycles: int) -> dict:
    """Serial and pipelined runs of ``batch`` streams; the pipelined run's figures, and the serial run's."""
    serial = drive(encoder, head, batch, cycles, overlap=False)
    pipelined = drive(encoder, head, batch, cycles, overlap=True)
    sum_max = sum(max(c.cpu_s, c.encode_s) for c in pipelined.cycles)
    bound = max(pipelined.cpu_s, pipelined.gpu_s)
    row = {
        "batch": batch,
        "cycles": len(pipelined.cycles),
        "chunk_ms": CHUNK_TOKENS * 80,
        "cpu_s": pipelined.cpu_s,
        "gpu_s": pipelined.gpu_s,
        "enqueue_s": sum(c.enqueue_s for c in pipelined.cycles),
        "serial_cpu_s": serial.cpu_s,
        "serial_gpu_s": serial.gpu_s,
        "serial_wall_s": serial.wall_s,
        "pipelined_wall_s": pipelined.wall_s,
        "overlap": pipelined.overlap(),
        "serial_overlap": serial.overlap(),
        "sum_of_max_s": sum_max,
        "max_of_sums_s": bound,
        "pipelined_over_sum_of_max": pipelined.wall_s / sum_max,
        "pipelined_over_max_of_sums": pipelined.wall_s / bound,
        "speedup": serial.wall_s / pipelined.wall_s,
        # The same formula with the serial run's times: how much of the work measured alone the
        # pipeline hides (the pipelined run's own cpu_s is larger: its threads share cores and the GIL).
        "overlap_of_serial_times": (serial.cpu_s + serial.gpu_s - pipelined.wall_s) / min(serial.cpu_s, serial.gpu_s),
    }
    row["verdicts"] = {
        "overlap_at_least_0.8": row["overlap"] >= 0.8,
        "within_10pct_of_max_cpu_gpu": row["pipelined_over_max_of_sums"] <= 1 + WITHIN,
    }
    return row


def percentiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values)
    return {"p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99))}


def step_section(encoder: Phi4MMEncoder, repeats: int) -> list[dict]:
    """Host time, GPU time and call-to-done latency of one chunk step, eager and graph."""
    device = next(encoder.parameters()).device
    rows = []
    for batch in STEP_BATCHES:
        for cuda_graph in (False, True):
            stream = encoder.stream(batch, CHUNK_TOKENS, LEFT_CHUNKS, cuda_graph=cuda_graph)
            frames = CHUNK_TOKENS * encoder.config.time_reduction
            chunk = np.random.default_rng(0).standard_normal((batch, frames, encoder.config.input_size))
            chunk = chunk.astype(np.float32)
            valid = np.full(batch, frames)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            host, gpu, latency = [], [], []
            for i in range(repeats + 10):
                torch.cuda.synchronize()
                began = time.perf_counter()
                start.record()
                stream.step_frames(chunk, valid)
                end.record()
                queued = time.perf_counter()
                end.synchronize()
                finished = time.perf_counter()
                if i >= 10:  # the first steps capture the graphs and warm the allocator
                    host.append((queued - began) * 1e3)
                    gpu.append(start.elapsed_time(end))
                    latency.append((finished - began) * 1e3)
            row = {"batch": batch, "cuda_graph": cuda_graph, "dtype": str(stream.dtype)}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cycles", type=int, default=60, help="cycles of the serial and the pipelined run")
    parser.add_argument("--batch", type=int, help="skip the calibration: this many streams")
    parser.add_argument("--more-batches", type=int, nargs="*", default=[64], help="serial vs pipelined at these too")
    parser.add_argument("--tiny", action="store_true", help="a tiny encoder (smoke test)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = TINY if args.tiny else Phi4MMAudioConfig()
    encoder, head = build(config, device)
    started = time.perf_counter()
    result = {
        **capture_environment(sys.argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "encoder": dataclasses.asdict(config),
        "encoder_dtype": str(next(encoder.parameters()).dtype),
        "torch_threads": torch.get_num_threads(),
    }
    if args.batch:
        batch, result["calibration"] = args.batch, []
    else:
        batch, result["calibration"] = calibrate(
            encoder, head, CALIBRATION_BATCHES[:2] if args.tiny else CALIBRATION_BATCHES
        )
    result["pipeline"] = overlap_section(encoder, head, batch, args.cycles)
    result["pipeline_more_batches"] = [
        overlap_section(encoder, head, more, args.cycles) for more in args.more_batches if more != batch
    ]
    for key in ("cpu_s", "gpu_s", "serial_wall_s", "pipelined_wall_s", "overlap"):
        result[key] = result["pipeline"][key]  # the acceptance's fields at the top level
    for row in (result["pipeline"], *result["pipeline_more_batches"]):
        print({key: round(value, 4) if isinstance(value, float) else value for key, value in row.items()})
    if device.type == "cuda":
        result["step"] = step_section(encoder, STEP_REPEATS)
    result["seconds"] = time.perf_counter() - started
    write_result(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
