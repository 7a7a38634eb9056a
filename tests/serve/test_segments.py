"""Segments: a connection's audio cut at voice-activity endpoints, commits and the longest segment, one stream each."""

from __future__ import annotations

import numpy as np
import pytest

from audiomask.asr.transcript import Transcript
from audiomask.serve.segments import Segment, Segmenter, TextChanges
from audiomask.serve.utterances import Utterances
from audiomask.vad.endpoints import VAD_WINDOW_SAMPLES, VADSettings

W = VAD_WINDOW_SAMPLES
VAD = VADSettings(threshold=0.5, silence_ms=160, prefix_padding_ms=64)  # 5 quiet windows end speech; 2 of padding


def _ramp(start: int, count: int) -> np.ndarray:
    """Samples whose values are their positions in the connection's audio: a cut's samples say where they were."""
    return np.arange(start, start + count, dtype=np.float32)


def _split(segmenter: Segmenter, samples: np.ndarray, scores: np.ndarray | None = None, **kwargs):
    return [(c.segment, c.opens, c.ends, c.start, c.end, c.samples) for c in segmenter.split(samples, scores, **kwargs)]


def test_without_vad_every_sample_belongs_to_a_segment_and_commits_end_them():
    segmenter = Segmenter(vad=None, max_segment_s=None)
    first = _split(segmenter, _ramp(0, 1000))
    assert [c[:5] for c in first] == [(0, True, False, 0, None)]
    ended = _split(segmenter, _ramp(1000, 500), commit=True)
    assert [c[:5] for c in ended] == [(0, False, True, 0, 1500)]
    nothing = _split(segmenter, _ramp(1500, 0), commit=True)  # a commit with nothing open ends nothing
    assert nothing == []
    later = _split(segmenter, _ramp(1500, 300))
    assert [c[:5] for c in later] == [(1, True, False, 1500, None)]
    routed = np.concatenate([c[5] for c in first + ended + later])
    np.testing.assert_array_equal(routed, _ramp(0, 1800))


def test_a_segment_longer_than_the_limit_is_cut_and_the_next_opens_where_it_ended():
    segmenter = Segmenter(vad=None, max_segment_s=0.1)  # 1,600 samples
    cuts = _split(segmenter, _ramp(0, 4000))
    assert [c[:5] for c in cuts] == [
        (0, True, True, 0, 1600),
        (1, True, True, 1600, 3200),
        (2, True, False, 3200, None),
    ]
    np.testing.assert_array_equal(np.concatenate([c[5] for c in cuts]), _ramp(0, 4000))


def _scores(*runs: tuple[float, int]) -> np.ndarray:
    return np.concatenate([np.full(count, score) for score, count in runs])


def test_with_vad_a_segment_is_the_speech_with_its_padding_and_half_its_silence():
    segmenter = Segmenter(vad=VAD, max_segment_s=None)
    scores = _scores((0.1, 10), (0.9, 20), (0.1, 8), (0.9, 4), (0.1, 6))  # speech at windows 10-29 and 38-41
    cuts = _split(segmenter, _ramp(0, len(scores) * W), scores)
    # Speech starts at window 10, padded by 2 windows; the quiet from window 30 lasts the 160 ms at window 35,
    # and the segment keeps 80 ms of it; the next starts 2 windows before window 38.
    half = VAD.silence_samples // 2
    assert [c[:5] for c in cuts] == [(0, True, True, 8 * W, 30 * W + half), (1, True, True, 36 * W, 42 * W + half)]
    np.testing.assert_array_equal(cuts[0][5], _ramp(8 * W, 22 * W + half))
    assert segmenter.index == 2


def test_with_vad_speech_that_goes_on_past_a_commit_opens_the_next_segment_at_once():
    segmenter = Segmenter(vad=VAD, max_segment_s=None)
    cuts = _split(segmenter, _ramp(0, 10 * W), _scores((0.9, 10)), commit=True)
    assert [c[:5] for c in cuts] == [(0, True, True, 0, 10 * W)]
    cuts = _split(segmenter, _ramp(10 * W, 4 * W), _scores((0.9, 4)))
    assert [c[:5] for c in cuts] == [(1, True, False, 10 * W, None)]


