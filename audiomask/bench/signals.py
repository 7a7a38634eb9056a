"""Synthetic audio for benchmarks and tests: noise at speech level, and deterministic speech-like signals.

Noise costs the front end and encoder as much as speech. :func:`speech_like`
strings together voiced stretches (a harmonic series on a gliding pitch,
shaped by three moving formant resonances), fricatives (high-passed noise
bursts) and pauses (digital silence or a faint noise floor), so a front end
sees what matters in speech: strong low harmonics beside weak high bands,
and frames of silence.
"""

from __future__ import annotations

import numpy as np

from audiomask.constants import SAMPLE_RATE

__all__ = ["NOISE_LEVEL", "noise", "shared_noise", "speech_like", "stream_offsets"]

NOISE_LEVEL = 0.1  # RMS of the noise, in full scale
OFFSET_STRIDE = 997  # samples between the start points of consecutive streams in a shared signal (a prime)
OFFSET_SPAN = SAMPLE_RATE  # streams of a shared signal start up to 1 s apart
FORMANT_BANDWIDTHS_HZ = (80.0, 120.0, 200.0)  # of the three resonances of speech_like's voiced stretches


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


def _formant_gain(freq: np.ndarray, formants: np.ndarray) -> np.ndarray:
    """Magnitude of three second-order resonances at ``freq`` (Hz), one row per sample."""
    gain = np.ones_like(freq)
    for centre, bandwidth in zip(formants, FORMANT_BANDWIDTHS_HZ):
        gain = gain / np.sqrt((1.0 - (freq / centre) ** 2) ** 2 + (freq * bandwidth / centre**2) ** 2)
    return gain


def _voiced(n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    t = np.arange(n) / sample_rate
    f0 = np.linspace(*rng.uniform(90.0, 260.0, 2), n) * (1.0 + 0.02 * np.sin(2 * np.pi * 5.0 * t))
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    start, end = rng.uniform([250, 800, 2300], [900, 2400, 3400], (2, 3))
    formants = np.linspace(start, end, n)  # (n, 3), gliding like a diphthong
    out = np.zeros(n)
    for k in range(1, int(sample_rate / 2 / f0.max())):
        out += _formant_gain(k * f0, formants.T) * np.sin(k * phase) / k
    return out * np.hanning(n) ** 0.25


def _fricative(n: int, rng: np.random.Generator) -> np.ndarray:
    noise = rng.normal(size=n + 1)
    return (noise[1:] - 0.9 * noise[:-1]) * 0.3 * np.hanning(n)  # first difference: energy high up


def speech_like(seconds: float, seed: int = 0, level_db: float = -6.0, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """``(round(seconds * sample_rate),)`` float32 speech-like samples peaking at ``level_db`` dBFS."""
    rng = np.random.default_rng(seed)
    total = int(round(seconds * sample_rate))
    pieces, length = [], 0
    while length < total:
        kind = rng.choice(["voiced", "fricative", "pause"], p=[0.55, 0.2, 0.25])
        n = int(
            rng.uniform(*{"voiced": (0.1, 0.4), "fricative": (0.05, 0.15), "pause": (0.05, 0.3)}[kind]) * sample_rate
        )
        if kind == "voiced":
            pieces.append(_voiced(n, rng, sample_rate))
        elif kind == "fricative":
            pieces.append(_fricative(n, rng))
        else:  # half the pauses digital silence, half a faint noise floor
            pieces.append(np.zeros(n) if rng.random() < 0.5 else rng.normal(0.0, 1e-4, n))
        length += n
    signal = np.concatenate([np.zeros(0), *pieces])[:total]
    peak = np.abs(signal).max(initial=0.0)
    if peak > 0:
        signal *= 10 ** (level_db / 20) / peak
    return signal.astype(np.float32)
