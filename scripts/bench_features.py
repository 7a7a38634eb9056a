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

And the streaming driver's front-end stage (``slot_stage``):
:class:`~audiomask.features.slots.SlotFeatures` ``compute_cycle`` as a
front-end process runs it (one torch thread, its feature batch written in
place), for ``--slots`` slots of each family's encoder chunk (Phi-4MM: 128
frames, 1.28 s; Qwen3-ASR: 100 frames, 1 s), every slot advancing every
cycle. ``steady``: every slot in the middle of its stream; ``churn``: in each
cycle 1 slot in :data:`CHURN_SLOTS` ends its stream with a short last block
and takes a new one in the next (its first block), as a driver's slots do
with utterances of about 16 chunks. Reported per cycle (median wall and
CPU time), and the CPU time per slot and per second of one stream's audio;
for the steady case, where that time goes: the torch operators of
:data:`PROFILED_CYCLES` more cycles by family (FFT, mel products, gathers,
elementwise work, reductions; ``torch.profiler``'s self CPU time,
:func:`audiomask.bench.profile.report_events`), and the rest of the cycle's
CPU time (Python and numpy) beside them.

Usage: python scripts/bench_features.py --out bench/results/features_cpu_2core.json
       python scripts/bench_features.py --slots-only [--out FILE]  # the front-end stage alone
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from audiomask.asr.planner import block_samples, ring_capacity
from audiomask.audio import load
from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.profile import report_events
from audiomask.bench.timing import MS_PER_S, NS_PER_S, time_interleaved
from audiomask.constants import FRAME_MS, SAMPLE_RATE, WINDOW_MS
from audiomask.features import Frontend, Phi4MMFrontend, WhisperFrontend
from audiomask.features.slots import SlotCycle, SlotFeatures, SlotSamples
from audiomask.features.whisper import PEAK_PRIOR

ROOT = Path(__file__).resolve().parents[1]  # the checkout: samples/
UTTERANCE_S = 30.0
BATCH = 32
BATCH_SECONDS = (5.0, 30.0)  # uniform range of the batch's utterance lengths
STREAM_CHUNKS_S = (0.16, 1.28)
STREAMS_CHUNK_S = 1.28
FLOOR_LEVELS_DB = (0.0, -10.0, -20.0, -30.0)
SAMPLES = ("hello_world", "weather", "numbers", "stereo_44k")
SLOT_COUNTS = (256, 1024)
PROFILED_CYCLES = 8  # steady cycles whose operators are profiled, after the timed ones (two wrap around the rings)
SLOT_FAMILIES = {  # name: (front end, frames per encoder chunk)
    "phi4mm": (Phi4MMFrontend, 128),
    "qwen3_asr": (WhisperFrontend.qwen3_asr, 100),
}
US_PER_S = 1_000_000
CHURN_SLOTS = 16  # churn: one slot in this many ends its stream each cycle
LAST_BLOCK_FRACTION = 0.5  # churn: a stream's last block, as a fraction of a block


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


