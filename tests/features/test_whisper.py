"""audiomask.features.WhisperFrontend: Whisper / Qwen3-ASR parity, the running floor, batches, streams."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.audio import load
from audiomask.bench.signals import speech_like
from audiomask.features import WhisperFrontend
from audiomask.features.framing import pack
from audiomask.features.whisper import (
    DYNAMIC_RANGE,
    LOG_OFFSET,
    LOG_SCALE,
    PEAK_PRIOR,
    SILENCE_PEAK,
    WHISPER_WINDOW_SAMPLES,
)

PARITY_TOL = 1e-3  # the contract: max abs difference against transformers
STREAM_TOL = 1e-5  # streamed against the same rule offline
SAMPLES = ["hello_world", "weather", "numbers", "stereo_44k"]
# transformers needs more than 200 samples (torch.stft reflect-pads 200); ours also takes fewer.
LENGTHS = [201, 400, 4000, 7999, 8000, 16000, 16159, 37117]


@pytest.fixture(scope="module")
def extractors():
    import transformers

    transformers.logging.set_verbosity_error()  # it warns on every call that omits sampling_rate
    return {
        "whisper128": transformers.WhisperFeatureExtractor(feature_size=128),
        "whisper80": transformers.WhisperFeatureExtractor(feature_size=80),
        "qwen3": transformers.Qwen3ASRFeatureExtractor(),
    }


def reference(extractor, signals, **options) -> np.ndarray:
    return extractor(signals, sampling_rate=16000, return_tensors="np", **options)["input_features"]


def speech_signals() -> dict[str, np.ndarray]:
    signals = {name: load(f"samples/{name}.wav")[0] for name in SAMPLES}
    for seed, level in [(0, -1.0), (1, -20.0), (2, -40.0)]:
        signals[f"speech_like_{seed}_{level:g}dB"] = speech_like(5.0, seed=seed, level_db=level)
    return signals


# (our front end, transformers extractor, its options): the padding rules side by side.
CONFIGS = {
    "whisper128-longest": (lambda: WhisperFrontend(128), "whisper128", {"padding": "longest"}),
    "whisper80-longest": (lambda: WhisperFrontend(80), "whisper80", {"padding": "longest"}),
    "whisper128-max_length": (lambda: WhisperFrontend(128, min_samples=WHISPER_WINDOW_SAMPLES), "whisper128", {}),
    "qwen3-longest": (WhisperFrontend.qwen3_asr, "qwen3", {"padding": "longest"}),
    "qwen3-max_length": (lambda: WhisperFrontend.qwen3_asr(min_samples=WHISPER_WINDOW_SAMPLES), "qwen3", {}),
}


@pytest.mark.parity
@pytest.mark.parametrize("config", list(CONFIGS))
def test_matches_transformers_with_the_same_padding(extractors, config):
    make, name, options = CONFIGS[config]
    frontend = make()
    for label, x in speech_signals().items():
        lengths = [n for n in LENGTHS if n <= len(x)] + [len(x)]
        if config.endswith("max_length"):
            lengths = lengths[-1:]  # one 30-s window per signal keeps this quick
        for n in lengths:
            ours, theirs = frontend(x[:n]), reference(extractors[name], x[:n], **options)[0]
            assert ours.shape == theirs.shape, (config, label, n)
            assert np.abs(ours - theirs).max() <= PARITY_TOL, (config, label, n)


@pytest.mark.parity
@pytest.mark.parametrize("config", ["whisper128-longest", "qwen3-longest"])
def test_batch_matches_transformers_away_from_the_padding(extractors, config):
    """transformers zero-pads shorter rows before its STFT, so their last two frames see zeros where
    ours (each row as if alone, as a stream would be) see the row's reflection; every other frame agrees."""
    make, name, options = CONFIGS[config]
    frontend = make()
    signals = [speech_like(s, seed=i) for i, s in enumerate([3.0, 0.3, 2.2, 1.0])]
    features, lengths = frontend.batch(signals)
    theirs = reference(extractors[name], signals, **options)
    assert features.shape == theirs.shape
    for row, (x, length) in enumerate(zip(signals, lengths)):
        assert length == max(len(x), frontend.min_samples) // 160
        interior = length - 2 if len(x) >= frontend.min_samples else length  # min_samples zeros are in both
        assert np.abs(features[row, :, :interior] - theirs[row, :, :interior]).max() <= PARITY_TOL


