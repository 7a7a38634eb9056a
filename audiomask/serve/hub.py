"""The main process's end of the WebSocket workers (``audiomask serve --ws-workers N``): their connections' streams.

Each worker connects to :class:`WorkerHub`'s Unix socket; each of its
connections becomes a :class:`~audiomask.serve.feeds.Feed` of the one
:class:`~audiomask.serve.engine.Engine`, exactly as a connection served in
this process would be, so the recognizer, its ticker and feeders, the texts,
the drain and ``/health`` work as without workers. What differs is only who
talks to the client:

- a worker's ``AUDIO`` (samples checked there, in whole blocks) goes to the
  feed without a check or a wait; the worker counts what it sent against
  what passes have taken, and when that is more than the feed holds it asks
  ``WAIT``, answered by ``RESUME`` once a pass has taken the samples;
- the engine's listener of the connection sends ``RESULTS``, ``FAILED`` and
  ``STOP`` to the worker; ``END`` finishes the stream and answers ``FINAL``;
- ``CLOSE``, or the worker's socket closing, ends and frees the streams.

The hub also sends every worker the feeds' sizes (``HELLO``, once the
recognizer is ready) and ``/health``'s answer, with ``"ws_workers"``: the
workers connected (every :data:`~audiomask.serve.wire.HEALTH_PERIOD_S`). The
server says ``ready`` once the engine is and every worker started has
connected (a worker that dies later is not waited for); until then every
worker refuses handshakes (503, ``loading``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from audiomask.serve import wire
from audiomask.serve.admission import State
from audiomask.serve.engine import Engine
from audiomask.serve.feeds import Feed
from audiomask.serve.segments import Segment

__all__ = ["WorkerHub"]

logger = logging.getLogger("audiomask.serve")


class _RemoteListener:
    """The engine's :class:`~audiomask.serve.admission.Listener` of a worker's connection: tells the worker."""

    def __init__(self, link: wire.Link, cid: int) -> None:
        self._link, self._cid = link, cid

    def results(self, segments: list[Segment]) -> None:
        self._link.send((wire.RESULTS, self._cid, segments))

    def failed(self, error: BaseException) -> None:
        self._link.send((wire.FAILED, self._cid, *wire.error_to_wire(error)))

    def stop(self) -> None:
        self._link.send((wire.STOP, self._cid))

    def endpoint_due(self, sample: int | None) -> None:
        self._link.send((wire.ENDPOINT, self._cid, sample))


class _Worker:
    """One worker's link and its connections' feeds, by the worker's connection number."""

    def __init__(self, link: wire.Link) -> None:
        self.link = link
        self.feeds: dict[int, Feed] = {}
        self.greeted = False  # HELLO sent


class WorkerHub:
    """Serves the workers' connections from ``engine`` (every method runs on the main process's event loop)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._workers: list[_Worker] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.workers_started = 0  # the server is ready once as many workers have connected
        self.workers_connected_ever = 0  # a worker that connected and died is not waited for again

    async def start(self, path: str) -> None:
        """Listen for workers on the Unix socket ``path``, and start telling them the engine's health."""
        self._server = await asyncio.start_unix_server(self._serve_worker, path)
        self._spawn(self._tell_health())

    async def stop(self) -> None:
        """Stop listening and close every worker's link."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for worker in list(self._workers):
            await worker.link.close()

    async def drain(self) -> bool:
        """Stop the workers listening and drain the engine; whether every connection finished in time."""
        self.engine.begin_drain()
        self._greet_and_tell()  # the workers refuse handshakes from now on
        for worker in self._workers:
            worker.link.send((wire.DRAIN,))
        return await self.engine.drain()

    def exit(self) -> None:
        """Tell every worker to shut down."""
        for worker in self._workers:
            worker.link.send((wire.EXIT,))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tell_health(self) -> None:
        while True:
            self._greet_and_tell()
            await asyncio.sleep(wire.HEALTH_PERIOD_S)

    def _greet_and_tell(self) -> None:
        engine = self.engine
        status, body = engine.health()
        body["ws_workers"] = len(self._workers)
        if status == 200 and self.workers_connected_ever < self.workers_started:
            status, body["status"] = 503, State.LOADING.value  # ready once every worker can take connections
        limits = engine.feed_limits
        for worker in self._workers:
            if limits is not None and not worker.greeted:
                worker.link.send((wire.HELLO, *limits))
                worker.greeted = True
            worker.link.send((wire.HEALTH, status, body))

    async def _serve_worker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        worker = _Worker(wire.Link(reader, writer))
        self._workers.append(worker)
        self.workers_connected_ever += 1
        self._greet_and_tell()
        try:
            await wire.dispatch_frames(reader, lambda message: self._dispatch(worker, message))
        finally:
            self._workers.remove(worker)
            if worker.feeds and self.engine.state is not State.DRAINING:
                logger.error("a WebSocket worker has gone: ending its %d connection(s)", len(worker.feeds))
            for feed in worker.feeds.values():
                self.engine.detach(feed)

    def _dispatch(self, worker: _Worker, message: tuple) -> None:
        kind, cid = message[0], message[1]
        if kind == wire.AUDIO:
            feed = worker.feeds.get(cid)
            if feed is not None and feed.error is None:
                feed.offer(message[2])
        elif kind == wire.WAIT:
            feed = worker.feeds.get(cid)
            if feed is not None and feed.holding:
                self._spawn(self._resume(worker.link, cid, feed))
            elif feed is not None:
                worker.link.send((wire.RESUME, cid, feed.taken))
        elif kind == wire.OPEN:
            listener = _RemoteListener(worker.link, cid)
            worker.feeds[cid] = self.engine.attach(listener, message[2], message[3])
        elif kind == wire.COMMIT and cid in worker.feeds:
            worker.feeds[cid].commit()
        elif kind == wire.CLEAR and cid in worker.feeds:
            worker.feeds[cid].clear()
        elif kind == wire.END and cid in worker.feeds:
            self._spawn(self._finish(worker.link, cid, worker.feeds[cid]))
        elif kind == wire.END:  # its stream was never opened here: the session must not wait for ever
            worker.link.send((wire.FINAL, cid, None, "runtime", "the recognizer's process has no such stream"))
        elif kind == wire.CLOSE:
            feed = worker.feeds.pop(cid, None)
            if feed is not None:
                self.engine.detach(feed)

    async def _resume(self, link: wire.Link, cid: int, feed: Feed) -> None:
        try:
            await feed.room()
        except Exception:  # noqa: BLE001 - the stream failed: the listener has told the worker
            return
        link.send((wire.RESUME, cid, feed.taken))

    async def _finish(self, link: wire.Link, cid: int, feed: Feed) -> None:
        try:
            segments = await self.engine.finish(feed)
        except Exception as error:  # noqa: BLE001 - the worker's session reports it to its client
            link.send((wire.FINAL, cid, None, *wire.error_to_wire(error)))
        else:
            link.send((wire.FINAL, cid, segments))
