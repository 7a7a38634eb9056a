"""audiomask.features.Phi4MMFrontend: transformers parity, batches, streams, argument checks."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.audio import load
from audiomask.bench.signals import speech_like
from audiomask.features import Phi4MMFrontend
from audiomask.features.phi4mm import kaldi_mel_banks

PARITY_TOL = 1e-3  # the contract: max abs difference in log-mel against transformers
STREAM_TOL = 1e-5  # the contract: streamed against offline
SAMPLES = ["hello_world", "weather", "numbers", "stereo_44k"]
# Lengths around the framing's edges (400-sample window, 160 hop) and beyond.
LENGTHS = [400, 401, 559, 560, 5000, 16000, 37117, 160000]


@pytest.fixture(scope="module")
def frontend() -> Phi4MMFrontend:
    return Phi4MMFrontend()


@pytest.fixture(scope="module")
def reference():
    import transformers

    transformers.logging.set_verbosity_error()  # it warns on every call that omits sampling_rate
    extractor = transformers.Phi4MultimodalFeatureExtractor()

    def run(signals, **options):
        batch = extractor(signals, sampling_rate=16000, return_tensors="np", **options)
        return batch["audio_input_features"]

    return run


def speech_signals() -> dict[str, np.ndarray]:
    signals = {name: load(f"samples/{name}.wav")[0] for name in SAMPLES}
    for seed, level in [(0, -1.0), (1, -20.0), (2, -6.0)]:
        signals[f"speech_like_{seed}_{level:g}dB"] = speech_like(6.0, seed=seed, level_db=level)
    return signals


def test_kaldi_mel_banks_match_transformers_and_torchaudio():
    from torchaudio.compliance.kaldi import get_mel_banks
    from transformers.audio_utils import mel_filter_bank

    ours = kaldi_mel_banks()
    theirs = mel_filter_bank(257, 80, 0.0, 7690.0, 16000, triangularize_in_mel_space=True, mel_scale="kaldi")
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    kaldi, _ = get_mel_banks(80, 512, 16000.0, 0.0, 7690.0, 100.0, -500.0, 1.0)  # (80, 256): no Nyquist bin
    np.testing.assert_allclose(ours[:256].T, kaldi.double().numpy(), rtol=0, atol=2e-5)  # torchaudio: float32


@pytest.mark.parity
@pytest.mark.parametrize("name", list(speech_signals()))
def test_matches_transformers_on_speech(frontend, reference, name):
    x = speech_signals()[name]
    for n in [m for m in LENGTHS if m <= len(x)] + [len(x)]:
        ours, theirs = frontend(x[:n]), reference(x[:n])[0]
        assert ours.shape == theirs.shape == ((n - 400) // 160 + 1, 80)
        assert np.abs(ours - theirs).max() <= PARITY_TOL, (name, n)


@pytest.mark.parity
def test_float64_fft_matches_transformers_to_float_rounding(reference):
    """The default float64 FFT leaves only float32 rounding: ~2e-6 where the tolerance is 1e-3."""
    frontend = Phi4MMFrontend(fft_dtype=torch.float64)
    for x in speech_signals().values():
        assert np.abs(frontend(x) - reference(x)[0]).max() <= 1e-5


@pytest.mark.parity
def test_float32_fft_deviation_is_bounded(reference):
    """Measured, not promised: float32 FFT error reaches weak filters of loud frames (docstring of fft_dtype)."""
    frontend = Phi4MMFrontend(fft_dtype=torch.float32)
    worst = max(np.abs(frontend(x) - reference(x)[0]).max() for x in speech_signals().values())
    assert worst <= 1e-2


@pytest.mark.parity
def test_batch_matches_transformers_on_valid_frames(frontend, reference):
    signals = [speech_like(s, seed=i) for i, s in enumerate([3.0, 0.7, 2.2, 0.0251])]
    features, lengths = frontend.batch(signals)
    theirs = reference(signals, padding="longest")
    assert features.shape == theirs.shape
    np.testing.assert_array_equal(lengths, [(len(x) - 400) // 160 + 1 for x in signals])
    for row, length in enumerate(lengths):
        assert np.abs(features[row, :length] - theirs[row, :length]).max() <= PARITY_TOL
        assert (features[row, length:] == 0).all()  # padding: log of the clamp floor


def test_batch_rows_equal_single_calls(frontend):
    signals = [speech_like(s, seed=i) for i, s in enumerate([1.3, 0.01, 0.0, 0.4, 2.0])]
    features, lengths = frontend.batch(signals)
    assert features.shape == (5, 198, 80) and features.dtype == np.float32
    for row, (x, length) in enumerate(zip(signals, lengths)):
        single = frontend(x)
        assert single.shape == (length, 80)
        np.testing.assert_allclose(features[row, :length], single, rtol=0, atol=STREAM_TOL)
        assert (features[row, length:] == 0).all()


@pytest.mark.parametrize("n", [0, 1, 399])
def test_too_short_for_a_frame_gives_no_frames(frontend, n):
    features = frontend(np.zeros(n, np.float32))
    assert features.shape == (0, 80) and features.dtype == np.float32


def test_silence_is_zero_and_layout_is_time_major(frontend):
    features = frontend(np.zeros(16000, np.float32))
    assert features.shape == (98, 80) and features.flags.c_contiguous
    assert (features == 0).all()  # log(clamp(0, 1))


def stream(frontend, chunks) -> np.ndarray:
    s = frontend.stream()
    pieces = [s.push(chunk) for chunk in chunks]
    pieces.append(s.flush())
    return np.concatenate(pieces)


@settings(max_examples=40)
@given(cuts=st.lists(st.integers(0, 48000), max_size=24), seed=st.integers(0, 3))
def test_streamed_equals_offline_for_any_chunking(frontend, cuts, seed):
    """Chunks between random cut points: empty, 1-sample, and up to the whole 3 s."""
    x = speech_like(3.0, seed=seed)
    offline = frontend(x)
    streamed = stream(frontend, np.split(x, sorted(cuts)))
    assert streamed.shape == offline.shape
    assert np.abs(streamed - offline).max() <= STREAM_TOL


@pytest.mark.parametrize("sizes", [[1], [1, 2, 3, 159, 160, 161, 399, 400, 401], [32000], [0, 7, 0, 10000]])
def test_streamed_equals_offline_for_edge_chunkings(frontend, sizes, cut):
    x = speech_like(0.1 if sizes == [1] else 4.0, seed=5)  # one push per sample: keep it short
    assert np.abs(stream(frontend, cut(x, sizes)) - frontend(x)).max() <= STREAM_TOL


def test_streams_pushed_together_equal_separate_streams(frontend):
    """Ragged chunks (empty ones too) through one FeatureStreams give each stream's own frames."""
    signals = [speech_like(2.0, seed=i) for i in range(3)] + [np.zeros(100, np.float32)]
    streams = frontend.streams(len(signals))
    separate = [frontend.stream() for _ in signals]
    together, alone = [[] for _ in signals], [[] for _ in signals]
    rng = np.random.default_rng(0)
    starts = np.zeros(len(signals), dtype=np.int64)
    for _ in range(6):
        sizes = rng.integers(0, 9000, len(signals))
        chunks = [x[a : a + n] for x, a, n in zip(signals, starts, sizes)]
        starts += sizes
        features, counts = streams.push(chunks)
        assert features.shape == (len(signals), counts.max(), 80)
        for i, (chunk, count) in enumerate(zip(chunks, counts)):
            assert (features[i, count:] == 0).all()
            together[i].append(features[i, :count])
            alone[i].append(separate[i].push(chunk))
    features, counts = streams.flush()
    assert (counts == 0).all()  # Phi-4MM frames never wait for the end
    for i, s in enumerate(separate):
        alone[i].append(s.flush())
        np.testing.assert_allclose(np.concatenate(together[i]), np.concatenate(alone[i]), rtol=0, atol=STREAM_TOL)


