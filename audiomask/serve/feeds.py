"""Each connection's samples on their way to the shared recognizer: buffered by the event loop, fed by one thread.

The event loop never calls into the recognizer for a client's audio: it
appends each message's samples to the connection's :class:`Feed` (a list
append under a lock, no thread hop), and one of the engine's feeder threads,
the only callers of ``accept`` in steady state, takes every feed that is due
(:meth:`Inbox.take`), feeds each in one ``accept``, and reports back
(:meth:`Inbox.fed`), in one pass.

A feed is *due* once its samples complete the stream's next block: the
recognizer encodes a stream's audio in blocks (a first block of
``first_block`` samples, then ``block`` each, see
:func:`~audiomask.asr.planner.block_samples`), so samples short of a block
would wait in the recognizer anyway. Feeding them a block at a time costs no
latency and calls ``accept`` once per chunk of audio, however small the
client's messages. Where the recognizer's blocks are longer (an LLM's 1-2 s
chunks), a feed is also due every hand-over step
(:func:`~audiomask.serve.segments.handover_step`: 320 ms) when its connection
is cut by voice activity (the pass scores its audio, and finds an endpoint that
soon) or the recognizer takes audio ahead of its blocks (an LLM's front end
runs on it while an update runs). A feed is also due when its samples reach the sample by
which its open segment's voice-activity endpoint may be known (speech has
gone quiet: the pass says where, :attr:`Feed.endpoint_due`), so that a segment
ends as soon as its silence has passed, not a block later; when its client
waits (its buffer is full); and when its client has ended its audio (:meth:`Feed.end`): the pass
then feeds what is left and ends the stream, and the passes after it wake
the client once the stream's last chunk is encoded. So only the feeder
threads ever run encoder steps, however many connections end at once.

Backpressure: a feed is not fed while ``max_ahead`` of its blocks wait in
the recognizer (fed, not encoded yet), and once more than ``max_buffered``
samples wait in the feed, :meth:`Feed.put` waits until a pass has fed them.
So a client that sends faster than real time is paced by the encoder steps,
and a connection holds at most ``max_buffered`` samples plus one message
here, and ``max_ahead`` blocks in the recognizer.

>>> import asyncio, threading, numpy as np
>>> from audiomask.serve.segments import Segmenter
>>> async def demo():
...     inbox = Inbox(threading.Event(), first_block=4, block=2, max_buffered=8)
...     feed = inbox.open("caller-1", Utterances("caller-1", Segmenter(None, None), first_block=4, block=2))
...     await feed.put(np.zeros(3, np.float32))  # short of the first block: not due
...     first = inbox.take(cycles=0)
...     await feed.put(np.ones(2, np.float32))   # 5 samples: the first block is complete
...     second = inbox.take(cycles=0)
...     return first, [(f.name, len(samples)) for f, samples in second]
>>> asyncio.run(demo())
([], [('caller-1', 5)])
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from audiomask.checks import check_int
from audiomask.samples import as_samples
from audiomask.serve.segments import handover_step
from audiomask.serve.utterances import Stream, Utterances

__all__ = ["MAX_AHEAD_BLOCKS", "Feed", "Inbox"]

MAX_AHEAD_BLOCKS = 2  # a stream's blocks fed and not encoded: the next one is ready when a cycle ends


class Feed:
    """One connection's samples not yet fed to its streams, and its :class:`~audiomask.serve.utterances.Utterances`.

    The event loop calls :meth:`put`, :meth:`commit`, :meth:`clear`, :meth:`end` and :meth:`close`; the
    pass feeding it sets :attr:`error` and :attr:`new_blocks`. Everything both sides touch is guarded by the
    inbox's lock.
    """

    def __init__(self, inbox: Inbox, name: str, utterances: Utterances) -> None:
        self.name = name
        self.utterances = utterances  # its segments' streams, opened by the passes
        self.error: BaseException | None = None  # why the stream refused samples, or the recognizer stopped
        self.new_blocks = 0  # whole blocks of its streams' audio the pass in flight completed (set by the pass)
        self.endpoint_due: int | None = None  # samples fed by which an endpoint may be known (set by the pass)
        self._inbox = inbox
        self._pending: list[np.ndarray] = []  # (n,) float32 each, oldest first
        self._pending_samples = 0
        self._accepted = 0  # samples put so far: where the next ones start, for error messages
        self._fed = 0  # samples handed to the stream
        self._block_end = inbox.first_block  # samples fed at which the stream's next block is complete
        self._step = handover_step(inbox.block, utterances.vad_key is not None, inbox.ahead)  # due this often too
        self._step_end = self._step  # samples fed at which the next step is complete
        self._blocks_fed = 0  # whole blocks fed
        # Blocks the recognizer has encoded, at most: a stream with a block fed and not encoded is ready, so
        # every cycle encodes one of its blocks; counted from the recognizer's cycles since the last pass.
        self._blocks_encoded = 0
        self._cycles_seen: int | None = None
        self._busy = False  # a pass has taken samples and not yet fed them
        self._waiting = False  # the event loop waits for a pass (put over the bound, or end)
        self._end_asked = False  # the client has ended its audio (:meth:`end`)
        self.ending = False  # taken with its last samples: the pass that took it ends the stream
        self._commits: list[int] = []  # samples put when the client committed, oldest first, not taken yet
        self.committing = False  # taken up to a commit: the pass that took it ends the open segment
        self._clear_asked = False  # the client dropped its audio not committed (:meth:`clear`)
        self.clearing = False  # taken with a clear: the pass drops the open segment first
        self._closed = False  # the connection has ended: nothing more is fed
        self._room = asyncio.Event()  # set by the event loop once a pass has fed what waited

    def __repr__(self) -> str:
        return f"Feed({self.name!r}, pending={self._pending_samples}, fed={self._fed})"

    @property
    def stream(self) -> Stream | None:
        """The open segment's stream, else the latest one's (``None`` before a pass opened one)."""
        return self.utterances.stream

    def commit(self) -> None:
        """The client has committed its audio so far: the open segment ends after it (called on the event loop)."""
        inbox = self._inbox
        with inbox.lock:
            self._commits.append(self._accepted)
            inbox.post(self)

    def clear(self) -> None:
        """The client drops its audio not committed: the samples not fed, and the open segment (event loop)."""
        inbox = self._inbox
        with inbox.lock:
            self._pending.clear()
            self._pending_samples = 0
            self._commits.clear()
            self._clear_asked = True
            inbox.post(self)

    async def put(self, samples: np.ndarray) -> None:
        """Queue ``samples`` ``(n,)`` float32 for the stream; waits while more than ``max_buffered`` wait.

        Samples that hold NaN, Inf or absurd values are refused whole, at
        once, with :class:`~audiomask.errors.AudioError` naming the frame
        counted from the stream's start. Raises :attr:`error` once the stream
        has refused samples.
        """
        self._raise_error()
        array = as_samples(f"samples of {self.name!r}", samples, source=f"stream {self.name!r}", offset=self._accepted)
        if self.offer(array):
            await self.room()

    def offer(self, samples: np.ndarray) -> bool:
        """Queue ``samples`` ``(n,)`` float32, already checked, without waiting; whether the feed is now full.

        A caller told it is full sends no more until :meth:`room` returns.
        """
        self._accepted += len(samples)
        inbox = self._inbox
        with inbox.lock:
            self._pending.append(samples)
            self._pending_samples += len(samples)
            full = self._pending_samples > inbox.max_buffered
            if full or self._due_at(self._fed + self._pending_samples):
                inbox.post(self)
            if full:
                self._wait_for_pass()
        return full

    @property
    def holding(self) -> bool:
        """Whether the feed was full and no pass has taken its samples since (:meth:`room` waits for one)."""
        with self._inbox.lock:
            return self._waiting

    @property
    def taken(self) -> int:
        """Samples offered so far that a pass has taken (fed, or being fed)."""
        with self._inbox.lock:
            return self._accepted - self._pending_samples

    async def room(self) -> None:
        """Return once a pass has fed what a full feed held; raises :attr:`error` when the stream failed."""
        await self._room.wait()
        self._raise_error()

    async def end(self) -> None:
        """The client has ended its audio: feed every sample put so far, end the stream, and return once its
        last chunk is encoded (:attr:`stream` is then done, or ``None`` when no sample came). Raises
        :attr:`error` when the stream refused samples or the recognizer stopped."""
        inbox = self._inbox
        with inbox.lock:
            self._end_asked = True
            inbox.post(self)
            self._wait_for_pass()
        await self.room()
        if self._closed:
            raise RuntimeError(f"the connection of stream {self.name!r} ended before its final result")

    def close(self) -> bool:
        """The connection has ended: drop the samples not fed, release whoever waits on the feed (:meth:`end`
        raises); whether a pass is feeding the stream now (called on the event loop).

        When one is, it cancels the stream once it has fed it (:meth:`Inbox.fed`); otherwise
        the caller cancels :attr:`stream`, if any.
        """
        with self._inbox.lock:
            self._closed = True
            self._pending.clear()
            self._pending_samples = 0
            self._room.set()
            return self._busy

    def wake(self) -> None:
        """A pass has fed what the event loop waited for, or the stream failed (called on the event loop).

        A wake reaches the event loop some time after the pass sent it; a wait begun meanwhile (the client's
        end, after a WebSocket worker's samples filled the feed without waiting) is not released by it, but by
        the pass that answers that wait: :meth:`end` returns only once the stream has really ended.
        """
        with self._inbox.lock:
            if not self._waiting or self.error is not None:
                self._room.set()

    def _wait_for_pass(self) -> None:
        """Called with the lock held: the event loop is about to wait for the next pass over this feed."""
        self._waiting = True
        self._room.clear()

    def _due_at(self, samples: int) -> bool:
        """Called with the lock held: whether ``samples`` put complete the stream's next block or hand-over step
        (:func:`~audiomask.serve.segments.handover_step`), or reach the sample by which its open segment's endpoint
        may be known."""
        endpoint = self.endpoint_due
        return (
            samples >= self._block_end
            or (self._step_end is not None and samples >= self._step_end)
            or (endpoint is not None and samples >= endpoint)
        )

    def _ahead(self, cycles: int) -> int:
        """Called with the lock held: blocks fed and not encoded yet (at least), after ``cycles`` cycles ran;
        none while no segment is open (a segment cut finishes whatever it was fed, and no step may come
        before the next one opens)."""
        since = 0 if self._cycles_seen is None else cycles - self._cycles_seen
        self._cycles_seen = cycles
        if not self.utterances.segment_open:
            self._blocks_encoded = self._blocks_fed
        self._blocks_encoded = min(self._blocks_fed, self._blocks_encoded + since)
        return self._blocks_fed - self._blocks_encoded

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error


class Inbox:
    """The feeds of one recognizer, the set of those due, and the lock both threads share.

    Args:
        wake: set when a feed becomes due while none was: the engine's ticker starts a pass.
        first_block, block: samples of a stream's first block and of each later one.
        max_buffered: samples a feed holds before :meth:`Feed.put` waits; at least ``first_block``,
            so that a full feed is always due.
        max_ahead: blocks a stream may have been fed and not encoded yet; a due feed waits for the
            recognizer beyond that, and so does its client once its feed is full.
        ahead: the recognizer takes audio ahead of its blocks (an LLM's): feeds are due every hand-over step
            too (:func:`~audiomask.serve.segments.handover_step`).
    """

    def __init__(
        self,
        wake: threading.Event,
        first_block: int,
        block: int,
        max_buffered: int,
        max_ahead: int = MAX_AHEAD_BLOCKS,
        *,
        ahead: bool = False,
    ) -> None:
        self.first_block = check_int("first_block", first_block, minimum=1)
        self.block = check_int("block", block, minimum=1)
        self.max_buffered = check_int("max_buffered", max_buffered, minimum=first_block)
        self.max_ahead = check_int("max_ahead", max_ahead, minimum=1)
        self.ahead = bool(ahead)
        self.lock = threading.Lock()
        self._wake = wake
        self._due: dict[Feed, None] = {}  # in the order they became due
        self._ending: dict[Feed, None] = {}  # fed and ended, their streams' last chunks not all encoded

    def open(self, name: str, utterances: Utterances) -> Feed:
        """A new connection's feed, its segments cut by ``utterances`` (event loop)."""
        return Feed(self, name, utterances)

    def post(self, feed: Feed) -> None:
        """Called with the lock held: ``feed`` is due; wake the engine's ticker if no feed was."""
        if not self._due:
            self._wake.set()
        self._due[feed] = None

    def take(self, cycles: int) -> list[tuple[Feed, np.ndarray]]:
        """Every due feed that is still open and not busy, with its samples ``(n,)`` float32 in one array.

        Each is busy until :meth:`fed` hands it back (so a feed's samples are fed in order, whichever
        thread feeds them); the samples may be empty (an end with nothing left).
        """
        with self.lock:
            due, self._due = self._due, {}
            taken = []
            for feed in due:
                if feed._closed:
                    continue
                if feed._busy or feed._ahead(cycles) >= self.max_ahead:
                    # A pass in flight feeds its earlier samples, or the recognizer has not encoded what it
                    # was fed: these wait for the next pass.
                    self._due[feed] = None
                    continue
                samples = _join(feed._pending)
                feed._pending, feed._pending_samples = [], 0
                feed.committing, feed.clearing, feed._clear_asked = False, feed._clear_asked, False
                if feed._commits:  # the samples up to the first commit now, the rest in a later pass
                    upto = feed._commits.pop(0) - (feed._accepted - len(samples))
                    if upto < len(samples):
                        feed._pending, feed._pending_samples = [samples[upto:]], len(samples) - upto
                        samples = samples[:upto]
                    feed.committing = True
                    self._due[feed] = None
                feed._busy = True
                feed.ending = feed._end_asked and not feed._pending and not feed._commits
                taken.append((feed, samples))
            return taken

    def fed(self, taken: list[tuple[Feed, np.ndarray]]) -> tuple[list[Feed], list[Stream]]:
        """``taken`` has been fed (the streams of ``ending`` feeds ended), and maybe other steps ran: the feeds
        whose event loop side to wake (an ending one once its stream is done), and the streams to cancel
        (their connection closed while they were fed)."""
        woken, orphans = [], []
        with self.lock:
            for feed, samples in taken:
                feed._busy = False
                feed._fed += len(samples)
                while feed._block_end <= feed._fed:
                    feed._block_end += self.block
                while feed._step_end is not None and feed._step_end <= feed._fed:
                    feed._step_end += feed._step
                feed._blocks_fed += feed.new_blocks  # blocks its streams will encode (silence left out is not)
                feed.new_blocks = 0
                if feed._pending and feed._due_at(feed._fed + feed._pending_samples):
                    self.post(feed)  # samples put during the pass complete the next block
                if feed.ending:
                    self._ending[feed] = None
                elif feed.error is not None or (feed._waiting and not feed._end_asked):
                    feed._waiting = False  # an end asked meanwhile waits for the pass that takes it
                    woken.append(feed)
                if feed._closed:
                    orphans += feed.utterances.unfinished()
            woken += self._done()
        return woken, orphans

    def done(self) -> list[Feed]:
        """The ending feeds whose stream is done since the last look (or that failed or closed): their event loop
        side to wake. Steps carry ended streams in any pass, so the engine also looks between passes."""
        with self.lock:
            return self._done()

    def _done(self) -> list[Feed]:
        """Called with the lock held: :meth:`done`."""
        done = [f for f in self._ending if f.error is not None or f._closed or f.utterances.done]
        for feed in done:
            del self._ending[feed]
            feed._waiting = False
        return done


_EMPTY = np.zeros(0, np.float32)


def _join(pieces: list[np.ndarray]) -> np.ndarray:
    """``pieces`` in one array (the one piece itself, or an empty array)."""
    return np.concatenate(pieces) if len(pieces) > 1 else pieces[0] if pieces else _EMPTY
