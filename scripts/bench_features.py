#!/usr/bin/env python3
"""Benchmark audiomask's CPU front ends against transformers' feature extractors, side by side.

Throughput in seconds of audio per second of wall time (x real time), for
each front end:

- ``single``: one 30 s utterance, offline.
- ``streamed``: the same utterance pushed in chunks (160 ms and 1.28 s, the
  Phi-4MM streaming chunk of 16 tokens x 80 ms), then flushed.
- ``batch32``: 32 utterances of 5-30 s (ragged), offline, one call.
- ``streams32``: the same 32 utterances as 32 streams pushed together in
  1.28 s chunks (``frontend.streams(32)``), one batched call per push.

Beside them: transformers' ``Phi4MultimodalFeatureExtractor``,
``WhisperFeatureExtractor(feature_size=128)`` and ``Qwen3ASRFeatureExtractor``
on the same audio (``padding="longest"``; they have no streaming mode), and
torchaudio's kaldi ``fbank`` as a reference point for the Phi-4MM front end.
Methods of a case are called in turn, round by round, so that the load other
processes put on the machine hits them alike; each ratio is the median of
the per-round ratios. The audio is samples/ (espeak-ng speech) tiled.

Also recorded: the largest difference from transformers, and the deviation of
the Whisper front end's running floor (what streams use) from the per-utterance
floor, on the samples at several levels.

Usage: python scripts/bench_features.py --out bench/results/features_cpu_2core.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from audiomask.audio import load
from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.timing import MS_PER_S, NS_PER_S, time_interleaved
from audiomask.constants import FRAME_MS, SAMPLE_RATE, WINDOW_MS
from audiomask.features import Phi4MMFrontend, WhisperFrontend
from audiomask.features.whisper import PEAK_PRIOR

ROOT = Path(__file__).resolve().parents[1]  # the checkout: samples/
UTTERANCE_S = 30.0
BATCH = 32
BATCH_SECONDS = (5.0, 30.0)  # uniform range of the batch's utterance lengths
STREAM_CHUNKS_S = (0.16, 1.28)
STREAMS_CHUNK_S = 1.28
FLOOR_LEVELS_DB = (0.0, -10.0, -20.0, -30.0)
SAMPLES = ("hello_world", "weather", "numbers", "stereo_44k")


def speech(seconds: float, offset: int = 0) -> np.ndarray:
    """``seconds`` of the samples/ utterances, tiled, starting ``offset`` samples in."""
    tiled = np.concatenate([load(ROOT / "samples" / f"{name}.wav")[0] for name in SAMPLES])
    n = int(seconds * SAMPLE_RATE)
    reps = (offset + n) // len(tiled) + 1
    return np.ascontiguousarray(np.tile(tiled, reps)[offset : offset + n])


def summarise(times: dict[str, np.ndarray], audio_s: float, baseline: str | None, pushes: dict[str, int]) -> dict:
    out = {}
    for name, t in times.items():
        out[name] = {
            "median_ms": float(np.median(t) * MS_PER_S),
            "p95_ms": float(np.percentile(t, 95) * MS_PER_S),
            "p99_ms": float(np.percentile(t, 99) * MS_PER_S),
            "x_real_time": audio_s / float(np.median(t)),
        }
        if name in pushes:  # a streamed call: its pushes and flush, on average
            out[name]["pushes"] = pushes[name]
            out[name]["median_ms_per_push"] = float(np.median(t) * MS_PER_S / pushes[name])
        if baseline is not None and name != baseline:
            out[name][f"speedup_vs_{baseline}"] = float(np.median(times[baseline] / t))
    return out


def streamed(frontend, samples: np.ndarray, chunk: int) -> None:
    stream = frontend.stream()
    for start in range(0, len(samples), chunk):
        stream.push(samples[start : start + chunk])
    stream.flush()


def streams_together(frontend, signals: list[np.ndarray], chunk: int) -> None:
    streams = frontend.streams(len(signals))
    for start in range(0, max(map(len, signals)), chunk):
        streams.push([x[start : start + chunk] for x in signals])
    streams.flush()


def max_diff(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours - theirs).max())


def floor_deviation() -> list[dict]:
    """Running floor (streams) against the per-utterance floor, on the samples at several levels."""
    utterance, running = WhisperFrontend(128), WhisperFrontend(128, floor="running")
    rows = []
    for name in SAMPLES:
        x = load(ROOT / "samples" / f"{name}.wav")[0]
        for level in FLOOR_LEVELS_DB:
            scaled = x * np.float32(10 ** (level / 20))
            offline, live = utterance(scaled), running(scaled)
            deviation = np.abs(live - offline)
            rows.append(
                {
                    "sample": name,
                    "gain_db": level,
                    "utterance_peak_log10": float(offline.max() * 4 - 4),
                    "max_abs": float(deviation.max()),
                    "mean_abs": float(deviation.mean()),
                    "fraction_over_1e-3": float((deviation > 1e-3).mean()),
                    "frames_until_equal": int(np.flatnonzero(deviation.max(axis=0) > 1e-6).max(initial=-1) + 1),
                    "frames": int(offline.shape[1]),
                }
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``argv`` without the program name; default ``sys.argv[1:]``); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per case (single-utterance cases)")
    parser.add_argument("--batch-rounds", type=int, default=8, help="timed rounds per batch / streams case")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per method first")
    args = parser.parse_args(argv)

    import transformers

    transformers.logging.set_verbosity_error()  # they warn on every call without sampling_rate
    hf_phi = transformers.Phi4MultimodalFeatureExtractor()
    hf_whisper = transformers.WhisperFeatureExtractor(feature_size=128)
    hf_qwen3 = transformers.Qwen3ASRFeatureExtractor()
    from torchaudio.compliance.kaldi import fbank

    phi, phi32 = Phi4MMFrontend(), Phi4MMFrontend(fft_dtype=torch.float32)
    whisper, whisper_running, qwen3 = (
        WhisperFrontend(128),
        WhisperFrontend(128, floor="running"),
        WhisperFrontend.qwen3_asr(),
    )

    x = speech(UTTERANCE_S)
    rng = np.random.default_rng(0)
    lengths = rng.uniform(*BATCH_SECONDS, BATCH)
    signals = [speech(s, offset=int(rng.integers(0, SAMPLE_RATE * 10))) for s in lengths]
    batch_audio_s = float(sum(len(s) for s in signals) / SAMPLE_RATE)

    def hf(extractor, audio, key, **options):
        return extractor(audio, sampling_rate=SAMPLE_RATE, return_tensors="np", **options)[key]

    def kaldi(audio):
        return fbank(
            torch.from_numpy(audio)[None] * 32768,
            num_mel_bins=80,
            frame_length=float(WINDOW_MS),
            frame_shift=float(FRAME_MS),
            dither=0.0,
            preemphasis_coefficient=0.97,
            remove_dc_offset=False,
            window_type="hamming",
            sample_frequency=SAMPLE_RATE,
            low_freq=0.0,
            high_freq=7690.0,
            energy_floor=0.0,
        )

    accuracy = {
        "phi4mm_vs_transformers_30s": max_diff(phi(x), hf(hf_phi, x, "audio_input_features")[0]),
        "phi4mm_float32_fft_vs_transformers_30s": max_diff(phi32(x), hf(hf_phi, x, "audio_input_features")[0]),
        # kaldi clamps power at float epsilon where the Phi-4MM extractor clamps at 1: compare above log(1).
        "kaldi_fbank_clamped_vs_transformers_30s": max_diff(
            np.maximum(kaldi(x).numpy(), 0.0), hf(hf_phi, x, "audio_input_features")[0]
        ),
        "whisper128_vs_transformers_30s": max_diff(
            whisper(x), hf(hf_whisper, x, "input_features", padding="longest")[0]
        ),
        "qwen3_vs_transformers_30s": max_diff(qwen3(x), hf(hf_qwen3, x, "input_features", padding="longest")[0]),
    }

    cases = []

    chunks = {f"stream_{int(c * MS_PER_S)}ms": int(c * SAMPLE_RATE) for c in STREAM_CHUNKS_S}
    streams_chunk = int(STREAMS_CHUNK_S * SAMPLE_RATE)
    pushes = {name: -(-len(x) // n) + 1 for name, n in chunks.items()}  # + the flush
    pushes["streams32_1280ms"] = -(-max(map(len, signals)) // streams_chunk) + 1

    def case(name: str, audio_s: float, methods: dict, baseline: str | None, rounds: int) -> None:
        print(f"{name} ...", flush=True)
        times = {name: ns / NS_PER_S for name, ns in time_interleaved(methods, rounds, args.warmup).items()}
        summary = summarise(times, audio_s, baseline, pushes)
        cases.append({"case": name, "audio_s": audio_s, "rounds": rounds, "methods": summary})

    case(
        "phi4mm_single_30s",
        UTTERANCE_S,
        {
            "transformers": lambda: hf(hf_phi, x, "audio_input_features"),
            "ours": lambda: phi(x),
            "ours_float32_fft": lambda: phi32(x),
            "torchaudio_kaldi_fbank": lambda: kaldi(x),
            **{name: (lambda n=n: streamed(phi, x, n)) for name, n in chunks.items()},
        },
        "transformers",
        args.rounds,
    )
    case(
        "phi4mm_batch32",
        batch_audio_s,
        {
            "transformers": lambda: hf(hf_phi, signals, "audio_input_features", padding="longest"),
            "ours": lambda: phi.batch(signals),
            "ours_float32_fft": lambda: phi32.batch(signals),
            "streams32_1280ms": lambda: streams_together(phi, signals, streams_chunk),
        },
        "transformers",
        args.batch_rounds,
    )
    case(
        "whisper128_single_30s",
        UTTERANCE_S,
        {
            "transformers_whisper": lambda: hf(hf_whisper, x, "input_features", padding="longest"),
            "transformers_qwen3": lambda: hf(hf_qwen3, x, "input_features", padding="longest"),
            "ours": lambda: whisper(x),
            "ours_qwen3": lambda: qwen3(x),
            **{name: (lambda n=n: streamed(whisper_running, x, n)) for name, n in chunks.items()},
        },
        "transformers_whisper",
        args.rounds,
    )
    case(
        "whisper128_batch32",
        batch_audio_s,
        {
            "transformers_whisper": lambda: hf(hf_whisper, signals, "input_features", padding="longest"),
            "ours": lambda: whisper.batch(signals),
            "streams32_1280ms": lambda: streams_together(whisper_running, signals, streams_chunk),
        },
        "transformers_whisper",
        args.batch_rounds,
    )

    report = {
        **capture_environment(sys.argv),
        "config": {
            "sample_rate": SAMPLE_RATE,
            "utterance_s": UTTERANCE_S,
            "batch": BATCH,
            "batch_seconds": BATCH_SECONDS,
            "batch_audio_s": batch_audio_s,
            "stream_chunks_s": STREAM_CHUNKS_S,
            "streams_chunk_s": STREAMS_CHUNK_S,
            "audio": "samples/*.wav (espeak-ng) tiled",
            "transformers_version": transformers.__version__,
            "whisper_peak_prior": PEAK_PRIOR,
            "note": "ours = audiomask defaults (Phi-4MM: float64 FFT; Whisper: per-utterance floor offline, "
            "running floor when streamed); transformers with padding='longest'",
        },
        "units": "median_ms / p95_ms / p99_ms per call (wall time); x_real_time = audio seconds / median call",
        "accuracy_max_abs_diff": accuracy,
        "whisper_running_floor_deviation": floor_deviation(),
        "results": cases,
    }

    print(f"{'case':<24}{'method':<26}{'median ms':>10}{'p95 ms':>9}{'x RT':>9}{'speedup':>9}")
    for c in cases:
        for name, m in c["methods"].items():
            speed = next((v for k, v in m.items() if k.startswith("speedup")), None)
            cell = f"{speed:>8.2f}x" if speed is not None else f"{'-':>9}"
            print(f"{c['case']:<24}{name:<26}{m['median_ms']:>10.2f}{m['p95_ms']:>9.2f}{m['x_real_time']:>9.0f}{cell}")
    print("accuracy (max abs diff):", {k: f"{v:.1e}" for k, v in accuracy.items()})
    if args.out:
        write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
