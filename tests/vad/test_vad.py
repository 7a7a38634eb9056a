"""Voice-activity detection: Silero's scores, batched over streams, and the endpoints read from them."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from audiomask.constants import SAMPLE_RATE
from audiomask.vad.detector import INITIAL_ROWS, VoiceActivity
from audiomask.vad.endpoints import Endpointer, SpeechStarted, SpeechStopped, VADSettings
from audiomask.vad.silero import WINDOW_SAMPLES, SileroVAD, package_weights

SAMPLES = Path(__file__).parents[2] / "samples"
SPEECH_FILES = ("hello_world.wav", "numbers.wav", "weather.wav")  # one sentence each, 16 kHz mono
PAUSES_S = (0.3, 0.5, 0.8, 1.2, 2.0)  # silences put between the sentences
BOUNDARY_TOLERANCE_S = 0.3  # a segment boundary lies within this of the pause it marks
SCORE_TOLERANCE = 1e-5  # float32 convolutions of another batch size may round differently
# The package's TorchScript graph computes the same network with other kernels and another order of sums; the
# LSTM carries each rounding on through the file: up to 1.9e-5 of a probability on an AMD EPYC.
PACKAGE_TOLERANCE = 1e-4


def _sentence(name: str) -> np.ndarray:
    samples, rate = sf.read(SAMPLES / name, dtype="float32")
    assert rate == SAMPLE_RATE and samples.ndim == 1
    return samples


def _silero_scores(samples: np.ndarray) -> np.ndarray:
    """Scores of the silero-vad package's own model (its TorchScript file, as ``load_silero_vad`` loads it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = torch.jit.load(str(package_weights()), map_location="cpu")
    model.reset_states()
    audio = torch.from_numpy(samples)
    windows = range(0, len(audio) - WINDOW_SAMPLES + 1, WINDOW_SAMPLES)
    return np.array([model(audio[i : i + WINDOW_SAMPLES][None], SAMPLE_RATE).item() for i in windows])


@pytest.mark.parametrize("name", SPEECH_FILES)
def test_scores_equal_silero_package(name: str) -> None:
    samples = _sentence(name)
    activity = VoiceActivity()
    key = activity.open()
    ours = np.concatenate([activity.score([(key, piece)])[0] for piece in np.array_split(samples, 7)])
    reference = _silero_scores(samples)
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, atol=PACKAGE_TOLERANCE)
    assert (reference > 0.5).mean() > 0.5  # a sentence is mostly speech: the comparison is not of silence


def test_batched_streams_score_as_alone() -> None:
    sentences = [_sentence(name) for name in SPEECH_FILES]
    alone = []
    for samples in sentences:
        activity = VoiceActivity()
        alone.append(activity.score([(activity.open(), samples)])[0])
    activity = VoiceActivity()
    keys = [activity.open() for _ in sentences]
    rng = np.random.default_rng(0)
    got: list[list[np.ndarray]] = [[] for _ in sentences]
    offsets = [0] * len(sentences)
    while any(offset < len(s) for offset, s in zip(offsets, sentences)):
        pieces = []
        for index, samples in enumerate(sentences):
            if offsets[index] < len(samples) and rng.random() < 0.7:  # streams come and go between calls
                size = int(rng.integers(1, 6000))
                pieces.append((index, samples[offsets[index] : offsets[index] + size]))
                offsets[index] += size
        for (index, _), scores in zip(pieces, activity.score([(keys[i], p) for i, p in pieces])):
            got[index].append(scores)
    for index, reference in enumerate(alone):
        np.testing.assert_allclose(np.concatenate(got[index]), reference, atol=SCORE_TOLERANCE)


def test_streams_beyond_the_first_state_rows_and_rows_reused_score_as_alone() -> None:
    samples = _sentence("numbers.wav")[:16000]
    alone = VoiceActivity()
    reference = alone.score([(alone.open(), samples)])[0]
    activity = VoiceActivity()
    keys = [activity.open() for _ in range(INITIAL_ROWS + 6)]  # the state table doubles
    for key in keys[::2]:
        activity.close(key)  # their rows go to the next streams opened
    keys = keys[1::2] + [activity.open() for _ in range(10)]
    for scores in activity.score([(key, samples) for key in keys]):
        np.testing.assert_allclose(scores, reference, atol=SCORE_TOLERANCE)


