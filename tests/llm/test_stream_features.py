"""StreamFeatures: the offline front end over threads equals one call; pushes in processes equal pushes on threads."""

from __future__ import annotations

import numpy as np
import pytest

from audiomask.features.phi4mm import Phi4MMFrontend
from audiomask.features.whisper import WhisperFrontend
from audiomask.llm.stream_features import ProcessStreamFeatures, StreamFeatures, joined


def noise(seed: int, seconds: list[float]) -> list[np.ndarray]:
    """Signals of white noise ``seconds`` long each (16 kHz float32)."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(round(s * 16000)) * 0.1).astype(np.float32) for s in seconds]


def assert_one_call(frontend, signals: list[np.ndarray], batch: tuple[np.ndarray, np.ndarray]) -> None:
    """``batch`` is ``frontend.batch(signals)``, bit for bit."""
    expected, expected_lengths = frontend.batch(signals)
    assert batch[0].dtype == expected.dtype and batch[0].shape == expected.shape
    np.testing.assert_array_equal(batch[0], expected)
    np.testing.assert_array_equal(batch[1], expected_lengths)


@pytest.mark.parametrize("frontend", [WhisperFrontend.qwen3_asr(), Phi4MMFrontend()], ids=["whisper", "phi4mm"])
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_offline_batch_over_threads_equals_one_call(frontend, threads: int) -> None:
    signals = noise(threads, [0.3, 7.9, 0.0, 2.5, 16.2, 1.0, 4.4])  # runs of unequal length, one signal empty
    features = StreamFeatures(frontend, slots=1, threads=threads)
    try:
        assert_one_call(frontend, signals, features.batch(signals))
    finally:
        features.close()


@pytest.mark.parametrize("frontend", [WhisperFrontend.qwen3_asr(), Phi4MMFrontend()], ids=["whisper", "phi4mm"])
@pytest.mark.parametrize("threads", [1, 3])
def test_batches_started_later_join_into_one_call(frontend, threads: int) -> None:
    """Signals' offline front end started a few at a time (``batch_later``), the batches joined in order: the
    features and lengths of one call over all of them."""
    signals = noise(threads, [4.4, 0.3, 0.0, 16.2, 2.5, 7.9, 1.0])
    features = StreamFeatures(frontend, slots=1, threads=threads)
    try:
        futures = [features.batch_later(signals[start : start + 2]) for start in range(0, len(signals), 2)]
        assert_one_call(frontend, signals, joined([future.result() for future in futures]))
    finally:
        features.close()


@pytest.mark.parametrize(
    "frontend", [WhisperFrontend.qwen3_asr(floor="running"), Phi4MMFrontend()], ids=["whisper", "phi4mm"]
)
def test_pushes_in_processes_equal_pushes_on_threads(frontend) -> None:
    """Any subset of slots pushing chunks of any length up to a chunk (empty, odd, whole), a slot started over
    mid-stream: the processes give each slot the frames the threads give it, bit for bit."""
    rng = np.random.default_rng(7)
    slots_count, chunk = 6, 16000
    threads = StreamFeatures(frontend, slots_count, threads=2)
    processes = ProcessStreamFeatures(frontend, slots_count, threads=1, workers=2, chunk_samples=chunk)
    try:
        assert not processes.takes_ahead
        for step in range(6):
            slots = np.sort(rng.choice(slots_count, size=int(rng.integers(1, slots_count + 1)), replace=False))
            lengths = rng.choice([chunk, chunk - 1, 7000, 0, 400], size=len(slots))
            chunks = [(rng.standard_normal(int(n)) * 0.1).astype(np.float32) for n in lengths]
            if step == 3:  # a new signal in the first pushed slot
                threads.reset(int(slots[0]))
                processes.reset(int(slots[0]))
            expected, expected_counts = threads.push(chunks, slots)
            frames, counts = processes.push(chunks, slots)
            np.testing.assert_array_equal(counts, expected_counts)
            assert frames.shape[:2] == expected.shape[:2]
            width = int(counts.max(initial=0))
            np.testing.assert_array_equal(frames[:, :, :width], expected[:, :, :width])
        with pytest.raises(ValueError, match="chunk_samples=16000"):
            processes.push([np.zeros(chunk + 1, np.float32)], np.array([0]))
    finally:
        threads.close()
        processes.close()
