"""One connection's segments on the recognizer's side: a stream per segment, and what to report of each.

The engine's pass hands each due feed's samples to its :class:`Utterances`,
which cuts them into segments (:class:`~audiomask.serve.segments.Segmenter`)
and says what to feed: :meth:`Utterances.route` opens a stream where a segment
opens, gives it its samples, and finishes it where the segment ends. Reports,
for the connection to send, in order:

- a segment has opened (its text empty): where speech starts, with
  voice-activity endpointing;
- its text so far, each time its stream's tokens changed (:meth:`Utterances.sweep`,
  by the engine's ticker after encoder steps);
- its audio has ended (``end_s`` set), when it is cut;
- its final text (``final``), once its stream is done; segments end in order, so
  their finals are reported in order.

The pass, the ticker and the event loop share it: one lock guards it. No torch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from audiomask.asr.transcript import Transcript
from audiomask.serve.segments import Segment, Segmenter, seconds

__all__ = ["Stream", "Utterances"]


class Stream(Protocol):
    """What a segment's stream is to this module (a recognizer's stream, CTC or LLM)."""

    @property
    def token_count(self) -> int: ...

    @property
    def done(self) -> bool: ...

    @property
    def finished(self) -> bool: ...

    def transcript(self) -> Transcript: ...

    def cancel(self) -> None: ...


class _Open:
    """A segment whose stream is open or finishing: its stream, index and span."""

    __slots__ = ("end", "fed", "index", "last", "start", "stream", "tokens")

    def __init__(self, stream: Stream, index: int, start: int) -> None:
        self.stream, self.index, self.start = stream, index, start
        self.fed = 0  # samples fed to its stream
        self.end: int | None = None  # set once its audio has ended
        self.last = False  # ended by the end of the connection's audio: its final is the connection's
        self.tokens = 0  # its stream's token count when last reported

    def report(self, transcript: Transcript, *, final: bool = False) -> Segment:
        end_s = None if self.end is None else seconds(self.end)
        return Segment(self.index, transcript, seconds(self.start), final, end_s)


class Utterances:
    """One connection's segments and their streams (see the module docstring).

    Args:
        name: the connection's name: each stream's is ``name#k`` for its segment ``k``.
        segmenter: where the connection's segments start and end.
        first_block, block: samples of a stream's first block of audio and of each later one (the recognizer
            encodes a stream's audio in such blocks): :meth:`route` counts the whole ones it feeds.
        vad_key: the connection's stream in the engine's :class:`~audiomask.vad.detector.VoiceActivity` (with
            voice-activity endpointing), else ``None``.
    """

    def __init__(
        self, name: str, segmenter: Segmenter, first_block: int, block: int, vad_key: int | None = None
    ) -> None:
        self.name, self.segmenter, self.vad_key = name, segmenter, vad_key
        self.first_block, self.block = first_block, block
        self._lock = threading.Lock()
        self._current: _Open | None = None  # the open segment
        self._ending: deque[_Open] = deque()  # segments cut whose final text is not reported yet, in order
        self._reports: list[Segment] = []  # not taken yet, in order
        self._last: _Open | None = None  # the latest segment ended: the connection's final result

    @property
    def stream(self) -> Stream | None:
        """The open segment's stream, else the latest one's; ``None`` before the first."""
        with self._lock:
            latest = self._current or self._last
            return None if latest is None else latest.stream

    @property
    def segment_open(self) -> bool:
        """Whether a segment is open, its stream taking samples (read without the lock)."""
        return self._current is not None

    @property
    def finishing(self) -> bool:
        """Whether a segment has been cut and its final text not reported yet (read without the lock)."""
        return bool(self._ending)

    @property
    def done(self) -> bool:
        """Whether every stream opened has done (its final text is known)."""
        with self._lock:
            return all(part.stream.done for part in self._parts())

    def route(
        self,
        open_stream: Callable[[str], Stream],
        samples: np.ndarray,
        scores: np.ndarray | None,
        *,
        commit: bool,
        last: bool = False,
    ) -> tuple[list[tuple[Stream, np.ndarray]], list[Stream], int]:
        """Cut ``samples`` (with their windows' ``scores`` under voice-activity endpointing; ``commit``: the
        open segment ends after them; ``last``: so does the connection's audio, and that segment's final is
        left to :meth:`finish`) into segments: ``(pairs, finished, blocks)`` to feed, ``(stream, samples)``,
        the streams whose input ends after them, and how many whole blocks of their streams these samples
        complete. ``open_stream(name)`` opens each new segment's stream; its error is raised (the connection
        reports it)."""
        pairs: list[tuple[Stream, np.ndarray]] = []
        finished: list[Stream] = []
        blocks = 0
        with self._lock:
            for cut in self.segmenter.split(samples, scores, commit=commit or last):
                if cut.opens:
                    self._current = _Open(open_stream(f"{self.name}#{cut.segment}"), cut.segment, cut.start)
                    self._reports.append(self._current.report(Transcript()))
                current = self._current
                assert current is not None
                if len(cut.samples):
                    pairs.append((current.stream, cut.samples))
                    before = self._blocks(current.fed)
                    current.fed += len(cut.samples)
                    blocks += self._blocks(current.fed) - before
                if cut.ends:
                    current.end, current.last = cut.end, last
                    finished.append(current.stream)
                    self._ending.append(current)
                    self._last, self._current = current, None
                    self._reports.append(current.report(current.stream.transcript()))
        return pairs, finished, blocks

    def _blocks(self, samples: int) -> int:
        """Whole blocks in a stream's first ``samples``."""
        return 0 if samples < self.first_block else 1 + (samples - self.first_block) // self.block

    def sweep(self) -> bool:
        """Report the open segment's text if its tokens changed, and the finals of the segments whose stream
        is done (in order); whether there are reports to take."""
        with self._lock:
            current = self._current
            if current is not None and current.stream.token_count != current.tokens:
                current.tokens = current.stream.token_count
                self._reports.append(current.report(current.stream.transcript()))
            while self._ending and not self._ending[0].last and self._ending[0].stream.done:
                ended = self._ending.popleft()
                self._reports.append(ended.report(ended.stream.transcript(), final=True))
            return bool(self._reports)

    def take(self) -> list[Segment]:
        """The reports not taken yet, in order."""
        with self._lock:
            taken, self._reports = self._reports, []
            return taken

    def finish(self) -> list[Segment]:
        """Once every stream is done (the connection's audio has ended): the reports not taken, the finals not
        reported, and the last segment's final last of all (its text empty when no segment opened)."""
        with self._lock:
            taken, self._reports = self._reports, []
            while self._ending:
                ended = self._ending.popleft()
                taken.append(ended.report(ended.stream.transcript(), final=True))
            if not taken or not taken[-1].final:  # no segment ended with the audio: an empty one does
                start = 0 if self._last is None else self.segmenter.position
                taken.append(Segment(self.segmenter.index, Transcript(), seconds(start), True, seconds(start)))
            return taken

    def clear(self) -> None:
        """Drop the open segment: its stream is cancelled, nothing more is reported of it."""
        with self._lock:
            if self._current is not None:
                self._current.stream.cancel()
                self._current = None
            self.segmenter.clear()

    def unfinished(self) -> list[Stream]:
        """The streams whose input has not ended: the caller cancels them when the connection has gone."""
        with self._lock:
            return [part.stream for part in self._parts() if not part.stream.finished]

    def _parts(self) -> list[_Open]:
        """Called with the lock held: the segments whose stream is open or finishing."""
        return [*self._ending, *([self._current] if self._current is not None else [])]
