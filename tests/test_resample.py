"""The streaming resampler equals torchaudio's resampling of the whole signal, however it is cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchaudio.functional as AF

from audiomask.resample import Resampler

RATES = [(24_000, 16_000), (8_000, 16_000), (48_000, 16_000), (44_100, 16_000), (16_000, 16_000)]
# float64 sums, rounded to float32 once, against torchaudio's float64 convolution rounded so: one ulp at most.
TOLERANCE = float(np.spacing(np.float32(1)))


@pytest.mark.parametrize(("orig", "new"), RATES)
@pytest.mark.parametrize("length", [0, 1, 5, 37, 2_400, 24_001])
def test_pieces_joined_equal_the_whole_signal_resampled(orig: int, new: int, length: int) -> None:
    rng = np.random.default_rng(length)
    signal = rng.uniform(-1, 1, length).astype(np.float32)
    resampler = Resampler(orig, new)
    pieces, start = [], 0
    while start < length:
        size = int(rng.integers(1, 3_000))
        pieces.append(resampler.push(signal[start : start + size]))
        start += size
    pieces.append(resampler.flush())
    joined = np.concatenate(pieces)
    reference = np.zeros(0, np.float32)
    if length:
        reference = AF.resample(torch.from_numpy(signal).double(), orig, new).float().numpy()
    assert joined.dtype == np.float32
    assert joined.shape == reference.shape
    np.testing.assert_allclose(joined, reference, atol=TOLERANCE)
