"""A connection's audio cut into segments, one recognizer stream each: at voice-activity endpoints and commits.

A segment (an utterance; an *item* of OpenAI's Realtime API) is the audio of
one stream of the recognizer. A :class:`Segmenter` decides, for each piece of
a connection's audio, which segment it belongs to, as :class:`Cut`\\ s: the
samples for the current segment's stream, whether they open it (a new stream)
and whether they end it (the stream is finished: its final text is the
segment's). A segment ends

- at an endpoint, with voice-activity detection (``vad``,
  :mod:`audiomask.vad`): once speech has stopped for ``silence_ms``, half that
  silence after the speech (a pause only a little longer than the setting is
  then not cut where the next sentence has begun); the next segment opens where
  speech starts again, ``prefix_padding_ms`` before it; audio in which the
  detector hears no speech beyond that padding belongs to no segment (OpenAI's
  server VAD does the same);
- after ``max_segment_s`` of audio (a new one opens at once: speech goes on);
- where the client commits its audio (OpenAI's ``input_audio_buffer.commit``)
  or ends it.

Without ``vad`` the segment opens with the first sample after the last one
ended, and every sample belongs to a segment.

>>> import numpy as np
>>> segmenter = Segmenter(vad=None, max_segment_s=None)
>>> [(c.segment, len(c.samples), c.opens, c.ends) for c in segmenter.split(np.zeros(800, np.float32))]
[(0, 800, True, False)]
>>> [(c.segment, len(c.samples), c.opens, c.ends) for c in segmenter.split(np.zeros(400, np.float32), commit=True)]
[(0, 400, False, True)]
>>> [(c.segment, c.start, c.opens) for c in segmenter.split(np.zeros(100, np.float32))]
[(1, 1200, True)]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from audiomask.asr.transcript import Transcript
from audiomask.constants import SAMPLE_RATE
from audiomask.vad.endpoints import VAD_WINDOW_SAMPLES, Endpointer, SpeechStarted, VADSettings

__all__ = ["HANDOVER_STEP_SAMPLES", "Cut", "Segment", "Segmenter", "TextChanges", "handover_step", "seconds"]

_EMPTY = np.zeros(0, np.float32)
# A connection's audio is handed over at least every HANDOVER_STEP_SAMPLES (320 ms: ten of the detector's windows)
# where its recognizer's blocks are longer (an LLM's 1-2 s chunks) and either the pass scores its voice activity
# (an endpoint is then found within a step of the silence that makes it, not up to a block later) or the
# recognizer takes audio ahead of its blocks (an LLM's front end runs on what has come while an update runs).
HANDOVER_STEP_SAMPLES = 10 * VAD_WINDOW_SAMPLES


def handover_step(block: int, voiced: bool, ahead: bool) -> int | None:
    """Samples after which a connection's audio is handed over besides its recognizer's blocks of ``block``
    samples: :data:`HANDOVER_STEP_SAMPLES` where the blocks are longer and the connection is cut by voice activity
    (``voiced``) or the recognizer takes audio ahead of its blocks (``ahead``); else ``None`` (its blocks only).

    >>> handover_step(32_000, True, False), handover_step(32_000, False, True), handover_step(32_000, False, False)
    (5120, 5120, None)
    >>> handover_step(5_120, True, True) is None  # blocks no longer than the step
    True
    """
    return HANDOVER_STEP_SAMPLES if (voiced or ahead) and block > HANDOVER_STEP_SAMPLES else None


@dataclass(frozen=True)
class Segment:
    """What a result message reports: segment ``index`` of a connection, its text so far or in full (``final``).

    ``transcript``: the segment's text, tokens and their times in seconds from ``start_s``, where the segment
    starts in the connection's audio (seconds from its first sample). ``end_s``: where its audio ended, once it
    has (an endpoint, a commit: no more audio comes to it, its final text is on its way); ``None`` before.
    """

    index: int
    transcript: Transcript
    start_s: float
    final: bool
    end_s: float | None = None


@dataclass(frozen=True)
class Cut:
    """Samples ``(n,)`` float32 of one segment: for its stream, opened for them when ``opens``, finished after
    them when ``ends``. ``start``: where the segment starts, samples from the connection's first; ``end``: where
    it ends (when ``ends``)."""

    samples: np.ndarray
    segment: int
    opens: bool
    ends: bool
    start: int
    end: int | None = None


class Segmenter:
    """One connection's segments, as its audio arrives (see the module docstring).

    Args:
        vad: endpointing by voice activity; ``None``: segments end only at ``max_segment_s``, commits and the
            end of the audio.
        max_segment_s: seconds a segment lasts at most; ``None``: no limit.

    :meth:`split` takes each piece of audio in order, with its windows' speech probabilities when ``vad``
    is set (:class:`~audiomask.vad.detector.VoiceActivity`); one thread calls it (the pass that feeds the
    connection).
    """

    def __init__(self, vad: VADSettings | None, max_segment_s: float | None) -> None:
        self.vad = vad
        self.max_samples = None if max_segment_s is None else max(1, round(max_segment_s * SAMPLE_RATE))
        self._endpointer = None if vad is None else Endpointer(vad)
        self.index = 0  # the current segment, or the next one while none is open
        self._open = False  # a segment is open: samples go to it
        self._opened = False  # ... and its stream has been opened (a cut with opens went out)
        self._start = 0  # where the open segment starts
        self._position = 0  # samples of the connection seen so far
        self._held = _EMPTY  # while no segment is open (vad): the latest samples, for the next one's padding
        self._held_start = 0

    @property
    def position(self) -> int:
        """Samples of the connection seen so far."""
        return self._position

    @property
    def endpoint_due(self) -> int | None:
        """While the open segment's speech has gone quiet: the sample by which its endpoint is known if the quiet
        lasts (samples from the connection's first); ``None`` otherwise. Feeding the samples up to it then, not
        a block later, ends the segment as soon as its silence has passed."""
        if not self._open or self._endpointer is None:
            return None
        return self._endpointer.stop_due

    def split(self, samples: np.ndarray, scores: np.ndarray | None = None, *, commit: bool = False) -> list[Cut]:
        """The next ``samples`` ``(n,)`` float32, and with ``vad`` the speech probabilities of the whole windows
        they complete: the cuts, in order. ``commit``: the open segment ends after these samples (the client
        committed its audio, or ended it)."""
        start = self._position
        self._position += len(samples)
        audio, audio_start = (
            (np.concatenate((self._held, samples)), self._held_start)
            if len(self._held)
            else (
                samples,
                start,
            )
        )
        self._held = _EMPTY
        cuts: list[Cut] = []
        cursor = audio_start if not self._open else start

        def route(upto: int, ends: bool) -> None:
            nonlocal cursor
            if upto > cursor or (ends and self._opened):
                cuts.append(
                    Cut(
                        audio[cursor - audio_start : upto - audio_start],
                        self.index,
                        opens=not self._opened,
                        ends=ends,
                        start=self._start,
                        end=upto if ends else None,
                    )
                )
                self._opened = True
            cursor = upto
            if ends:
                if self._opened:
                    self.index += 1
                self._open = self._opened = False

        def begin(at: int) -> None:
            nonlocal cursor
            self._open, self._start, cursor = True, at, at

        speaking = self._endpointer is not None and self._endpointer.speaking
        if not self._open and len(samples) and (self.vad is None or speaking):
            begin(start)  # no endpointing, or speech goes on past a commit: a segment opens with these samples
        events = self._endpointer.push(scores) if self._endpointer is not None and scores is not None else []
        for event in events:
            if isinstance(event, SpeechStarted):
                if not self._open:
                    begin(max(cursor, event.sample - self.vad.prefix_padding_samples))  # type: ignore[union-attr]
            elif self._open:  # it keeps half its silence; the rest waits as the next one's padding
                route(max(min(event.sample + self.vad.silence_samples // 2, event.at), cursor), ends=True)  # type: ignore[union-attr]
        while self._open and self.max_samples is not None and self._position - self._start >= self.max_samples:
            limit = self._start + self.max_samples
            route(limit, ends=True)
            begin(limit)  # speech goes on: the next segment opens where this one ended
        if self._open:
            route(self._position, ends=commit)
        elif self.vad is not None:
            keep_from = max(cursor, self._position - self.vad.prefix_padding_samples - VAD_WINDOW_SAMPLES)
            self._held, self._held_start = audio[keep_from - audio_start :], keep_from
        return cuts

    def clear(self) -> None:
        """Drop the open segment (its stream is cancelled by the caller): the next samples start the next one."""
        if self._opened:
            self.index += 1
        self._open = self._opened = False
        self._held = _EMPTY


class TextChanges:
    """Which reports of a connection's segments are news to a client that sees only texts: each report of a
    segment's text by its stream (a CTC token said, an LLM update: changed or not) unless it is empty and
    nothing was said yet, and each segment's final text, once; not that a segment opened or that its audio
    ended."""

    def __init__(self) -> None:
        self._index, self._text = -1, ""  # the segment reported last, and its text

    def changed(self, segment: Segment) -> bool:
        """Whether ``segment`` is news (and remember it)."""
        if segment.index != self._index:
            self._index, self._text = segment.index, ""
        text = segment.transcript.text
        news = segment.final or (segment.end_s is None and (bool(text) or text != self._text))
        self._text = text
        return news


def seconds(samples: int) -> float:
    """``samples`` at 16 kHz in seconds, to the millisecond."""
    return round(samples / SAMPLE_RATE, 3)
