"""Audio for the benchmarks: noise at speech level (the front end and encoder cost nothing more for speech)."""

from __future__ import annotations

import numpy as np

__all__ = ["NOISE_LEVEL", "SAMPLE_RATE", "noise", "stream_offsets"]

SAMPLE_RATE = 16_000  # Hz
NOISE_LEVEL = 0.1  # RMS of the noise, in full scale
OFFSET_STRIDE = 997  # samples between the start points of consecutive streams in a shared signal (a prime)
OFFSET_SPAN = SAMPLE_RATE  # streams of a shared signal start up to 1 s apart


def noise(samples: int, seed: int = 0) -> np.ndarray:
    """``(samples,)`` float32 Gaussian noise of RMS :data:`NOISE_LEVEL`, 16 kHz.

    >>> noise(4).dtype, noise(4).shape
    (dtype('float32'), (4,))
    """
    return (NOISE_LEVEL * np.random.default_rng(seed).standard_normal(samples)).astype(np.float32)


def stream_offsets(streams: int, span: int) -> np.ndarray:
    """``(streams,)`` int64 start points in ``[0, span)`` so that many streams read different parts of one signal.

    >>> stream_offsets(3, 1000).tolist()
    [0, 997, 994]
    """
    return (np.arange(streams, dtype=np.int64) * OFFSET_STRIDE) % max(span, 1)


def shared_noise(streams: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """``(source, starts)``: one noise signal and ``(streams,)`` start points, each with ``samples`` samples after it.

    Stream ``i`` reads ``source[starts[i]:]``: many streams of different audio at the cost of one signal.

    >>> source, starts = shared_noise(3, 100)
    >>> bool(len(source) >= starts.max() + 100)
    True
    """
    return noise(OFFSET_SPAN + samples), stream_offsets(streams, OFFSET_SPAN)