def test_batch_rows_equal_single_calls():
    for frontend in (WhisperFrontend(), WhisperFrontend.qwen3_asr(), WhisperFrontend(floor="running")):
        signals = [speech_like(s, seed=i) for i, s in enumerate([1.3, 0.01, 0.0, 0.4, 2.0])]
        features, lengths = frontend.batch(signals)
        assert features.dtype == np.float32 and features.shape[:2] == (5, 128)
        for row, (x, length) in enumerate(zip(signals, lengths)):
            single = frontend(x)
            assert length == frontend.num_frames(len(x)) and single.shape[1] >= length
            np.testing.assert_allclose(features[row, :, : single.shape[1]], single, rtol=0, atol=STREAM_TOL)
            assert (features[row, :, single.shape[1] :] == 0).all()


def test_qwen3_padding_rules():
    frontend = WhisperFrontend.qwen3_asr()
    assert frontend(np.zeros(100, np.float32)).shape == (128, 100)  # 0.5 s minimum -> 50 frames -> padded to 100
    assert frontend(np.zeros(16161, np.float32)).shape == (128, 200)  # 101 frames -> 200
    features, lengths = frontend.batch([np.ones(100, np.float32) * 0.1, np.ones(16161, np.float32) * 0.1])
    assert features.shape == (2, 128, 200) and lengths.tolist() == [50, 101]
    assert (features[0, :, 50:] == 0).all() and (features[1, :, 101:] == 0).all()


def stream(frontend, chunks) -> np.ndarray:
    s = frontend.stream()
    pieces = [s.push(chunk) for chunk in chunks]
    pieces.append(s.flush())
    return np.concatenate(pieces, axis=1)


@settings(max_examples=40)
@given(cuts=st.lists(st.integers(0, 48000), max_size=24), seed=st.integers(0, 3))
def test_streamed_equals_running_floor_offline_for_any_chunking(cuts, seed):
    frontend = WhisperFrontend(floor="running")
    x = speech_like(3.0, seed=seed)
    offline = frontend(x)
    streamed = stream(frontend, np.split(x, sorted(cuts)))
    assert streamed.shape == offline.shape
    assert np.abs(streamed - offline).max() <= STREAM_TOL


@pytest.mark.parametrize("sizes", [[1], [1, 2, 3, 159, 160, 161, 199, 200, 201, 399, 400], [32000], [0, 5, 0, 10000]])
def test_streamed_equals_offline_for_edge_chunkings(sizes, cut):
    for frontend in (WhisperFrontend(floor="running"), WhisperFrontend.qwen3_asr(floor="running")):
        x = speech_like(0.1 if sizes == [1] else 3.0, seed=6)  # one push per sample: keep it short
        assert np.abs(stream(frontend, cut(x, sizes)) - frontend(x)).max() <= STREAM_TOL


@pytest.mark.parametrize("n", [0, 1, 150, 160, 199, 200, 201, 7999])
def test_short_streams_flush_what_offline_gives(n, cut):
    x = speech_like(0.5, seed=7)[:n]
    for frontend in (WhisperFrontend(floor="running"), WhisperFrontend.qwen3_asr(floor="running")):
        offline = frontend(x)
        assert offline.shape[1] == frontend._padded_frames(frontend.num_frames(n))
        np.testing.assert_allclose(stream(frontend, cut(x, [7, 100])), offline, atol=STREAM_TOL)


def unfloored_log_mel(x: np.ndarray) -> np.ndarray:
    """``(128, T)`` log10 mel power before any floor or scaling (the front end's own first stage, whose
    scaling ``(x + 4) / 4`` is undone here to within a float32 rounding of ``x + 4``)."""
    frontend, framing = WhisperFrontend(), WhisperFrontend().framing
    count = framing.count(len(x))
    packed = pack([framing.segment(framing.pad_signal(x), count)], [count], framing)
    scaled, peaks = frontend._log_mel(packed)
    log_mel = scaled.numpy().T * LOG_SCALE - LOG_OFFSET
    np.testing.assert_allclose(log_mel.max(axis=0), peaks.numpy(), atol=1e-6)  # the peaks it records, unscaled
    return log_mel


def utterance_and_running(x: np.ndarray, prior: float = PEAK_PRIOR):
    """Offline features under both floors, the unfloored log-mel, and both floors per frame."""
    utterance = WhisperFrontend()(x)
    running = WhisperFrontend(floor="running", peak_prior=prior)(x)
    log_mel = unfloored_log_mel(x)
    running_peak = np.maximum.accumulate(log_mel.max(axis=0))
    running_floor = np.where(running_peak < SILENCE_PEAK, prior, running_peak) - DYNAMIC_RANGE
    return utterance, running, log_mel, log_mel.max() - DYNAMIC_RANGE, running_floor


