"""recipes.ctc_small.augment: waveform augmentation on the host, feature augmentation on the device."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch

from recipes.ctc_small import augment
from recipes.ctc_small.config import TrainConfig


def test_doctests() -> None:
    assert doctest.testmod(augment).failed == 0


def test_augment_is_seeded_and_changes_speed() -> None:
    samples = (np.sin(np.arange(16000) / 7) / 2).astype(np.float32)
    first, drawn = augment.augment(samples, np.random.default_rng(5))
    again, _ = augment.augment(samples, np.random.default_rng(5))
    np.testing.assert_array_equal(first, again)
    assert len(first) == pytest.approx(len(samples) / drawn["speed"], abs=2)
    assert np.abs(first).max() <= 1.0


def test_spec_augment_masks_bands_and_spans_within_each_utterance() -> None:
    config = TrainConfig(time_masks_per_s=5.0)
    features = torch.ones(3, 400, 80)
    lengths = np.array([400, 250, 100])
    fill = torch.zeros(80)
    masked = augment.spec_augment(config, features, lengths, fill, np.random.default_rng(0)) == 0
    bands = masked.all(dim=1)  # (B, 80): bins masked at every frame
    spans = masked.all(dim=2)  # (B, T): frames masked in every bin
    assert bands.any() and spans.any()
    assert (bands.sum(dim=1) <= config.freq_masks * config.freq_mask_bins).all()
    for row, length in enumerate(lengths):
        assert not spans[row, length:].any()  # spans start inside the utterance and end by its last frame
    assert (masked == (bands[:, None, :] | spans[:, :, None])).all()  # nothing else is touched


def test_warp_mel_is_identity_at_one_and_moves_energy_up_above_one() -> None:
    features = torch.randn(2, 5, 80)
    torch.testing.assert_close(augment.warp_mel(features, torch.ones(2)), features, rtol=0, atol=0)
    peak = torch.zeros(1, 1, 80)
    peak[..., 20] = 1.0
    assert int(augment.warp_mel(peak, torch.tensor([1.1])).argmax()) == 22  # bin 22 reads 20


def test_tilt_spectrum_adds_a_line_inside_each_utterance_only() -> None:
    features = torch.randn(2, 6, 80)
    lengths = torch.tensor([6, 3])
    assert torch.equal(augment.tilt_spectrum(features, lengths, torch.zeros(2)), features)
    tilted = augment.tilt_spectrum(features, lengths, torch.tensor([-6.0, 20.0]))
    added = tilted - features
    natural_log_per_db = np.log(10) / 10
    torch.testing.assert_close(added[0, :, -1] - added[0, :, 0], torch.full((6,), -6 * natural_log_per_db))
    torch.testing.assert_close(added[1, :3, -1] - added[1, :3, 0], torch.full((3,), 20 * natural_log_per_db))
    assert torch.equal(added[1, 3:], torch.zeros(3, 80))  # padding untouched
    torch.testing.assert_close(added[:, :3].mean(-1), torch.zeros(2, 3), rtol=0, atol=1e-6)  # a tilt, not a gain
