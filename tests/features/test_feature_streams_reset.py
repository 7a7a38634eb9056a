"""FeatureStreams.reset restarts one stream in place; push(indices=) pushes a subset: both as fresh streams."""

from __future__ import annotations

import numpy as np
import pytest

from audiomask.features import Phi4MMFrontend, WhisperFrontend

FRONTENDS = {
    "whisper-qwen3-asr": WhisperFrontend.qwen3_asr,
    "whisper-running": lambda: WhisperFrontend(floor="running"),
    "phi4mm": Phi4MMFrontend,
}


def _signal(seconds: float, seed: int, level: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * 16000)) * level).astype(np.float32)


def _cut(signal: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    bounds = np.cumsum([0, *sizes])
    return [signal[a:b] for a, b in zip(bounds[:-1], bounds[1:])] + [signal[bounds[-1] :]]


def _fresh(frontend, chunks: list[np.ndarray]) -> list[np.ndarray]:
    stream = frontend.stream()
    return [stream.push(chunk) for chunk in chunks]


@pytest.mark.parametrize("name", sorted(FRONTENDS))
def test_a_reset_stream_equals_a_fresh_stream_bit_for_bit(name: str) -> None:
    frontend = FRONTENDS[name]()
    axis = frontend.time_axis
    streams = frontend.streams(3)
    # loud audio first, so that Whisper's running floor (the stream's peak so far) would carry over a reset
    before = [_signal(1.3, seed, 0.9) for seed in range(3)]
    streams.push(before)
    streams.push([np.zeros(0, np.float32), before[1][:777], before[2][:1000]])
    streams.reset(1)
    quiet = _signal(3.1, 7, 0.01)
    chunks = _cut(quiet, [1, 199, 3200, 555, 16000])
    others = _cut(_signal(3.0, 9, 0.5), [4000, 4000, 4000, 4000, 4000])
    got = []
    for step, (chunk, other) in enumerate(zip(chunks, others)):
        if step == 1:  # subset pushes: stream 1 alone, then first of two
            features, counts = streams.push([chunk], indices=[1])
        elif step == 3:
            features, counts = streams.push([chunk, other], indices=[1, 0])
        else:
            features, counts = streams.push([other, chunk, other])
            features, counts = features[1:], counts[1:]
        frames = np.take(features[0], np.arange(counts[0]), axis=axis)
        got.append(frames)
    want = _fresh(frontend, chunks)
    for step, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape, step
        assert np.array_equal(a, b), step


@pytest.mark.parametrize("name", sorted(FRONTENDS))
def test_a_subset_push_leaves_the_other_streams_as_if_alone(name: str) -> None:
    frontend = FRONTENDS[name]()
    axis = frontend.time_axis
    signals = [_signal(2.5, seed, level) for seed, level in enumerate((0.5, 0.02, 0.3))]
    streams = frontend.streams(3)
    got: list[list[np.ndarray]] = [[], [], []]
    size = 3000
    for step in range(0, len(signals[0]), size):
        rows = [row for row in range(3) if (step // size + row) % 3]  # each stream skips every third push
        features, counts = streams.push([signals[row][step : step + size] for row in rows], indices=rows)
        for index, row in enumerate(rows):
            got[row].append(np.take(features[index], np.arange(counts[index]), axis=axis))
    for row in range(3):
        pushed = [signals[row][step : step + size] for step in range(0, len(signals[0]), size)]
        kept = [chunk for index, chunk in enumerate(pushed) if (index + row) % 3]
        want = np.concatenate(_fresh(frontend, kept), axis=axis)
        assert np.array_equal(np.concatenate(got[row], axis=axis), want), row


def test_push_indices_and_reset_are_checked() -> None:
    streams = Phi4MMFrontend().streams(2)
    chunk = np.zeros(160, np.float32)
    for indices in ([2], [-1], [0, 0], []):
        with pytest.raises(ValueError, match="indices"):
            streams.push([chunk] * len(indices), indices=indices)
    with pytest.raises(ValueError, match="chunks"):
        streams.push([chunk], indices=[0, 1])
    with pytest.raises(ValueError):
        streams.reset(2)
    streams.flush()
    with pytest.raises(ValueError, match="reset after flush"):
        streams.reset(0)