def test_streams_concatenated_pushes_equal_offline(frontend):
    signals = [speech_like(1.5, seed=i) for i in range(3)]
    streams = frontend.streams(3)
    outs = [[] for _ in signals]
    for start in range(0, 24000, 2500):
        features, counts = streams.push([x[start : start + 2500] for x in signals])
        for i, count in enumerate(counts):
            outs[i].append(features[i, :count])
    features, counts = streams.flush()
    for i, x in enumerate(signals):
        outs[i].append(features[i, : counts[i]])
        assert np.abs(np.concatenate(outs[i]) - frontend(x)).max() <= STREAM_TOL


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda f: f(np.zeros((2, 400), np.float32)), "samples must be 1-D (mono samples), got shape (2, 400)"),
        (lambda f: f(np.zeros(400, np.int16)), "samples must hold floating-point samples in [-1, 1], got dtype int16"),
        (lambda f: f.batch([]), "signals must hold at least one signal, got an empty sequence"),
        (lambda f: f.batch(np.zeros(400, np.float32)), "signals must be a sequence of 1-D arrays"),
        (
            lambda f: f.batch([np.zeros(400), np.zeros((1, 2))]),
            "signals[1] must be 1-D (mono samples), got shape (1, 2)",
        ),
        (lambda f: f.streams(0), "count must be >= 1, got 0"),
        (lambda f: f.streams(2).push([np.zeros(3)]), "chunks must hold one chunk per stream (2), got 1"),
        (lambda f: Phi4MMFrontend(fft_dtype=torch.float16), "fft_dtype must be torch.float32 or torch.float64"),
    ],
)
def test_bad_arguments_name_the_argument(frontend, call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call(frontend)


def test_stream_refuses_use_after_flush(frontend):
    s = frontend.stream()
    s.push(np.zeros(500, np.float32))
    s.flush()
    with pytest.raises(ValueError, match="push after flush"):
        s.push(np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="flush called twice"):
        s.flush()


def test_accepts_float64_tensors_and_read_only_arrays(frontend):
    x = speech_like(0.5, seed=9)
    expected = frontend(x)
    np.testing.assert_allclose(frontend(torch.from_numpy(x.astype(np.float64))), expected, atol=STREAM_TOL)
    frozen = x.copy()
    frozen.flags.writeable = False
    np.testing.assert_array_equal(frontend(frozen), expected)


def test_a_first_call_under_inference_mode_leaves_later_calls_outside_it_working(frontend):
    """Each thread's scratch buffers are made by its first call: under ``torch.inference_mode`` (an LLM's
    transcription) they must still be writable by the calls outside it, with the same features."""
    x = speech_like(0.5, seed=3)
    results: list[np.ndarray] = []

    def run() -> None:  # a thread of its own: its first call makes its scratch
        with torch.inference_mode():
            results.append(frontend(x))
        results.append(frontend(x))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert len(results) == 2  # the call outside inference mode raised nothing
    np.testing.assert_array_equal(results[1], results[0])
