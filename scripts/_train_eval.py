"""Evaluation for scripts/train_ctc.py: error rates, offline and streaming recognition, chunk latency.

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

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from audiomask.asr.decoding import greedy_decode
from audiomask.asr.model import ASRModel
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.audio import load
from audiomask.constants import FRAME_MS
from audiomask.masks.phi4mm import subsampled_lengths

SAMPLE_RATE = 16000  # Hz
FRONTEND_LOOKAHEAD_MS = 15  # a 25 ms analysis window every 10 ms: a frame's last sample is 15 ms past its hop
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


def _by_voice(utterances: Sequence, texts: Sequence[str]) -> dict:
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
    utterances: Sequence,
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