@pytest.mark.parametrize("prior", [PEAK_PRIOR, -1.0, 2.0])
@pytest.mark.parametrize("gain_db", [0.0, -20.0, -40.0, -70.0])
def test_running_floor_deviation_is_bounded_as_documented(prior, gain_db):
    """|running - utterance| <= |running floor - utterance floor| / 4 per frame, zero above both floors,
    and zero from the frame holding the utterance's peak on when that peak is not silence."""
    x = load("samples/weather.wav")[0] * np.float32(10 ** (gain_db / 20))
    utterance, running, log_mel, utterance_floor, running_floor = utterance_and_running(x, prior)
    deviation = np.abs(running - utterance)
    assert (deviation <= np.abs(running_floor - utterance_floor) / LOG_SCALE + 1e-5).all()
    above = log_mel >= np.maximum(running_floor, utterance_floor)
    assert deviation[above].max() <= 1e-5
    peak_frame = int(np.argmax(log_mel.max(axis=0)))
    if log_mel.max() >= SILENCE_PEAK:
        assert deviation[:, peak_frame:].max() <= 1e-5


@pytest.mark.parametrize("gain_db", [0.0, -10.0, -20.0, -30.0])
def test_running_floor_deviation_on_speech_at_several_levels(gain_db):
    """The samples/ utterances: a few leading frames off by at most ~0.6, the mean ~0.01 (module docstring)."""
    for name in SAMPLES:
        x = load(f"samples/{name}.wav")[0] * np.float32(10 ** (gain_db / 20))
        utterance, running, *_ = utterance_and_running(x)
        deviation = np.abs(running - utterance)
        assert deviation.max() < 0.65 and deviation.mean() < 0.03, (name, deviation.max(), deviation.mean())


def test_streams_carry_their_own_running_peak():
    loud, quiet = speech_like(2.0, seed=1, level_db=-1.0), speech_like(2.0, seed=2, level_db=-40.0)
    frontend = WhisperFrontend(floor="running")
    streams = frontend.streams(2)
    outs = [[], []]
    for start in range(0, 32000, 3000):
        features, counts = streams.push([loud[start : start + 3000], quiet[start : start + 3000]])
        for i in range(2):
            outs[i].append(features[i, :, : counts[i]])
    features, counts = streams.flush()
    for i, x in enumerate([loud, quiet]):
        outs[i].append(features[i, :, : counts[i]])
        assert np.abs(np.concatenate(outs[i], axis=1) - frontend(x)).max() <= STREAM_TOL


def test_layout_and_silence():
    features = WhisperFrontend()(np.zeros(16000, np.float32))
    assert features.shape == (128, 100) and features.flags.c_contiguous and features.dtype == np.float32
    np.testing.assert_allclose(features, (-10.0 + LOG_OFFSET) / LOG_SCALE)  # log10 of the clamp, floored at itself


def test_running_floor_holds_leading_silence_at_the_prior_then_follows_the_peak(cut):
    x = np.concatenate([np.zeros(8000, np.float32), speech_like(1.0, seed=3, level_db=-30.0)])
    features = stream(WhisperFrontend(floor="running"), cut(x, [1600]))
    np.testing.assert_allclose(features[:, :45], (PEAK_PRIOR - DYNAMIC_RANGE + LOG_OFFSET) / LOG_SCALE)
    log_mel = unfloored_log_mel(x)
    peak = log_mel.max()
    assert peak < PEAK_PRIOR  # quiet speech: after its peak the floor is its own, not the prior's
    np.testing.assert_allclose(
        features[:, -1], (np.maximum(log_mel[:, -1], peak - DYNAMIC_RANGE) + LOG_OFFSET) / LOG_SCALE, atol=1e-5
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: WhisperFrontend(0), "n_mels must be >= 1, got 0"),
        (lambda: WhisperFrontend(floor="causal"), "floor must be one of ('utterance', 'running'), got 'causal'"),
        (lambda: WhisperFrontend(peak_prior=float("nan")), "peak_prior must be finite, got nan"),
        (lambda: WhisperFrontend(min_samples=-1), "min_samples must be >= 0, got -1"),
        (lambda: WhisperFrontend(frame_multiple=0), "frame_multiple must be >= 1, got 0"),
        (lambda: WhisperFrontend()(np.zeros((2, 3))), "samples must be 1-D (mono samples), got shape (2, 3)"),
    ],
)
def test_bad_arguments_name_the_argument(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()