class SlotStage:
    """A driver's front-end stage fed as a driver feeds it: ``batch`` slots' rings, every slot advancing each cycle.

    Streams take their samples from ``audio`` (each slot from its own
    offset); with ``churn``, one slot in :data:`CHURN_SLOTS` (a different
    set each cycle) ends its stream with a short last block, and takes a new
    stream, from its first block, in the next cycle.
    """

    def __init__(self, frontend: Frontend, chunk_frames: int, batch: int, churn: bool, audio: np.ndarray) -> None:
        self.first_block, self.block = block_samples(frontend, chunk_frames)
        self.stage = SlotFeatures(frontend, batch, chunk_frames)
        self.rings = SlotSamples(np.zeros((batch, ring_capacity(self.first_block, self.block)), np.float32))
        self.features = np.zeros(self.stage.shape, np.float32)  # written in place, as in a process's shared batch
        self.batch, self.churn, self.audio = batch, churn, audio
        self.written = np.zeros(batch, np.int64)
        self.read = np.arange(batch, dtype=np.int64) * (len(audio) // batch)  # each slot's place in the audio
        self.joining = np.ones(batch, bool)  # the next block is a stream's first
        self.index = 0

    def next_cycle(self) -> SlotCycle:
        """Write every slot's next block into its ring and describe the cycle."""
        ending = np.zeros(self.batch, bool)
        if self.churn:
            ending[self.index % CHURN_SLOTS :: CHURN_SLOTS] = True
            ending &= ~self.joining
        last = int(self.block * LAST_BLOCK_FRACTION)
        lengths = np.where(self.joining, self.first_block, np.where(ending, last, self.block))
        starts = self.written.copy()
        for slot, length in enumerate(lengths.tolist()):
            at = int(self.read[slot]) % (len(self.audio) - length)
            self.rings.write(slot, int(self.written[slot]), self.audio[at : at + length])
        self.written += lengths
        self.read += lengths
        cycle = SlotCycle(np.ones(self.batch, bool), ending, self.joining.copy(), starts, lengths)
        self.joining = ending
        self.index += 1
        return cycle

    def time_cycles(self, cycles: int, warmup: int) -> tuple[np.ndarray, np.ndarray]:
        """``(cycles,)`` wall and ``(cycles,)`` CPU seconds (this thread's: the stage runs on it) of
        ``compute_cycle``, after ``warmup`` untimed cycles."""
        wall, cpu = np.empty(cycles), np.empty(cycles)
        for index in range(warmup + cycles):
            cycle = self.next_cycle()
            began, cpu_began = time.perf_counter(), time.thread_time()
            self.stage.compute_cycle(self.rings, cycle, self.features)
            if index >= warmup:
                wall[index - warmup] = time.perf_counter() - began
                cpu[index - warmup] = time.thread_time() - cpu_began
        return wall, cpu

    def operators(self, cycles: int) -> dict:
        """The torch operators of ``cycles`` more cycles of ``compute_cycle`` by family, per cycle
        (:func:`~audiomask.bench.profile.report_events`; the cycles' ring writes are numpy copies, no operator)."""
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(cycles):
                self.stage.compute_cycle(self.rings, self.next_cycle(), self.features)
        return report_events(profiler.events(), False, cycles, {"cycles": cycles})


def slot_stage(slot_counts: Sequence[int], cycles: int, warmup: int) -> dict:
    """The front-end stage per cycle, per slot and per stream-second, for each family, slot count and case."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each front-end process runs by default on a host with few cores per process
    audio = speech(60.0)
    rows = []
    try:
        for family, (make, chunk_frames) in SLOT_FAMILIES.items():
            for batch in slot_counts:
                for churn in (False, True):
                    stage = SlotStage(make(), chunk_frames, batch, churn, audio)
                    wall, cpu = stage.time_cycles(cycles, warmup)
                    median, median_cpu, mean_cpu = float(np.median(wall)), float(np.median(cpu)), float(cpu.mean())
                    chunk_s = stage.block / SAMPLE_RATE
                    row = {
                        "family": family,
                        "slots": batch,
                        "case": "churn" if churn else "steady",
                        "chunk_frames": chunk_frames,
                        "chunk_s": chunk_s,
                        "cycles": cycles,
                        "median_ms_per_cycle": median * MS_PER_S,
                        "p95_ms_per_cycle": float(np.percentile(wall, 95)) * MS_PER_S,
                        "median_cpu_ms_per_cycle": median_cpu * MS_PER_S,
                        "mean_cpu_ms_per_cycle": mean_cpu * MS_PER_S,
                        # Means: a stream's cost over its life, the cycles whose blocks wrap around the rings' ends
                        # (one in four, all the slots of a case at once) included.
                        "cpu_us_per_slot": mean_cpu * US_PER_S / batch,
                        "cpu_ms_per_stream_s": mean_cpu * MS_PER_S / (batch * chunk_s),
                    }
                    if not churn:
                        operators = row["operators"] = stage.operators(PROFILED_CYCLES)
                        # The timed cycles' CPU time that no operator holds: Python and numpy (the profiled
                        # cycles' own CPU time would count the profiler's overhead too).
                        operators["unattributed_ms_per_cycle"] = max(mean_cpu * MS_PER_S - operators["ms_per_step"], 0)
                    rows.append(row)
                    print(
                        f"slot stage {family:<10}{batch:>6} slots {row['case']:<7}"
                        f"{row['median_ms_per_cycle']:>8.1f} ms/cycle{row['p95_ms_per_cycle']:>8.1f} p95"
                        f"{row['mean_cpu_ms_per_cycle']:>8.1f} ms CPU"
                        f"{row['cpu_us_per_slot']:>6.0f} us/slot{row['cpu_ms_per_stream_s']:>7.3f} ms CPU per stream-s",
                        flush=True,
                    )
                    if "operators" in row:
                        families = row["operators"]["families"].items()
                        print(
                            "    "
                            + ", ".join(f"{name} {entry['ms_per_step']:.1f} ms" for name, entry in families)
                            + f", Python and numpy {row['operators']['unattributed_ms_per_cycle']:.1f} ms",
                            flush=True,
                        )
    finally:
        torch.set_num_threads(threads)
    return {
        "torch_threads": 1,
        "churn_slots": CHURN_SLOTS,
        "last_block_fraction": LAST_BLOCK_FRACTION,
        "units": "ms per cycle (median wall, p95 wall, median and mean CPU of the calling thread); mean CPU us "
        "per slot; mean CPU ms per second of one stream's audio",
        "rows": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``argv`` without the program name; default ``sys.argv[1:]``); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per case (single-utterance cases)")
    parser.add_argument("--batch-rounds", type=int, default=8, help="timed rounds per batch / streams case")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per method first")
    parser.add_argument("--slots", type=int, nargs="+", default=SLOT_COUNTS, help="slot counts of the front-end stage")
    parser.add_argument(
        "--slot-cycles", type=int, default=16, help="timed cycles per front-end stage case (a ring wraps every 4th)"
    )
    parser.add_argument(
        "--slots-only",
        action="store_true",
        help="time the front-end stage alone; with --out, replace only its section of that file (if it exists)",
    )
    args = parser.parse_args(argv)
    if args.slots_only:
        section = {**capture_environment(sys.argv), **slot_stage(args.slots, args.slot_cycles, args.warmup)}
        if args.out:
            report = json.loads(args.out.read_text()) if args.out.exists() else {}
            write_result(args.out, {**report, "slot_stage": section})
        return 0

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
        "slot_stage": slot_stage(args.slots, args.slot_cycles, args.warmup),  # the run's command above
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