def test_silence_is_held_only_for_the_padding_of_the_next_segment():
    segmenter = Segmenter(vad=VAD, max_segment_s=None)
    for start in range(0, 100 * W, 7 * W):  # long silence, in pieces: nothing routed
        assert _split(segmenter, _ramp(start, 7 * W), _scores((0.1, 7))) == []
    cuts = _split(segmenter, _ramp(105 * W, 3 * W), _scores((0.9, 3)))
    assert [c[:5] for c in cuts] == [(0, True, False, 103 * W, None)]
    np.testing.assert_array_equal(cuts[0][5], _ramp(103 * W, 5 * W))


class _Stream:
    def __init__(self, name: str) -> None:
        self.name, self.token_count, self.done, self.finished = name, 0, False, False
        self.text = ""

    def transcript(self) -> Transcript:
        return Transcript(self.text)

    def cancel(self) -> None:
        self.finished = True


def _kinds(segments: list[Segment]) -> list[tuple[int, str, bool, bool]]:
    return [(s.index, s.transcript.text, s.end_s is not None, s.final) for s in segments]


def test_utterances_report_each_segment_opened_growing_cut_and_final_in_order():
    opened: list[_Stream] = []

    def open_stream(name: str) -> _Stream:
        opened.append(_Stream(name))
        return opened[-1]

    utterances = Utterances("caller", Segmenter(vad=None, max_segment_s=0.1), first_block=800, block=400)
    pairs, finished, blocks = utterances.route(open_stream, _ramp(0, 2000), None, commit=False)
    assert [s.name for s in opened] == ["caller#0", "caller#1"]
    assert [(stream.name, len(samples)) for stream, samples in pairs] == [("caller#0", 1600), ("caller#1", 400)]
    assert finished == [opened[0]]
    assert blocks == 3  # 1,600 samples: the first block and two more; 400: none yet
    opened[1].text, opened[1].token_count = "b", 1
    assert utterances.sweep()
    assert _kinds(utterances.take()) == [
        (0, "", False, False),
        (0, "", True, False),
        (1, "", False, False),
        (1, "b", False, False),
    ]
    opened[0].text, opened[0].done = "a", True
    assert utterances.sweep()
    assert _kinds(utterances.take()) == [(0, "a", True, True)]
    assert not utterances.sweep()  # each report once
    pairs, finished, _ = utterances.route(open_stream, _ramp(2000, 100), None, commit=False, last=True)
    assert finished == [opened[1]] and not utterances.done
    opened[1].text, opened[1].done = "bc", True
    utterances.sweep()  # the last segment's final is the connection's: finish() reports it
    assert _kinds(utterances.take()) == [(1, "b", True, False)]
    assert utterances.done
    assert _kinds(utterances.finish()) == [(1, "bc", True, True)]


def test_a_connection_without_a_segment_finishes_with_an_empty_final():
    utterances = Utterances("caller", Segmenter(vad=VAD, max_segment_s=None), first_block=800, block=400)
    assert utterances.route(_Stream, _ramp(0, 20 * W), _scores((0.1, 20)), commit=False, last=True) == ([], [], 0)
    assert utterances.done and utterances.stream is None
    (last,) = utterances.finish()
    assert (last.index, last.transcript.text, last.final, last.start_s) == (0, "", True, 0.0)


@pytest.mark.parametrize(
    ("reports", "news"),
    [
        ([("", False), ("a", False), ("a", False), ("ab", False)], [False, True, True, True]),
        ([("ab", False), ("ab", True)], [True, True]),  # the final is news even when the text is not
    ],
)
def test_text_changes_tell_a_text_client_only_what_is_new(reports, news):
    changes = TextChanges()
    segments = [Segment(0, Transcript(text), 0.0, final) for text, final in reports]
    assert [changes.changed(segment) for segment in segments] == news
    assert not changes.changed(Segment(0, Transcript("ab"), 0.0, False, end_s=1.0))  # its audio ended: no text news