def test_score_refuses_a_stream_twice_and_scores_nothing_of_a_closed_one() -> None:
    activity = VoiceActivity()
    key = activity.open()
    with pytest.raises(ValueError, match="twice"):
        activity.score([(key, np.zeros(10, np.float32)), (key, np.zeros(10, np.float32))])
    other = activity.open()
    activity.close(key)  # its connection has gone while a pass held its samples: they score nothing
    scores = activity.score([(key, np.zeros(4096, np.float32)), (other, np.zeros(4096, np.float32))])
    assert [len(s) for s in scores] == [0, 8]


class _HeldVAD(SileroVAD):
    """Silero's network whose calls, once started, wait for :attr:`release`: a call in flight for as long as a
    test likes."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.started.set()
        if not self.release.wait(60):
            raise TimeoutError("the test never released the call")
        return super().forward(*args)


def _returns(call: object) -> bool:
    """Whether ``call()`` returns on another thread while the test holds a call in flight (it would otherwise
    wait until that call is released, after this answers)."""
    thread = threading.Thread(target=call)
    thread.start()
    thread.join(30)
    return not thread.is_alive()


def test_open_and_close_do_not_wait_for_a_call_in_flight_nor_touch_its_rows() -> None:
    samples = _sentence("numbers.wav")[:16000]
    alone = VoiceActivity()
    reference = alone.score([(alone.open(), samples)])[0]
    model = _HeldVAD.from_package()
    model.release.set()
    activity = VoiceActivity(model)
    talking, leaving = activity.open(), activity.open()
    first = activity.score([(talking, samples[:8000])])[0]
    model.release.clear()
    model.started.clear()
    results = {}
    call = threading.Thread(
        target=lambda: results.update(scores=activity.score([(talking, samples[8000:]), (leaving, samples)]))
    )
    call.start()
    assert model.started.wait(30)
    opened = []
    assert _returns(lambda: activity.close(leaving))  # its row is the call's: not handed out before it is over
    assert _returns(lambda: opened.append(activity.open()))
    model.release.set()
    call.join(30)
    np.testing.assert_allclose(np.concatenate([first, results["scores"][0]]), reference, atol=SCORE_TOLERANCE)
    later = activity.open()  # may take the closed stream's row, free now
    for scores in activity.score([(opened[0], samples), (later, samples)]):
        np.testing.assert_allclose(scores, reference, atol=SCORE_TOLERANCE)


def _speech_extent(samples: np.ndarray) -> tuple[int, int]:
    """First and last sample of the 10 ms frames louder than 1 % of the peak: where a file's sentence is."""
    frame = SAMPLE_RATE // 100
    loud = np.flatnonzero(
        np.abs(samples[: len(samples) // frame * frame]).reshape(-1, frame).max(1) > 0.01 * np.abs(samples).max()
    )
    return int(loud[0]) * frame, int(loud[-1] + 1) * frame


def _joined(pauses_s: tuple[float, ...]) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The sample sentences in turn with ``pauses_s`` of silence between the files; each sentence's (start, end)
    sample, its first and last loud frame (a pause between two includes the files' own margins)."""
    sentences = [_sentence(SPEECH_FILES[i % len(SPEECH_FILES)]) for i in range(len(pauses_s) + 1)]
    parts, extents, position = [], [], 0
    for index, sentence in enumerate(sentences):
        if index:
            parts.append(np.zeros(round(pauses_s[index - 1] * SAMPLE_RATE), np.float32))
            position += len(parts[-1])
        first, last = _speech_extent(sentence)
        extents.append((position + first, position + last))
        parts.append(sentence)
        position += len(sentence)
    return np.concatenate(parts), extents


def _events(samples: np.ndarray, settings: VADSettings, piece: int = 1600) -> list[SpeechStarted | SpeechStopped]:
    activity, endpointer = VoiceActivity(), Endpointer(settings)
    key = activity.open()
    events = []
    for start in range(0, len(samples), piece):  # 100 ms messages, as a client sends them
        events += endpointer.push(activity.score([(key, samples[start : start + piece])])[0])
    return events


@pytest.mark.parametrize("silence_ms", [250, 500])
def test_endpoints_fall_in_the_pauses_and_never_inside_a_sentence(silence_ms: int) -> None:
    samples, sentences = _joined(PAUSES_S)
    pauses = [(end, start) for (_, end), (start, _) in zip(sentences, sentences[1:])]
    events = _events(samples, VADSettings(silence_ms=silence_ms))
    stops = [event.sample for event in events if isinstance(event, SpeechStopped)]
    starts = [event.sample for event in events if isinstance(event, SpeechStarted)]
    tolerance = BOUNDARY_TOLERANCE_S * SAMPLE_RATE
    # Every pause at least as long as the silence setting ends a segment near its start; shorter ones none.
    expected = [(start, end) for start, end in pauses if end - start >= silence_ms * SAMPLE_RATE / 1000]
    quiet = [*pauses, (sentences[-1][1], len(samples))]  # and after the last sentence
    inside = [stop for stop in stops if not any(start - tolerance <= stop <= end for start, end in quiet)]
    assert inside == [], f"speech stopped inside a sentence at {[s / SAMPLE_RATE for s in inside]} s"
    marked = [(start, end) for start, end in pauses if any(abs(stop - start) <= tolerance for stop in stops)]
    assert marked == expected
    # ... and the next sentence starts within the tolerance of the pause's end.
    assert starts[0] < tolerance
    for _, end in expected:
        assert any(abs(begin - end) <= tolerance for begin in starts)


def test_endpointer_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="threshold"):
        VADSettings(threshold=1.5)
    with pytest.raises(TypeError, match="threshold"):
        VADSettings(threshold="0.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="silence_ms"):
        VADSettings(silence_ms=-1)


def test_a_dip_between_words_does_not_stop_speech() -> None:
    endpointer = Endpointer(VADSettings(threshold=0.5, silence_ms=64, prefix_padding_ms=0))
    # 0.4 is below the threshold but above threshold - HYSTERESIS: still speech.
    assert endpointer.push(np.array([0.9, 0.4, 0.4, 0.4, 0.9])) == [SpeechStarted(0)]
    assert endpointer.push(np.array([0.1, 0.1])) == [SpeechStopped(5 * WINDOW_SAMPLES, 7 * WINDOW_SAMPLES)]
    assert endpointer.heard == 7 * WINDOW_SAMPLES


def test_network_loads_from_package() -> None:
    model = SileroVAD.from_package()
    assert not model.training and not any(p.requires_grad for p in model.parameters())


@pytest.mark.gpu
def test_scores_on_cuda_equal_the_cpu_ones() -> None:
    samples = _sentence("weather.wav")
    on_cpu, on_gpu = VoiceActivity(), VoiceActivity(device="cuda")
    expected = on_cpu.score([(on_cpu.open(), samples)])[0]
    key = on_gpu.open()
    saved = torch.backends.cudnn.allow_tf32  # cuDNN's float32 convolutions default to TF32 (10-bit products)
    torch.backends.cudnn.allow_tf32 = False
    try:
        got = np.concatenate([on_gpu.score([(key, piece)])[0] for piece in np.array_split(samples, 5)])
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    np.testing.assert_allclose(got, expected, atol=PACKAGE_TOLERANCE)  # cuDNN's kernels sum in other orders


@pytest.mark.gpu
def test_scoring_does_not_wait_for_work_queued_on_the_device() -> None:
    """A recognizer's step queued on the default CUDA stream: the detector's call returns before it is done,
    with the scores it gives on an idle device."""
    from audiomask.bench.harness import QueueFiller

    samples = _sentence("weather.wav")
    detector = VoiceActivity(device="cuda")
    key = detector.open()
    first, rest = samples[: len(samples) // 2], samples[len(samples) // 2 :]
    expected = VoiceActivity(device="cuda")
    expected_key = expected.open()
    expected_scores = [expected.score([(expected_key, piece)])[0] for piece in (first, rest)]
    scores = [detector.score([(key, first)])[0]]
    torch.cuda.synchronize()
    QueueFiller("cuda").fill(500)  # half a second of work on the default stream
    scores.append(detector.score([(key, rest)])[0])
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_busy, "the detector waited for the work queued on the default stream"
    for got, want in zip(scores, expected_scores, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
