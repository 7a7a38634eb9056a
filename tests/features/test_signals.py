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

from audiomask.bench.signals import speech_like


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


def test_cut_covers_the_samples_in_order(cut):
    x = np.arange(10)
    chunks = cut(x, [3, 0, 4])
    assert [len(c) for c in chunks] == [3, 0, 4, 3]
    np.testing.assert_array_equal(np.concatenate(chunks), x)
