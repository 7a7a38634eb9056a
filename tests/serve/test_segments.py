"""Endpoints: a stream's transcript split into segments by sherpa-onnx's rules, each segment reported once."""

from __future__ import annotations

import random

from audiomask.asr.transcript import Transcript
from audiomask.serve.segments import SILENCE_WITHOUT_TEXT_FACTOR, Segmenter

SILENCE_S, MAX_SEGMENT_S = 1.2, 20.0


def _transcript(*tokens: tuple[str, float]) -> Transcript:
    return Transcript("".join(t for t, _ in tokens), tuple(t for t, _ in tokens), tuple(s for _, s in tokens))


def test_silence_after_text_ends_a_segment_and_the_next_starts_afresh_where_it_ended():
    segmenter = Segmenter(SILENCE_S, MAX_SEGMENT_S)
    words = [("a", 0.4), ("b", 0.5)]
    assert segmenter.update(_transcript(*words), decoded_s=0.64)
    assert segmenter.update(None, decoded_s=0.64 + 0.4) is False  # 0.54 s quiet: not yet
    assert [(s.index, s.transcript.text, s.final) for s in segmenter.take()] == [(0, "ab", False)]
    assert segmenter.update(None, decoded_s=1.7)  # 1.2 s after the last token
    assert [(s.index, s.transcript.text, s.final, s.start_s) for s in segmenter.take()] == [(0, "ab", True, 0.0)]
    later = [*words, ("c", 2.5)]
    assert segmenter.update(_transcript(*later), decoded_s=2.6)
    (current,) = segmenter.take()
    assert (current.index, current.transcript.text, current.start_s, current.final) == (1, "c", 1.7, False)
    assert current.transcript.times_s == (0.8,)  # from the segment's start
    assert segmenter.take() == []  # each change is taken once


def test_a_long_segment_ends_at_max_segment_s_and_silence_without_text_moves_the_start_silently():
    segmenter = Segmenter(SILENCE_S, MAX_SEGMENT_S)
    assert segmenter.update(None, decoded_s=SILENCE_WITHOUT_TEXT_FACTOR * SILENCE_S) is False  # nothing said
    talk = [(chr(97 + i % 26), 2.4 + 0.3 * i) for i in range(80)]  # a token every 0.3 s, no pause
    assert segmenter.update(_transcript(*talk[:50]), decoded_s=2.4 + 0.3 * 50)
    (current,) = segmenter.take()
    assert current.start_s == SILENCE_WITHOUT_TEXT_FACTOR * SILENCE_S and not current.final
    assert segmenter.update(_transcript(*talk[:75]), decoded_s=2.4 + 20.1)  # 20 s since the start: ended
    (ended,) = segmenter.take()
    assert ended.final and ended.transcript.text == "".join(t for t, _ in talk[:75])


def test_without_endpoints_there_is_one_segment_and_finish_hands_over_what_was_not_taken():
    segmenter = Segmenter(None, None)
    words = [("a", 0.4), ("b", 5.0)]
    assert segmenter.update(_transcript(*words[:1]), decoded_s=0.5)
    assert segmenter.update(None, decoded_s=4.9) is False  # long silence: no endpoint
    segmenter.update(_transcript(*words), decoded_s=5.1)
    (last,) = segmenter.finish(_transcript(*words))
    assert (last.index, last.transcript.text, last.final) == (0, "ab", True)
    assert segmenter.take() == []


def test_finish_hands_over_ended_segments_not_taken_then_the_last():
    segmenter = Segmenter(SILENCE_S, MAX_SEGMENT_S)
    segmenter.update(_transcript(("a", 0.2)), decoded_s=0.3)
    segmenter.update(None, decoded_s=1.5)  # ended, not taken
    segments = segmenter.finish(_transcript(("a", 0.2), ("b", 2.0)))
    assert [(s.index, s.transcript.text, s.final) for s in segments] == [(0, "a", True), (1, "b", True)]


def test_a_stream_growing_token_by_token_gets_the_segments_its_whole_transcript_gives():
    """Each segment's times are converted as its tokens come: they equal converting the segment whole."""
    rng = random.Random(0)
    stream, decoded_s, taken = [], 0.0, []
    segmenter = Segmenter(SILENCE_S, MAX_SEGMENT_S)
    for _ in range(400):
        decoded_s = round(decoded_s + 0.32, 2)
        for _ in range(rng.choice([0, 0, 0, 1, 2, 5])):  # pauses long enough for endpoints, and talk
            last_s = stream[-1][1] if stream else 0.0
            stream.append((rng.choice("abc "), round(max(last_s + 0.01, decoded_s - rng.random() * 0.3), 3)))
        segmenter.update(_transcript(*stream), decoded_s)
        taken += segmenter.take()
    taken += segmenter.finish(_transcript(*stream))
    finals = [segment for segment in taken if segment.final]
    assert [segment.index for segment in finals] == list(range(len(finals))) and len(finals) > 5
    assert "".join(segment.transcript.text for segment in finals) == "".join(token for token, _ in stream)
    first = 0
    for segment in finals:
        whole = stream[first : first + len(segment.transcript.tokens)]
        assert segment.transcript.times_s == tuple(round(time - segment.start_s, 3) for _, time in whole)
        first += len(whole)
