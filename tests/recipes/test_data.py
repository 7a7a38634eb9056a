"""recipes.ctc_small.data: batches under a frame budget, features gathered on the device."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch

from recipes.ctc_small import data


def test_doctests() -> None:
    assert doctest.testmod(data).failed == 0


def test_batcher_covers_every_copy_once_within_the_budget() -> None:
    lengths = np.random.default_rng(1).integers(50, 500, 300)
    batcher = data.Batcher(lengths, batch_frames=2000, seed=0)
    for _ in range(2):
        batches = batcher.epoch()
        assert sorted(np.concatenate(batches).tolist()) == list(range(300))
        assert all(lengths[b].max() * len(b) <= 2000 for b in batches)
    with pytest.raises(ValueError, match="batch_frames"):
        data.Batcher(lengths, batch_frames=100, seed=0)


def test_device_batch_pads_each_copy_with_its_last_frame() -> None:
    lengths = np.array([3, 1, 2])
    frames = np.arange(6 * 80, dtype=np.float16).reshape(6, 80)
    features = data.FeatureSet(frames, np.array([0, 3, 4]), lengths, np.arange(3))
    store = data.DeviceFeatures(features, torch.device("cpu"))
    batch, batch_lengths = store.batch(np.array([2, 0, 1]))
    assert batch.dtype == torch.float32 and batch.shape == (3, 3, 80)
    assert batch_lengths.tolist() == [2, 3, 1]
    expected = [[4, 5, 5], [0, 1, 2], [3, 3, 3]]  # the frame each row reads
    torch.testing.assert_close(batch, torch.from_numpy(frames[expected].astype(np.float32)), rtol=0, atol=0)
    pieces = data.split_features(features)
    assert [len(piece) for piece in pieces] == lengths.tolist() and pieces[1].dtype == np.float32
