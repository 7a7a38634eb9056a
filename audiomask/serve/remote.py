"""A WebSocket worker's view of the recognizer, which runs in the main process (``audiomask serve --ws-workers N``).

:class:`RemoteEngine` is what a connection's session needs of the engine
(:class:`~audiomask.serve.session.Backend`): admission, a feed per
connection, the final text, ``/health``. It speaks to the main process's
:class:`~audiomask.serve.hub.WorkerHub` over one :class:`~audiomask.serve.wire.Link`.

The samples are checked here (NaN, Inf, absurd values: the client hears at
once, as without workers) and gathered into whole blocks of the stream
before they cross to the main process, so the recognizer's process handles
one message per chunk of audio and connection, however small the client's
messages. Backpressure crosses too, exactly: this side counts the samples it
sent against those the main process's passes have taken, and once more than
the feed holds wait there, it reads no further message of that client until
the main process says a pass has taken them (``WAIT``, ``RESUME``).

The connection limit holds across the workers: each counts its connections
in its own slot of one array in shared memory, and a handshake is admitted
under the array's lock when the slots' sum is below ``--max-connections``
(the main process empties a dead worker's slot). ``/health`` is the main
process's answer (at most :data:`~audiomask.serve.wire.HEALTH_PERIOD_S` old)
with that sum.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from multiprocessing.sharedctypes import SynchronizedArray

import numpy as np

from audiomask.samples import as_samples
from audiomask.serve import wire
from audiomask.serve.admission import Listener, Refusal, State, busy_refusal, state_refusal
from audiomask.serve.segments import Segment, handover_step
from audiomask.serve.settings import Endpointing, ServeSettings

__all__ = ["RemoteEngine", "RemoteFeed"]

logger = logging.getLogger("audiomask.serve")


class RemoteFeed:
    """One connection's samples on their way to its stream in the main process, a block at a time (and a hand-over
    step at a time where it is cut by voice activity, ``voiced``, or the recognizer takes audio ahead)."""

    def __init__(self, engine: RemoteEngine, cid: int, name: str, voiced: bool = False) -> None:
        self.cid, self.name = cid, name
        self.error: BaseException | None = None  # why the stream cannot go on (told by the main process)
        self._engine = engine
        self._pending: list[np.ndarray] = []  # checked samples not sent yet, (n,) float32 each
        self._pending_samples = 0
        self._accepted = 0  # samples put so far: where the next ones start, for error messages
        self._sent = 0  # samples sent to the main process
        self._taken = 0  # ... of which its passes have taken this many, at least
        self._block_end = engine.first_block  # samples sent at which the stream's next block is complete
        # Due each hand-over step too (audiomask.serve.segments.handover_step): cut by voice activity (``voiced``),
        # or the recognizer takes audio ahead of its blocks.
        self._step = handover_step(engine.block, voiced, engine.ahead)
        self._step_end = self._step  # samples sent at which the next step is complete
        self._resume = asyncio.Event()  # clear while the client waits for a pass in the main process
        self._resume.set()
        self.final: asyncio.Future[list[Segment]] | None = None  # the last segments, once the end was sent
        self._endpoint_due: int | None = None  # samples sent by which an endpoint may be known (main process)

    async def put(self, samples: np.ndarray) -> None:
        """Check ``samples`` ``(n,)`` float32 and queue them; waits while more than the feed holds wait unfed.

        Raises :class:`~audiomask.errors.AudioError` for NaN, Inf or absurd samples (naming the
        frame counted from the stream's start), and :attr:`error` once the stream has failed.
        """
        self.raise_error()
        array = as_samples(f"samples of {self.name!r}", samples, source=f"stream {self.name!r}", offset=self._accepted)
        self._accepted += len(array)
        self._pending.append(array)
        self._pending_samples += len(array)
        if self._due():
            self.send_pending()
        if self._resume.is_set() and self._sent - self._taken > self._engine.max_buffered:
            self._resume.clear()
            self._engine.send((wire.WAIT, self.cid))
        if not self._resume.is_set():
            await self._resume.wait()
            self.raise_error()

    def send_pending(self) -> None:
        """Send every sample queued (whole blocks, and the rest once the client has ended its audio)."""
        if not self._pending_samples:
            return
        samples = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_samples = [], 0
        self._sent += len(samples)
        while self._block_end <= self._sent:
            self._block_end += self._engine.block
        while self._step_end is not None and self._step_end <= self._sent:
            self._step_end += self._step
        self._engine.send((wire.AUDIO, self.cid, samples))

    def endpoint_due(self, sample: int | None) -> None:
        """The main process says by which sample an endpoint may be known: send what reaches it now, and then."""
        self._endpoint_due = sample
        if self._due():
            self.send_pending()

    def _due(self) -> bool:
        """Whether the samples queued complete the stream's next block or hand-over step, or reach the endpoint's
        sample."""
        queued = self._sent + self._pending_samples
        endpoint = self._endpoint_due
        return (
            queued >= self._block_end
            or (self._step_end is not None and queued >= self._step_end)
            or (endpoint is not None and queued >= endpoint)
        )

    def commit(self) -> None:
        """The open segment ends after the samples put so far: they go now, then the commit."""
        self.send_pending()
        self._engine.send((wire.COMMIT, self.cid))

    def clear(self) -> None:
        """Drop the samples not sent, and, in the main process, those not fed and the open segment."""
        self._pending, self._pending_samples = [], 0
        self._engine.send((wire.CLEAR, self.cid))

    def resume(self, taken: int) -> None:
        """The main process's passes have taken ``taken`` samples: go on, or wait for the next pass."""
        self._taken = max(self._taken, taken)
        if self._sent - self._taken > self._engine.max_buffered:
            self._engine.send((wire.WAIT, self.cid))
        else:
            self._resume.set()

    def fail(self, error: BaseException) -> None:
        """The stream cannot go on: wake a wait for room, so that ``put`` raises ``error``."""
        self.error = error
        self._resume.set()

    def raise_error(self) -> None:
        """Raise :attr:`error`, if any."""
        if self.error is not None:
            raise self.error


class RemoteEngine:
    """The engine of a WebSocket worker process: the recognizer's side, in the main process.

    Args:
        settings: the server's options.
        hub_path: the Unix socket of the main process's :class:`~audiomask.serve.hub.WorkerHub`.
        connections: the connections each worker has admitted, one slot per worker, in shared memory.
        index: this worker's slot.

    Every method runs on the worker's event loop. ``on_drain`` and ``on_exit``
    (set by the worker's server) are called when the main process says so, or
    (``on_exit``) when it has gone.
    """

    def __init__(self, settings: ServeSettings, hub_path: str, connections: SynchronizedArray, index: int) -> None:
        self.settings = settings
        self.first_block = self.block = self.max_buffered = 0  # the feeds' sizes, samples: known once ready
        self.ahead = False  # ... and whether the recognizer takes audio ahead of its blocks
        self.on_drain: Callable[[], None] = lambda: None
        self.on_exit: Callable[[], None] = lambda: None
        self._hub_path = hub_path
        self._connections, self._index = connections, index
        self._status, self._body = 503, {"status": State.LOADING.value}
        self._state, self._error = State.LOADING, None
        self._feeds: dict[int, tuple[RemoteFeed, Listener]] = {}
        self._cids = itertools.count()
        self._link: wire.Link | None = None
        self._exiting = False  # the main process has said EXIT
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        """Connect to the main process and start reading what it sends."""
        reader, writer = await asyncio.open_unix_connection(self._hub_path)
        self._link = wire.Link(reader, writer)
        self._reader = asyncio.create_task(self._read(reader))

    async def stop(self) -> None:
        """Stop reading and close the connection to the main process."""
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._link is not None:
            await self._link.close()

    def send(self, message: tuple) -> None:
        """Send ``message`` to the main process (with the rest of this pass's messages)."""
        if self._link is not None:
            self._link.send(message)

    def admit(self) -> Refusal | None:
        """Count a new connection against ``--max-connections`` (all workers'), or say why it is refused."""
        refusal = state_refusal(self._state, self._error)
        if refusal is not None:
            return refusal
        with self._connections.get_lock():
            refusal = busy_refusal(sum(self._connections.get_obj()), self.settings)
            if refusal is None:
                self._connections[self._index] += 1
        return refusal

    def release(self) -> None:
        """A connection :meth:`admit` counted has ended."""
        with self._connections.get_lock():
            self._connections[self._index] -= 1

    def attach(self, listener: Listener, name: str, endpointing: Endpointing = (None, None)) -> RemoteFeed:
        """The feed of a new connection; ``listener`` hears of its segments and failure; ``endpointing``: how
        its audio is cut into segments."""
        if not self.first_block:
            raise RuntimeError("the recognizer is not ready yet: attach connections once /health says ready")
        feed = RemoteFeed(self, next(self._cids), name, voiced=endpointing[0] is not None)
        self._feeds[feed.cid] = (feed, listener)
        self.send((wire.OPEN, feed.cid, name, endpointing))
        if self._state is State.DRAINING:
            listener.stop()
        return feed

    def detach(self, feed: RemoteFeed) -> None:
        """The connection of ``feed`` has ended: the main process drops what was not fed and frees the stream."""
        if self._feeds.pop(feed.cid, None) is not None:
            self.send((wire.CLOSE, feed.cid))

    async def finish(self, feed: RemoteFeed) -> list[Segment]:
        """Send the rest of ``feed``'s samples and its end: the segments not reported yet, the last final, once
        every step it needs has run."""
        feed.raise_error()
        feed.send_pending()
        feed.final = asyncio.get_running_loop().create_future()
        self.send((wire.END, feed.cid))
        return await feed.final

    def health(self) -> tuple[int, dict[str, object]]:
        """``(HTTP status, JSON body)`` of ``/health``: the main process's, with every worker's connections."""
        return self._status, self._body | {"connections": sum(self._connections.get_obj())}

    async def _read(self, reader: asyncio.StreamReader) -> None:
        await wire.dispatch_frames(reader, self._dispatch)
        self._main_process_gone()

    def _main_process_gone(self) -> None:
        """The recognizer's process has gone: every connection fails, the worker stops."""
        self._state, self._error = State.FAILED, "the recognizer's process has stopped"
        self._status, self._body = 503, {"status": State.FAILED.value, "error": self._error}
        if not self._exiting:  # after EXIT, the main process closing the link is the plan
            logger.error("worker: %s", self._error)
        for feed, listener in list(self._feeds.values()):
            error = RuntimeError(self._error)
            feed.fail(error)
            listener.failed(error)
            if feed.final is not None and not feed.final.done():
                feed.final.set_exception(error)
        self.on_exit()

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == wire.HEALTH:
            self._status, self._body = message[1], message[2]
            self._state, self._error = State(self._body["status"]), self._body.get("error")
        elif kind == wire.HELLO:
            self.first_block, self.block, self.max_buffered, self.ahead = message[1:5]
        elif kind == wire.DRAIN:
            self.on_drain()
        elif kind == wire.EXIT:
            self._exiting = True
            self.on_exit()
        elif message[1] in self._feeds:
            self._dispatch_to_connection(kind, *self._feeds[message[1]], message[2:])

    @staticmethod
    def _dispatch_to_connection(kind: str, feed: RemoteFeed, listener: Listener, rest: tuple) -> None:
        if kind == wire.RESULTS:
            listener.results(rest[0])
        elif kind == wire.RESUME:
            feed.resume(rest[0])
        elif kind == wire.FAILED:
            error = wire.error_from_wire(*rest)
            feed.fail(error)
            listener.failed(error)
        elif kind == wire.FINAL and feed.final is not None and not feed.final.done():
            segments, *error = rest
            if segments is None:
                feed.final.set_exception(wire.error_from_wire(*error))
            else:
                feed.final.set_result(segments)
        elif kind == wire.STOP:
            listener.stop()
        elif kind == wire.ENDPOINT:
            feed.endpoint_due(rest[0])
