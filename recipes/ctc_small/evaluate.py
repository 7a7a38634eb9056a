"""Evaluate a model file on a corpus: error rates offline and streaming, and latency per chunk size.

``python -m recipes.ctc_small.evaluate --corpus DIR --model FILE --out FILE.json [--device cpu] [--limit N]
[--split train] [--chunk-ms MS ...]`` scores the corpus's held-out split (or ``--split train``: a corpus of
an engine the model never heard) and writes the report the card reads. :mod:`recipes.ctc_small.train`
runs the same :func:`evaluate` on the model it has just saved.

- :func:`edit_distance` / :func:`error_rates`: Levenshtein distance and the
  corpus-level character and word error rates (CER, WER) of (reference,
  hypothesis) pairs: total edits over total reference length.
- :func:`offline_texts`: whole utterances through the encoder's forward with
  hard chunk masks (or full attention), greedy CTC.
- :func:`streaming_texts`: the real streaming path, chunk by chunk:
  :class:`audiomask.asr.recognizer.StreamingRecognizer` streams fed ``chunk_ms``
  pieces of samples, many streams sharing each encoder step.
- :func:`chunk_latency`: one stream's per-chunk compute time and real-time factor.
- :func:`evaluate`: all of them per engine on a corpus's held-out utterances.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from audiomask.asr.checkpoint import load_model, model_info
from audiomask.asr.decoding import greedy_decode
from audiomask.asr.model import ASRModel
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.audio import load
from audiomask.bench.environment import write_result
from audiomask.constants import FRAME_MS, FRAMES_PER_SECOND, SAMPLE_RATE, WINDOW_MS
from audiomask.masks.phi4mm import subsampled_lengths
from recipes.ctc_small.cli import check_counts, recorded_environment, run_step, step_parser
from recipes.ctc_small.config import TrainConfig
from recipes.ctc_small.data import Utterance, compute_features, read_manifest, split_features

__all__ = [
    "chunk_latency",
    "edit_distance",
    "error_rates",
    "evaluate",
    "evaluate_to_file",
    "main",
    "offline_texts",
    "streaming_texts",
    "summary_table",
]

EVAL_MAX_STREAMS = 64  # streams sharing each encoder step in the streaming evaluation
FRONTEND_LOOKAHEAD_MS = WINDOW_MS - FRAME_MS  # 15 ms: a frame's 25 ms window ends this far past its 10 ms hop
LATENCY_SIGNAL_S = 30.0  # the single-stream latency run streams this much audio (the CLI's RTF case)


def edit_distance(reference: Sequence, hypothesis: Sequence) -> int:
    """Levenshtein distance (substitutions, insertions, deletions, each 1) between two sequences.

    >>> edit_distance("kitten", "sitting"), edit_distance("the cat".split(), "the black cat".split())
    (3, 1)
    """
    codes: dict = {}  # each distinct item -> a small integer, so rows compare as arrays
    ref = np.array([codes.setdefault(item, len(codes)) for item in reference], np.int64)
    hyp = np.array([codes.setdefault(item, len(codes)) for item in hypothesis], np.int64)
    previous = np.arange(len(hyp) + 1, dtype=np.int64)  # distances from the empty reference prefix
    steps = np.arange(len(hyp) + 1, dtype=np.int64)
    for i, item in enumerate(ref, start=1):
        substitute = previous[:-1] + (hyp != item)
        delete = previous[1:] + 1
        row = np.empty_like(previous)
        row[0] = i
        row[1:] = np.minimum(substitute, delete)
        # Insertions chain along the row: row[j] = min over k <= j of (row[k] + j - k).
        previous = np.minimum.accumulate(row - steps) + steps
    return int(previous[-1])


def error_rates(pairs: Sequence[tuple[str, str]]) -> dict:
    """Corpus CER and WER of ``(reference, hypothesis)`` pairs: edits summed over pairs / reference length summed.

    >>> rates = error_rates([("the cat sat", "the bat sat")])
    >>> rates["cer"], rates["wer"], rates["char_edits"], rates["chars"]
    (0.0909, 0.3333, 1, 11)
    """
    char_edits = sum(edit_distance(ref, hyp) for ref, hyp in pairs)
    word_edits = sum(edit_distance(ref.split(), hyp.split()) for ref, hyp in pairs)
    chars = sum(len(ref) for ref, _ in pairs)
    words = sum(len(ref.split()) for ref, _ in pairs)
    return {
        "cer": round(char_edits / max(chars, 1), 4),
        "wer": round(word_edits / max(words, 1), 4),
        "char_edits": char_edits,
        "chars": chars,
        "word_edits": word_edits,
        "words": words,
        "utterances": len(pairs),
    }


@torch.no_grad()
def offline_texts(
    model: ASRModel,
    features: Sequence[np.ndarray],
    chunk_size: int,
    left_chunk: int,
    batch_frames: int,
) -> list[str]:
    """Greedy CTC text of each ``(T, 80)`` feature array, encoded whole under hard chunk masks.

    ``chunk_size`` tokens per chunk (``<= 0``: full attention), ``left_chunk``
    chunks of left context; batches of similar lengths up to ``batch_frames``
    padded frames. The encoder runs where its parameters are.
    """
    order = np.argsort([len(f) for f in features], kind="stable")
    texts: list[str] = [""] * len(features)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(features[order[end]]) * (end + 1 - start) <= batch_frames:
            end += 1
        members = order[start:end]
        lengths = np.array([len(features[i]) for i in members], np.int64)
        batch = np.zeros((len(members), int(lengths.max()), features[members[0]].shape[1]), np.float32)
        for row, index in enumerate(members):
            batch[row, : lengths[row]] = features[index]
        outputs, _ = model.encoder(
            torch.from_numpy(batch), lengths, chunk_size=chunk_size, left_chunk=left_chunk, mask_mode="hard"
        )
        tokens = subsampled_lengths(lengths, model.encoder.config.time_reduction)
        for index, ids in zip(members, greedy_decode(model.head(outputs), tokens)):
            texts[index] = model.tokenizer.decode(ids)
        start = end
    return texts


def streaming_texts(
    model: ASRModel,
    signals: Sequence[np.ndarray],
    device: object,
    chunk_ms: int,
    left_chunks: int,
    max_streams: int,
) -> tuple[list[str], dict]:
    """Final text of each 16 kHz signal streamed through a :class:`StreamingRecognizer`, and the run's timings.

    Signals go in groups of ``max_streams`` similar lengths; within a group
    every stream is fed ``chunk_ms`` of samples in turn (as live audio
    arrives), ended, then finished. Returns the texts and
    ``{"cycles", "wall_s", "audio_s", "rtf", "encode_ms_median"}``.
    """
    piece = SAMPLE_RATE * chunk_ms // 1000
    order = np.argsort([len(s) for s in signals], kind="stable")
    texts: list[str] = [""] * len(signals)
    started = time.perf_counter()
    with StreamingRecognizer(model, device, chunk_ms, left_chunks, max_streams=max_streams) as recognizer:
        for start in range(0, len(order), max_streams):
            group = order[start : start + max_streams]
            streams = [recognizer.open_stream(f"utterance-{index}") for index in group]
            longest = max(len(signals[index]) for index in group)
            for offset in range(0, longest, piece):
                for stream, index in zip(streams, group):
                    samples = signals[index]
                    if offset < len(samples):
                        stream.accept(samples[offset : offset + piece])
                        if offset + piece >= len(samples):
                            stream.input_finished()
            for stream, index in zip(streams, group):
                texts[index] = stream.finish()
        stats = recognizer.stats
    wall_s = time.perf_counter() - started
    audio_s = sum(len(s) for s in signals) / SAMPLE_RATE
    encode = [cycle.encode_s for cycle in stats.cycles]
    timing = {
        "cycles": stats.count,
        "wall_s": round(wall_s, 3),
        "audio_s": round(audio_s, 2),
        "rtf": round(wall_s / audio_s, 5),
        "encode_ms_median": round(1000 * float(np.median(encode)), 3) if encode else None,
    }
    return texts, timing


def chunk_latency(model: ASRModel, signal: np.ndarray, device: object, chunk_ms: int, left_chunks: int) -> dict:
    """One stream of ``signal`` fed ``chunk_ms`` at a time: compute per chunk and real-time factor.

    ``latency_ms`` adds the chunk's own duration (its first sample waits for
    the last), the front end's look-ahead and the median compute per chunk
    (front end + encoder step + CTC head): the time from a sample's arrival
    to its text, at worst, on this device. A short warm-up stream runs first.
    """
    piece = SAMPLE_RATE * chunk_ms // 1000
    with StreamingRecognizer(model, device, chunk_ms, left_chunks) as recognizer:
        recognizer.transcribe(signal[:SAMPLE_RATE])  # warm-up: allocations, kernels
        warm_cycles = recognizer.stats.count
        stream = recognizer.open_stream("latency")
        per_piece = []
        for offset in range(0, len(signal), piece):
            started = time.perf_counter()
            stream.accept(signal[offset : offset + piece])
            per_piece.append(time.perf_counter() - started)
        started = time.perf_counter()
        stream.finish()
        finish_s = time.perf_counter() - started
        cycles = recognizer.stats.since(warm_cycles)
    wall = sum(per_piece) + finish_s
    compute = [c.cpu_s + c.encode_s for c in cycles]
    median_compute_ms = 1000 * float(np.median(compute))
    return {
        "chunk_ms": chunk_ms,
        "audio_s": round(len(signal) / SAMPLE_RATE, 2),
        "cycles": len(cycles),
        "frontend_ms_median": round(1000 * float(np.median([c.cpu_s for c in cycles])), 3),
        "encode_ms_median": round(1000 * float(np.median([c.encode_s for c in cycles])), 3),
        "accept_ms_p95": round(1000 * float(np.percentile(per_piece, 95)), 3),
        "compute_ms_median": round(median_compute_ms, 3),
        "latency_ms": round(chunk_ms + FRONTEND_LOOKAHEAD_MS + median_compute_ms, 1),
        "rtf": round(wall / (len(signal) / SAMPLE_RATE), 5),
    }


def _by_voice(utterances: Sequence[Utterance], texts: Sequence[str]) -> dict:
    """CER and WER per voice."""
    voices: dict[str, list[tuple[str, str]]] = {}
    for utterance, text in zip(utterances, texts):
        voices.setdefault(utterance.voice, []).append((utterance.text, text))
    return {
        voice: {k: v for k, v in error_rates(pairs).items() if k in ("cer", "wer", "utterances")}
        for voice, pairs in sorted(voices.items())
    }


def evaluate(
    model: ASRModel,
    utterances: Sequence[Utterance],
    features: Sequence[np.ndarray],
    device: object,
    chunk_ms_list: Sequence[int],
    left_chunks: int,
    default_chunk_ms: int,
    max_streams: int,
    batch_frames: int,
    report: Callable[[dict], None] = lambda results: None,
) -> dict:
    """CER/WER of ``utterances`` (held-out, with their clean ``features``) per engine, offline and streaming.

    For each engine: offline with full attention; offline with hard chunk
    masks and streaming through :class:`StreamingRecognizer`, at each of
    ``chunk_ms_list`` with ``left_chunks``. Per-voice rates for full attention
    and streaming at ``default_chunk_ms``. Then one stream of
    :data:`LATENCY_SIGNAL_S` of held-out audio per chunk size
    (:func:`chunk_latency`). ``report(results)`` is called after each step
    (to save partial results).
    """
    token_ms = FRAME_MS * model.encoder.config.time_reduction
    signals = [load(utterance.path, SAMPLE_RATE)[0] for utterance in utterances]
    results: dict = {"engines": {}, "latency": []}
    for engine in sorted({u.engine for u in utterances}):
        members = [i for i, u in enumerate(utterances) if u.engine == engine]
        chosen = [utterances[i] for i in members]
        references = [u.text for u in chosen]
        entry: dict = {"voices": sorted({u.voice for u in chosen}), "offline": {}, "streaming": {}}
        results["engines"][engine] = entry
        texts = offline_texts(model, [features[i] for i in members], -1, left_chunks, batch_frames)
        entry["offline"]["full"] = error_rates(list(zip(references, texts)))
        entry["by_voice_offline_full"] = _by_voice(chosen, texts)
        entry["examples"] = [{"reference": r, "hypothesis": h} for r, h in list(zip(references, texts))[:5]]
        for chunk_ms in chunk_ms_list:
            texts = offline_texts(
                model, [features[i] for i in members], chunk_ms // token_ms, left_chunks, batch_frames
            )
            entry["offline"][str(chunk_ms)] = error_rates(list(zip(references, texts)))
            texts, timing = streaming_texts(
                model, [signals[i] for i in members], device, chunk_ms, left_chunks, max_streams
            )
            entry["streaming"][str(chunk_ms)] = error_rates(list(zip(references, texts))) | {"run": timing}
            if chunk_ms == default_chunk_ms:
                entry["by_voice_streaming_default"] = _by_voice(chosen, texts)
            print(
                f"  {engine} {chunk_ms} ms: offline CER {entry['offline'][str(chunk_ms)]['cer']:.4f}, "
                f"streaming CER {entry['streaming'][str(chunk_ms)]['cer']:.4f}",
                flush=True,
            )
            report(results)
    signal = np.concatenate(signals)[: int(LATENCY_SIGNAL_S * SAMPLE_RATE)]
    for chunk_ms in chunk_ms_list:
        results["latency"].append(chunk_latency(model, signal, device, chunk_ms, left_chunks))
        report(results)
    return results


def summary_table(results: dict, default_chunk_ms: int) -> dict:
    """Per engine of :func:`evaluate`'s ``results``: offline full-attention and default-chunk streaming CER/WER.

    >>> rates = {"cer": 0.1, "wer": 0.3, "utterances": 2}
    >>> summary_table({"engines": {"x": {"offline": {"full": rates}, "streaming": {"320": rates}}}}, 320)
    {'x': {'offline_full': {'cer': 0.1, 'wer': 0.3}, 'streaming_320ms': {'cer': 0.1, 'wer': 0.3}}}
    """
    return {
        engine: {
            "offline_full": {k: entry["offline"]["full"][k] for k in ("cer", "wer")},
            f"streaming_{default_chunk_ms}ms": {
                k: entry["streaming"][str(default_chunk_ms)][k] for k in ("cer", "wer")
            },
        }
        for engine, entry in results["engines"].items()
    }


def evaluate_to_file(
    model: ASRModel,
    utterances: Sequence[Utterance],
    features: Sequence[np.ndarray],
    device: object,
    chunk_ms_list: Sequence[int],
    left_chunks: int,
    default_chunk_ms: int,
    batch_frames: int,
    out: Path,
    head: dict,
) -> dict:
    """:func:`evaluate`, writing the report ``head | {"results": ...}`` to ``out`` after each step; the results."""

    def save_partial(results: dict) -> None:
        write_result(out, head | {"results": results})

    results = evaluate(
        model,
        utterances,
        features,
        device,
        chunk_ms_list,
        left_chunks,
        default_chunk_ms,
        EVAL_MAX_STREAMS,
        batch_frames,
        save_partial,
    )
    save_partial(results)
    return results


def evaluate_file(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """A model file on a corpus's ``--split`` (its held-out one by default), on ``--device``."""
    model = load_model(args.model)
    device = torch.device(args.device)
    model.encoder.to(device)
    model.head.to(device)
    chosen: list[Utterance] = []
    for utterance in read_manifest(args.corpus):
        if utterance.split == args.split and (
            args.limit is None or sum(u.engine == utterance.engine for u in chosen) < args.limit
        ):
            chosen.append(utterance)
    features = split_features(compute_features(chosen, 1, 0, args.workers, augmented=False))
    info = model_info(args.model)
    head = {
        "environment": recorded_environment(__spec__.name, argv),
        "model": {k: v for k, v in info.items() if k != "card"},
    }
    evaluate_to_file(
        model,
        chosen,
        features,
        device,
        args.chunk_ms or TrainConfig.eval_chunk_ms,
        info["left_chunks"],
        info["chunk_ms"],
        int(TrainConfig.batch_audio_s * FRAMES_PER_SECOND),
        args.out,
        head,
    )
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options of ``python -m recipes.ctc_small.evaluate``; a count below 1 is a usage error."""
    parser = step_parser(__spec__.name, __doc__)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the eval JSON to write")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--limit", type=int, help="held-out utterances per engine (default all)")
    parser.add_argument(
        "--split",
        choices=("eval", "train"),
        default="eval",
        help="the split to score: train for a corpus the model never saw (another engine's voices)",
    )
    parser.add_argument("--chunk-ms", type=int, nargs="+", help=f"chunk sizes (default {TrainConfig.eval_chunk_ms})")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    check_counts(parser, args, ("workers", "limit"))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the step with ``argv`` (default: the command line); a bad input exits with a message naming it."""
    return run_step(evaluate_file, parse_args, argv, "evaluate")


if __name__ == "__main__":
    sys.exit(main())
