"""Single-stream latency per chunk size, through the public API (:class:`~audiomask.asr.recognizer.StreamingRecognizer`).

For one stream, audio arrives block by block as a live source would deliver
it: the first block is one chunk plus the front end's lookahead (a frame's
window reaches ``win - hop`` samples past its hop: 15 ms), every later block
one chunk. Each block is handed to ``accept`` the moment it is complete and
``partial()`` is read; the time from that moment until both have returned is
the chunk's *compute latency* (features, masks, transfer, encoder step, CTC
head, the argmax back on the host, decoding). Reported per chunk size:

- ``algorithmic_latency_ms``: chunk + lookahead, what the first sample of a
  chunk waits for before its chunk can even start;
- ``compute_ms_p50/p95/p99/max`` over the chunks after the first;
- ``first_partial_ms``: from the stream's first sample to its first partial
  text (the first block's duration plus its compute latency, slot reset included);
- ``rtf``: compute time over audio time.

A warm-up utterance first runs every ring phase of the key/value cache (each
a CUDA graph of its own, captured on first use) so that no timed chunk pays a
capture.
"""

from __future__ import annotations

import time

from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.bench.models import BenchModel
from audiomask.bench.signals import noise
from audiomask.bench.timing import MS_PER_S, percentiles
from audiomask.constants import FRAME_MS, SAMPLE_RATE

__all__ = ["measure_latency"]


def measure_latency(model: BenchModel, chunk_ms: int, left_chunks: int, chunks: int) -> dict:
    """One stream of ``chunks`` chunks of ``chunk_ms`` through ``model`` (a Phi-4MM ASR model); JSON-ready row."""
    if not model.is_phi4mm:
        raise ValueError(
            f"model must be a Phi-4MM ASR model (chunks of any whole number of tokens), got {model.name!r}"
        )
    if chunks < 2:
        raise ValueError(f"chunks must be >= 2 (the first one is the first partial), got {chunks}")
    framing = model.asr.frontend.framing
    lookahead = framing.win - framing.hop  # samples
    with StreamingRecognizer(model.asr, model.device, chunk_ms, left_chunks) as recognizer:
        block = chunk_ms * SAMPLE_RATE // MS_PER_S
        recognizer.transcribe(noise(lookahead + (left_chunks + 2) * block, seed=1))  # every ring phase once
        stream = recognizer.open_stream()
        source = noise(lookahead + chunks * block, seed=2)
        seconds, position = [], 0
        for index in range(chunks):
            size = block + lookahead if index == 0 else block
            piece = source[position : position + size]
            position += size
            began = time.perf_counter()
            stream.accept(piece)
            stream.partial()
            seconds.append(time.perf_counter() - began)
        stream.finish()
    steady = percentiles([s * MS_PER_S for s in seconds[1:]])
    lookahead_ms = lookahead * MS_PER_S / SAMPLE_RATE
    return {
        "model": model.name,
        "chunk_ms": chunk_ms,
        "left_chunks": left_chunks,
        "tokens_per_chunk": chunk_ms // (FRAME_MS * model.asr.encoder.config.time_reduction),
        "chunks": chunks,
        "lookahead_ms": lookahead_ms,
        "algorithmic_latency_ms": chunk_ms + lookahead_ms,
        **{f"compute_ms_{key}": value for key, value in steady.items()},
        "first_chunk_compute_ms": seconds[0] * MS_PER_S,
        "first_partial_ms": chunk_ms + lookahead_ms + seconds[0] * MS_PER_S,
        "rtf": sum(seconds) / (position / SAMPLE_RATE),
    }
