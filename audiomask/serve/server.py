"""Run the app on uvicorn, with a graceful stop: SIGTERM or Ctrl-C drains the connections in flight, exit 0.

uvicorn alone would close open WebSockets with code 1012 on SIGTERM. Here the
first SIGTERM or SIGINT stops listening (new connections are refused by the
operating system), finishes every stream in flight (each client gets its
final result and its protocol's last message, then close 1000), waits up to
:data:`~audiomask.serve.engine.DRAIN_TIMEOUT_S` for them, and then lets
uvicorn shut down. A second signal stops at once.

uvicorn holds a TCP connection that never finishes its HTTP request head (a
WebSocket handshake begun and left, or a connection that says nothing) for
ever, and a file descriptor with it. Here such a connection is closed once it
has waited ``--handshake-timeout-s``, and once more than
``--max-pending-handshakes`` wait, the one that has waited longest is closed
(:class:`HandshakeGuard`).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from audiomask.serve.settings import ServeSettings

if TYPE_CHECKING:  # the recognizer's modules load torch: a WebSocket worker takes uvicorn_config without them
    from audiomask.asr.recognizer import StreamingRecognizer
    from audiomask.serve.engine import Engine

__all__ = ["EXIT_STOPPED", "WS_MAX_SIZE_FACTOR", "HandshakeGuard", "run", "uvicorn_config"]

EXIT_STOPPED = 0  # stopped by SIGTERM or Ctrl-C after the connections in flight were finished
SIGNAL_EXIT_BASE = 128  # a second signal stops at once: 128 + its number, the shell's convention
# The WebSocket layer refuses messages over WS_MAX_SIZE_FACTOR * --max-message-bytes before reading them
# whole (close 1009, its own reason); messages between the two limits are read and refused by the app
# with an error naming --max-message-bytes. Memory per connection stays bounded by the larger limit.
WS_MAX_SIZE_FACTOR = 2
WS_MAX_QUEUE = 1  # messages uvicorn may queue per connection before it stops reading the socket


class HandshakeGuard:
    """One server process's connections that wait for their HTTP request head: each is closed once it has
    waited ``timeout_s`` (from its accept, or from the last response on a kept-alive connection), and the one
    that has waited longest once more than ``limit`` wait. Called on the event loop only."""

    def __init__(self, timeout_s: float, limit: int) -> None:
        self.timeout_s, self.limit = timeout_s, limit
        self._waiting: dict[asyncio.Protocol, tuple[asyncio.BaseTransport, float]] = {}  # deadline order
        self._timer: asyncio.TimerHandle | None = None

    def wait(self, protocol: asyncio.Protocol, transport: asyncio.BaseTransport) -> None:
        """``protocol``'s connection (on ``transport``) starts waiting for a request head."""
        loop = asyncio.get_running_loop()
        self._waiting.pop(protocol, None)
        self._waiting[protocol] = (transport, loop.time() + self.timeout_s)
        while len(self._waiting) > self.limit:
            self._close(next(iter(self._waiting)))
        if self._timer is None:
            self._timer = loop.call_at(self._waiting[protocol][1], self._expire)

    def done(self, protocol: asyncio.Protocol) -> None:
        """``protocol``'s connection has its request head, or has closed."""
        self._waiting.pop(protocol, None)

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        while self._waiting:
            oldest = next(iter(self._waiting))
            deadline = self._waiting[oldest][1]
            if deadline > loop.time():
                self._timer = loop.call_at(deadline, self._expire)
                return
            self._close(oldest)

    def _close(self, protocol: asyncio.Protocol) -> None:
        transport, _ = self._waiting.pop(protocol)
        transport.close()


def _guarded_http_protocol(guard: HandshakeGuard) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools', else h11's), telling ``guard`` when a connection waits for a request
    head: from its accept, and after each response on a kept-alive connection, until the head has all come
    (a request in progress, or the connection upgraded to a WebSocket) or the connection closes."""

    class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            guard.wait(self, transport)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._has_request():
                guard.done(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._has_request():
                guard.wait(self, self.transport)

        def connection_lost(self, exc: Exception | None) -> None:
            guard.done(self)
            super().connection_lost(exc)

        def _has_request(self) -> bool:
            upgraded = self.transport.get_protocol() is not self
            return upgraded or (self.cycle is not None and not self.cycle.response_complete)

    return GuardedHTTPProtocol


def uvicorn_config(app: object, settings: ServeSettings) -> uvicorn.Config:
    """The uvicorn settings of ``settings``: address, TLS, WebSocket limits, the handshakes' bounds
    (a :class:`HandshakeGuard` of this server's own); uvicorn logs warnings only."""
    guard = HandshakeGuard(settings.handshake_timeout_s, settings.max_pending_handshakes)
    return uvicorn.Config(
        app,
        http=_guarded_http_protocol(guard),
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.certfile,
        ssl_keyfile=settings.keyfile,
        ws_max_size=WS_MAX_SIZE_FACTOR * settings.max_message_bytes,
        ws_max_queue=WS_MAX_QUEUE,
        ws_per_message_deflate=False,  # audio does not compress; inflating would hide the size of what arrives
        lifespan="on",
        log_level="warning",
    )


class _DrainingServer(uvicorn.Server):
    """A uvicorn server whose first stop signal drains the engine's connections before the shutdown."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine
        self.stop_signal: int | None = None
        self.forced_by: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's own handler records the signal to raise it again after the shutdown (exit 128 + N);
        # a drained server exits 0 instead.
        if self.stop_signal is None and self._loop is not None:
            self.stop_signal = sig
            self._loop.call_soon_threadsafe(self._begin_drain)
            return
        self.forced_by = sig
        self.should_exit = self.force_exit = True

    def _begin_drain(self) -> None:
        for server in getattr(self, "servers", []):
            server.close()  # stop listening; the connections in flight go on
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        if not await self.engine.drain():
            print("audiomask serve: some connections did not finish in time; closing them", file=sys.stderr)
        self.should_exit = True


def run(
    settings: ServeSettings, recognizer: StreamingRecognizer | None = None, listener: socket.socket | None = None
) -> int:
    """Serve ``settings`` (with ``recognizer``, or one built from them) until a stop signal; the exit status.

    ``listener``: a bound TCP socket to serve on (shared with other servers); ``None``: bind ``--host``/``--port``.
    """
    from audiomask.serve.app import create_app

    app = create_app(settings, recognizer)
    server = _DrainingServer(uvicorn_config(app, settings), app.state.engine)
    server.run(sockets=None if listener is None else [listener])
    if server.forced_by is not None:
        return SIGNAL_EXIT_BASE + server.forced_by
    return EXIT_STOPPED
