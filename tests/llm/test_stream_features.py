"""StreamFeatures.batch: the offline front end over threads equals one call, whatever the split."""

from __future__ import annotations

import numpy as np
import pytest

from audiomask.features.phi4mm import Phi4MMFrontend
from audiomask.features.whisper import WhisperFrontend
from audiomask.llm.stream_features import StreamFeatures


@pytest.mark.parametrize("frontend", [WhisperFrontend.qwen3_asr(), Phi4MMFrontend()], ids=["whisper", "phi4mm"])
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_offline_batch_over_threads_equals_one_call(frontend, threads: int) -> None:
    rng = np.random.default_rng(threads)
    seconds = [0.3, 7.9, 0.0, 2.5, 16.2, 1.0, 4.4]  # runs of unequal length, one signal empty
    signals = [(rng.standard_normal(round(s * 16000)) * 0.1).astype(np.float32) for s in seconds]
    features = StreamFeatures(frontend, slots=1, threads=threads)
    try:
        threaded, lengths = features.batch(signals)
    finally:
        features.close()
    expected, expected_lengths = frontend.batch(signals)
    assert threaded.dtype == expected.dtype and threaded.shape == expected.shape
    np.testing.assert_array_equal(threaded, expected)
    np.testing.assert_array_equal(lengths, expected_lengths)
