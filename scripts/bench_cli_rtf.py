#!/usr/bin/env python3
"""The CLI's real-time factor for one long file (the target: RTF <= 0.1 on a 2-core CPU).

Two measurements, one JSON:

- ``cli``: ``python -m audiomask transcribe FILE --device cpu --json`` as a
  user runs it (``--threads`` at its default, and at each of ``--threads``
  given here for comparison), ``--runs`` times each, interleaved; each run's
  ``processing_s`` and ``rtf`` (from its JSON line: reading, front end,
  encoder, decoding of the file, streamed chunk by chunk) and the process's
  whole wall time (with Python start-up, imports and model loading, which the
  RTF leaves out).
- ``breakdown``: where the time goes, in-process with the CLI's own feeding
  (``iter_blocks`` of one chunk, ``accept`` after each, the CLI's default
  torch threads): reading and
  resampling alone; the driver pipelined (as the CLI runs it) and serial
  (``overlap=False``), each with the front end's time (``cpu_s``, worker
  thread), the encoder step's with head and argmax (``encode_s``) and the
  rest of the wall time (reading, planning, greedy decoding, Python).

The audio is the samples/ utterances (real speech, resampled to 16 kHz)
repeated to ``--seconds``. The model is ``--model`` if given, else the
shipped one, else (until it ships) random weights of its architecture
(:data:`audiomask.asr.checkpoint.SHIPPED_ENCODER_CONFIG`), saved to a temporary file.

Usage: python scripts/bench_cli_rtf.py --out bench/results/cli_rtf_cpu_2core.json
       python scripts/bench_cli_rtf.py --model path/to/model.safetensors --out ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from audiomask.asr.checkpoint import DEFAULT_MODEL_PATH, load_model, model_info, save_model
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.audio import iter_blocks, load
from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.models import build_model
from audiomask.bench.timing import MS_PER_S
from audiomask.cli import TRANSCRIBE_THREADS
from audiomask.constants import SAMPLE_RATE

ROOT = Path(__file__).resolve().parents[1]  # the checkout: samples/ and bench/results/
RTF_TARGET = 0.1  # processing time over audio time, on a 2-core CPU
GAP_S = 0.3  # silence between the repeated utterances
CLI_TIMEOUT_S = 600


def speech(seconds: float) -> np.ndarray:
    """``seconds`` of the samples/ utterances, one after another with short gaps, 16 kHz float32."""
    gap = np.zeros(round(GAP_S * SAMPLE_RATE), np.float32)
    utterances = [piece for path in sorted((ROOT / "samples").glob("*.wav")) for piece in (load(path)[0], gap)]
    cycle = np.concatenate(utterances)
    total = round(seconds * SAMPLE_RATE)
    return np.tile(cycle, -(-total // len(cycle)))[:total]


def run_cli(audio: Path, model: Path | None, threads: int) -> dict:
    """One ``audiomask transcribe --json`` process: its result line and its whole wall time."""
    command = [sys.executable, "-m", "audiomask", "transcribe", str(audio), "--device", "cpu", "--json"]
    command += ["--threads", str(threads)]
    command += ["--model", str(model)] if model is not None else []
    started = time.perf_counter()
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        timeout=CLI_TIMEOUT_S,
    )
    wall_s = time.perf_counter() - started
    (line,) = [json.loads(line) for line in result.stdout.splitlines()]
    return {"processing_s": line["processing_s"], "rtf": line["rtf"], "process_wall_s": wall_s}


def breakdown(audio: Path, model_path: Path | None, overlap: bool) -> dict:
    """The CLI's feeding in-process: wall time of the file and the driver's per-stage sums."""
    with StreamingRecognizer(load_model(model_path), "cpu", overlap=overlap) as recognizer:
        block = recognizer.chunk_ms * SAMPLE_RATE // MS_PER_S
        started = time.perf_counter()
        stream = recognizer.open_stream()
        for samples in iter_blocks(audio, block):
            stream.accept(samples)
        stream.finish()
        wall_s = time.perf_counter() - started
        stats = recognizer.stats
    audio_s = sum(len(samples) for samples in iter_blocks(audio, block)) / SAMPLE_RATE
    return {
        "wall_s": wall_s,
        "rtf": wall_s / audio_s,
        "encode_ms_per_cycle": MS_PER_S * stats.gpu_s / stats.count,
        "frontend_s": stats.cpu_s,
        "encode_s": stats.gpu_s,
        "other_s": wall_s - stats.cpu_s - stats.gpu_s if not overlap else None,
        "overlap": stats.overlap() if overlap else None,
        "cycles": stats.count,
    }


def read_time(audio: Path, block: int) -> float:
    started = time.perf_counter()
    for _ in iter_blocks(audio, block):
        pass
    return time.perf_counter() - started


def medians(runs: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0] if runs[0][key] is not None}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a model file (default: the shipped one, else random weights)")
    parser.add_argument("--seconds", type=float, default=30.0, help="audio length (default 30 s)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement (default 3)")
    parser.add_argument(
        "--threads", type=int, nargs="*", default=[2], help="other --threads values to run the CLI with (default 2)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/cli_rtf_cpu_2core.json")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()  # the machine is shared: other work in these figures shows here
    with tempfile.TemporaryDirectory(prefix="bench-cli-rtf-") as scratch:
        audio = Path(scratch) / f"speech_{args.seconds:g}s.wav"
        sf.write(audio, speech(args.seconds), SAMPLE_RATE, subtype="PCM_16")
        model = args.model
        if model is None and DEFAULT_MODEL_PATH.is_file():
            source = "the shipped model"
        elif model is None:
            model = Path(scratch) / "random.safetensors"
            save_model(build_model("shipped", torch.device("cpu")).asr, model)
            source = "random weights of audiomask.asr.checkpoint.SHIPPED_ENCODER_CONFIG (no shipped model yet)"
        else:
            source = str(model)
        info = model_info(model)
        print(f"model: {source}, {info['parameters']:,} parameters, chunk {info['chunk_ms']} ms", flush=True)

        thread_counts = [TRANSCRIBE_THREADS, *(t for t in args.threads if t != TRANSCRIBE_THREADS)]
        cli: dict[int, list[dict]] = {threads: [] for threads in thread_counts}
        for run in range(args.runs):
            for threads in thread_counts:
                cli[threads].append(run_cli(audio, model, threads))
                print(f"cli run {run}, --threads {threads}: {cli[threads][-1]}", flush=True)
        torch.set_num_threads(TRANSCRIBE_THREADS)  # the breakdown runs as the CLI does
        block = info["chunk_ms"] * SAMPLE_RATE // MS_PER_S
        read = [read_time(audio, block) for _ in range(args.runs)]
        pipelined = [breakdown(audio, model, overlap=True) for _ in range(args.runs)]
        serial = [breakdown(audio, model, overlap=False) for _ in range(args.runs)]

    rtf = statistics.median(r["rtf"] for r in cli[TRANSCRIBE_THREADS])
    payload = {
        **capture_environment([Path(__file__).relative_to(ROOT).as_posix(), *argv]),
        "device": "cpu",
        "model": {
            "source": source,
            "parameters": info["parameters"],
            "config": info["encoder_config"],
            "chunk_ms": info["chunk_ms"],
            "left_chunks": info["left_chunks"],
        },
        "load_average_1_5_15min": {"before": load_before, "after": os.getloadavg()},
        "audio_s": args.seconds,
        "rtf_target": RTF_TARGET,
        "rtf_median": rtf,
        "meets_target": rtf <= RTF_TARGET,
        "cli_threads_default": TRANSCRIBE_THREADS,
        "cli_rtf_median_by_threads": {
            threads: statistics.median(r["rtf"] for r in runs) for threads, runs in cli.items()
        },
        "cli_runs_by_threads": cli,
        "breakdown_median": {
            "read_resample_s": statistics.median(read),
            "pipelined": medians(pipelined),
            "serial": medians(serial),
        },
        "breakdown_runs": {"read_resample_s": read, "pipelined": pipelined, "serial": serial},
    }
    print(json.dumps(payload["breakdown_median"], indent=2))
    print(f"CLI RTF median {rtf:.4f} (target <= {RTF_TARGET}); by threads {payload['cli_rtf_median_by_threads']}")
    write_result(args.out, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
