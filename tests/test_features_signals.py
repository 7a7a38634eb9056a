"""Speech-like test signals for the audio and front-end tests, and checks that they look like speech.

``speech_like`` strings together voiced stretches (a harmonic series on a
gliding pitch, shaped by three moving formant resonances), fricatives
(high-passed noise bursts) and pauses (digital silence or a faint noise
floor), so that the front ends see what matters in speech: strong low
harmonics beside weak high bands (a wide dynamic range inside one frame), and
frames of silence. Deterministic for a given seed. Other test modules import
it (``from test_features_signals import speech_like``).
"""

from __future__ import annotations

import numpy as np
import pytest

SAMPLE_RATE = 16000
FORMANT_BANDWIDTHS_HZ = (80.0, 120.0, 200.0)


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


def test_speech_like_is_deterministic_and_scaled():
    a, b = speech_like(2.0, seed=3), speech_like(2.0, seed=3)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32 and a.shape == (32000,)
    assert np.abs(a).max() == pytest.approx(10 ** (-6 / 20), rel=1e-6)
    assert not np.array_equal(a, speech_like(2.0, seed=4))


def test_speech_like_has_pauses_and_a_wide_spectrum():
    x = speech_like(4.0, seed=1)
    frames = x[: len(x) // 400 * 400].reshape(-1, 400)
    energy = (frames.astype(np.float64) ** 2).mean(axis=1)
    assert (energy < 1e-6).any() and (energy > 1e-3).any()  # pauses and loud stretches
    spectrum = np.abs(np.fft.rfft(x.astype(np.float64))) ** 2
    low, high = spectrum[: len(spectrum) // 8].sum(), spectrum[len(spectrum) // 2 :].sum()
    assert 1e-6 < high / low < 1.0  # harmonics dominate, but the top half is not empty


def cut(samples: np.ndarray, sizes) -> list[np.ndarray]:
    """``samples`` cut into consecutive chunks of ``sizes`` (cycled until the samples run out)."""
    sizes = list(sizes)
    if not any(sizes):
        raise ValueError(f"sizes must hold a positive size, got {sizes}")
    chunks, start, i = [], 0, 0
    while start < len(samples):
        size = sizes[i % len(sizes)]
        chunks.append(samples[start : start + size])
        start += size
        i += 1
    return chunks


def test_cut_covers_the_samples_in_order():
    x = np.arange(10)
    chunks = cut(x, [3, 0, 4])
    assert [len(c) for c in chunks] == [3, 0, 4, 3]
    np.testing.assert_array_equal(np.concatenate(chunks), x)
