"""Endpoints: a connection's speech split into segments, by the rules sherpa-onnx's servers use (Kaldi's).

A segment ends (an *endpoint*) once, after some text, ``silence_s`` seconds
of the stream's audio have been decoded without a new token (rule 2; the
server's default 1.2 s, :data:`~audiomask.serve.settings.DEFAULT_ENDPOINT_SILENCE_S`),
or once it has lasted ``max_segment_s`` (rule 3; 20 s by default). Twice
``silence_s`` without any text moves the next segment's start on, without a
result (rule 1). The stream goes on; the next segment's text, tokens and
token times start afresh, its ``start_s`` where the last one ended. Silence
here is what greedy CTC decodes as blanks: decoded audio after the last
token. ``silence_s=None`` turns endpoints off (one segment per connection).

>>> from audiomask.asr.transcript import Transcript
>>> segmenter = Segmenter(silence_s=1.2, max_segment_s=20.0)
>>> segmenter.update(Transcript("hi", ("h", "i"), (0.5, 0.6)), decoded_s=0.8)
True
>>> [(s.index, s.transcript.text, s.final) for s in segmenter.take()]
[(0, 'hi', False)]
>>> segmenter.update(None, decoded_s=1.9)  # 1.3 s decoded since the last token: an endpoint
True
>>> [(s.index, s.transcript.text, s.final, s.start_s) for s in segmenter.take()]
[(0, 'hi', True, 0.0)]
>>> full = Transcript("hi yo", ("h", "i", " ", "y", "o"), (0.5, 0.6, 2.0, 2.1, 2.2))
>>> [(s.index, s.transcript.text, s.transcript.times_s, s.start_s) for s in segmenter.finish(full)]
[(1, ' yo', (0.1, 0.2, 0.3), 1.9)]
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from audiomask.asr.transcript import Transcript

__all__ = ["SILENCE_WITHOUT_TEXT_FACTOR", "Segment", "Segmenter"]

SILENCE_WITHOUT_TEXT_FACTOR = 2  # rule 1: twice the endpoint silence with no text moves the next segment's start


@dataclass(frozen=True)
class Segment:
    """What a result message reports: segment ``index`` of a stream, its text so far or in full (``final``).

    ``transcript``: the segment's text, tokens and their times in seconds from ``start_s``, where the segment
    starts in the stream (seconds from its start).
    """

    index: int
    transcript: Transcript
    start_s: float
    final: bool


class Segmenter:
    """One stream's segments: the engine's sweeps :meth:`update` it, its connection :meth:`take`\\ s what changed.

    Thread-safe (a ticker thread updates, the event loop takes and finishes). Each segment is taken
    once: ended ones in order, then the current one when its text changed since the last take.
    """

    def __init__(self, silence_s: float | None, max_segment_s: float | None) -> None:
        self.silence_s, self.max_segment_s = silence_s, max_segment_s
        self._lock = threading.Lock()
        self._index = 0  # the current segment
        self._first = 0  # its first token, in the stream's transcript
        self._start_s = 0.0  # where it starts in the stream
        self._latest = Transcript()  # the stream's whole transcript, as last seen
        self._times_s: list[float] = []  # the current segment's token times from its start, as far as converted
        self._ended: list[Segment] = []  # ended and not taken
        self._current: Segment | None = None  # changed and not taken

    def update(self, transcript: Transcript | None, decoded_s: float) -> bool:
        """The stream has decoded ``decoded_s`` seconds, its transcript now ``transcript`` (``None``: as it was);
        whether there is something new to :meth:`take`."""
        with self._lock:
            if transcript is not None:
                self._latest = transcript
            spoken = len(self._latest.tokens) > self._first
            if self.silence_s is not None and spoken:
                quiet_s = decoded_s - self._latest.times_s[-1]
                long = self.max_segment_s is not None and decoded_s - self._start_s >= self.max_segment_s
                if quiet_s >= self.silence_s or long:
                    self._ended.append(self._segment(final=True))
                    self._index, self._first, self._start_s = self._index + 1, len(self._latest.tokens), decoded_s
                    self._current, self._times_s = None, []
                    return True
            elif (
                self.silence_s is not None and decoded_s - self._start_s >= SILENCE_WITHOUT_TEXT_FACTOR * self.silence_s
            ):
                self._start_s = decoded_s  # nothing said: the next segment starts later
            if transcript is not None and spoken:
                self._current = self._segment(final=False)
                return True
            return bool(self._ended)

    def take(self) -> list[Segment]:
        """The segments ended since the last take, in order, then the current one if it changed."""
        with self._lock:
            taken = self._ended + ([self._current] if self._current is not None else [])
            self._ended, self._current = [], None
            return taken

    def finish(self, transcript: Transcript) -> list[Segment]:
        """The stream has ended with ``transcript``: the ended segments not taken, then the last one, final."""
        with self._lock:
            self._latest = transcript
            taken = [*self._ended, self._segment(final=True)]
            self._ended, self._current = [], None
            return taken

    def _segment(self, *, final: bool) -> Segment:
        # Only the tokens new since the last call are converted: a sweep updates every speaking stream after
        # each step, and converting a whole segment each time would hold the ticker's interpreter lock per token said.
        times, start_s = self._times_s, self._start_s
        times += [round(time - start_s, 3) for time in self._latest.times_s[self._first + len(times) :]]
        tokens = self._latest.tokens[self._first :]
        return Segment(self._index, Transcript("".join(tokens), tokens, tuple(times)), start_s, final)
