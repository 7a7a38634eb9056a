"""One WebSocket connection, whatever its protocol: admission, audio in, results out, final result, errors.

A protocol (:mod:`audiomask.serve.sherpa`, :mod:`audiomask.serve.wenet`,
:mod:`audiomask.serve.realtime`) is a :class:`ClientProtocol`: it turns each
client message into an event (:class:`Samples`, :class:`Reply`,
:class:`Commit`, :class:`Clear`, :data:`END`) or a :class:`ClientError`, says
how the connection's audio is cut into segments, and formats what to tell
the client of each segment's progress, final results and errors. Everything
else is here, once for all:

- the handshake: the token (HTTP 401) and the connection limit (HTTP 503 with
  ``Retry-After``) are checked before the connection is accepted;
- audio: each message's samples are checked (NaN, Inf and absurd values are
  refused at once) and appended to the connection's
  :class:`~audiomask.serve.feeds.Feed`, on the event loop; the engine's feeder
  threads feed them to the stream a block at a time;
- backpressure: a feed is not fed while two of its blocks wait in the
  recognizer, and once more than two blocks of samples wait in the feed, the
  next message is read only after a feeder has fed them, so a client that
  sends faster than real time waits for the encoder steps (uvicorn stops
  reading its socket and TCP slows it), and the server holds at most two
  blocks and one message per connection;
- the connection is attached to the engine with its first audio (or commit),
  cut into segments as its protocol says then (:mod:`audiomask.serve.segments`);
  a segment's stream is opened with its first samples (a connection that
  sends less holds no encoder slot) and named after the client's address;
- what the engine reports of the segments (one opened, its text each time it
  changed, its audio ended, its final text) is handed to the protocol in order,
  and its messages sent; a client's commit ends the open segment where the
  client committed; the final result after the client's end message (every
  sample is fed first, and every segment ended before is reported), or when
  the server drains;
- a client error (a message over ``--max-message-bytes``, a malformed message,
  NaN/Inf samples, no message for ``--idle-timeout-s``, messages faster than
  ``--max-messages-per-s``) gets the protocol's
  error message, then a close frame with a code that says which (and the
  message, cut to the 123 bytes a close reason holds); its stream is ended and
  freed, and nobody else notices. So is a client that disconnects mid-stream.
"""

from __future__ import annotations

import asyncio
import hmac
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from audiomask.asr.transcript import Transcript
from audiomask.errors import AudioError
from audiomask.serve.admission import Listener, Refusal
from audiomask.serve.segments import Segment
from audiomask.serve.settings import Endpointing, ServeSettings

__all__ = [
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_INVALID_DATA",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "CLOSE_TOO_BIG",
    "CLOSE_UNSUPPORTED",
    "END",
    "Clear",
    "Commit",
    "MAX_CLOSE_REASON_BYTES",
    "ClientError",
    "ClientProtocol",
    "End",
    "AudioFeed",
    "Backend",
    "Reply",
    "Samples",
    "serve_connection",
]

# WebSocket close codes (RFC 6455, section 7.4.1).
CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED = 1003  # a kind of message the route does not take
CLOSE_INVALID_DATA = 1007  # a message the route takes, with a payload it cannot use
CLOSE_POLICY = 1008  # idle past the timeout, messages over the rate
CLOSE_TOO_BIG = 1009  # a message over --max-message-bytes
CLOSE_INTERNAL_ERROR = 1011  # the recognizer failed
MAX_CLOSE_REASON_BYTES = 123  # a close frame's payload is at most 125 bytes, 2 of them the code
WAV_MAGIC = (b"RIFF", b"RIFX", b"RF64")  # how WAV files start: a file sent where raw samples belong
MESSAGE_BURST_S = 1.0  # a connection's message allowance holds this many seconds of --max-messages-per-s


class ClientError(Exception):
    """What the client did wrong (``message``, sent to it) and the close ``code`` that ends its connection."""

    def __init__(self, message: str, code: int = CLOSE_INVALID_DATA) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Samples:
    """Audio from the client: ``samples`` ``(n,)`` float32 at 16 kHz, full scale +-1."""

    samples: np.ndarray


@dataclass(frozen=True)
class Reply:
    """Text messages to send back at once (a protocol's acknowledgement)."""

    messages: tuple[str, ...]


@dataclass(frozen=True)
class Commit:
    """The client has committed its audio: the open segment ends after it and ``samples`` ``(n,)`` float32
    (what the protocol still held of it)."""

    samples: np.ndarray


@dataclass(frozen=True)
class Clear:
    """The client drops its audio not committed (the open segment); ``messages`` go back at once."""

    messages: tuple[str, ...]


class End:
    """The client has sent all its audio: finish the stream and send the final result."""

    def __repr__(self) -> str:
        return "END"


END = End()


class ClientProtocol(ABC):
    """A WebSocket ASR protocol: one instance per connection (it may keep the connection's protocol state)."""

    #: How the route's binary messages hold audio, for error messages.
    sample_format: str
    #: What to tell a client whose samples hold NaN, Inf or absurd values.
    bad_samples_hint: str = ""

    def greeting(self) -> tuple[str, ...]:
        """The messages sent once the connection is accepted, before anything else."""
        return ()

    def endpointing(self, settings: ServeSettings) -> Endpointing:
        """How the connection's audio is cut into segments (:class:`~audiomask.serve.segments.Segmenter`),
        asked when its first audio comes: by default, one segment (until a commit)."""
        return None, None

    @abstractmethod
    def read_text(self, text: str) -> Samples | Reply | End | Commit | Clear:
        """The event of a text message; :class:`ClientError` when the protocol has no such message."""

    @abstractmethod
    def read_bytes(self, data: bytes) -> Samples | Reply | End | Commit | Clear:
        """The event of a binary message; :class:`ClientError` when it is not audio of the route's format."""

    @abstractmethod
    def result(self, segment: Segment) -> tuple[str, ...]:
        """The messages that report a segment's progress (:class:`~audiomask.serve.segments.Segment`: opened,
        its text so far, its audio ended, or its final text), in the order the engine reported them; none
        when the protocol has nothing to say of it."""

    @abstractmethod
    def final(self, segment: Segment) -> tuple[str, ...]:
        """The messages that end the connection with its last segment."""

    @abstractmethod
    def error(self, message: str) -> str:
        """The message that tells the client what it did wrong."""


class AudioFeed(Protocol):
    """Where a connection's samples go: :class:`~audiomask.serve.feeds.Feed` (the recognizer in this process)
    or :class:`~audiomask.serve.remote.RemoteFeed` (in the main process, from a WebSocket worker)."""

    async def put(self, samples: np.ndarray) -> None:
        """Queue ``samples`` ``(n,)`` float32 for the stream (checked here); waits while the feed is full."""

    def commit(self) -> None:
        """The open segment ends after the samples put so far."""

    def clear(self) -> None:
        """Drop the samples not fed and the open segment."""


class Backend(Protocol):
    """What a connection needs of the recognizer's side: :class:`~audiomask.serve.engine.Engine` (the
    recognizer in this process) or :class:`~audiomask.serve.remote.RemoteEngine` (in the main process)."""

    settings: ServeSettings

    def admit(self) -> Refusal | None:
        """Count a new connection, or say why it is refused."""

    def release(self) -> None:
        """A connection :meth:`admit` counted has ended."""

    def attach(self, listener: Listener, name: str, endpointing: Endpointing = (None, None)) -> AudioFeed:
        """The feed of a new connection, whose segments and failure ``listener`` hears of; ``endpointing``:
        how its audio is cut into segments."""

    def detach(self, feed: AudioFeed) -> None:
        """The connection of ``feed`` has ended: drop what was not fed, end and free its stream (returns at once)."""

    async def finish(self, feed: AudioFeed) -> list[Segment]:
        """Feed the rest of ``feed``'s samples and finish its stream: the segments not yet reported, the last
        one final."""


def _close_reason(message: str) -> str:
    """``message`` cut to what a close frame's reason holds (UTF-8, at a character boundary)."""
    encoded = message.encode()
    if len(encoded) <= MAX_CLOSE_REASON_BYTES:
        return message
    return encoded[: MAX_CLOSE_REASON_BYTES - 3].decode(errors="ignore") + "..."


def _token_refusal(websocket: WebSocket, token: str | None) -> Refusal | None:
    """HTTP 401 unless the handshake carries ``token`` (``Authorization: Bearer`` or ``?token=``)."""
    if token is None:
        return None
    scheme, _, given = websocket.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        given = websocket.query_params.get("token", "")
    if not given:
        return Refusal(401, "a token is required: send 'Authorization: Bearer TOKEN' or add '?token=TOKEN'")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return Refusal(401, "wrong token")
    return None


async def serve_connection(websocket: WebSocket, engine: Backend, protocol: ClientProtocol) -> None:
    """Serve one WebSocket handshake on ``protocol``: refuse it (HTTP 401 / 503) or run its session to the end."""
    refusal = _token_refusal(websocket, engine.settings.token) or engine.admit()
    if refusal is not None:
        headers = {} if refusal.retry_after_s is None else {"Retry-After": str(refusal.retry_after_s)}
        if refusal.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="audiomask"'
        await websocket.send_denial_response(PlainTextResponse(refusal.message, refusal.status, headers))
        return
    try:
        await websocket.accept()
        await _Session(websocket, engine, protocol).run()
    finally:
        engine.release()


class _DisconnectedError(Exception):
    """The client disconnected."""


class _Session:
    """A connection after its handshake: the engine's :class:`~audiomask.serve.admission.Listener`."""

    def __init__(self, websocket: WebSocket, engine: Backend, protocol: ClientProtocol) -> None:
        self._websocket, self._engine, self._protocol = websocket, engine, protocol
        client = websocket.client
        self._name = f"{websocket.url.path} {client.host}:{client.port}" if client else websocket.url.path
        self._feed: AudioFeed | None = None
        self._binary_messages = 0
        self._outbox: deque[Segment] = deque()  # segment reports not handed to the protocol yet, in order
        self._audio_ended = False  # the client's audio has ended: results go out with the final one
        self._changed = asyncio.Event()
        self._stopped = False  # the server is draining
        self._error: BaseException | None = None  # why the stream cannot go on
        self._task: asyncio.Task | None = None  # the task that reads the client's messages
        self._receiving = False  # that task waits for the client's next message ...
        self._receiving_since = 0.0  # ... since this time (the event loop's clock)
        self._interrupted = False  # ... and was cancelled to stop waiting
        self._idle = False  # ... because it waited --idle-timeout-s
        self._idle_timer: asyncio.TimerHandle | None = None
        # A token bucket of messages: it fills at --max-messages-per-s up to MESSAGE_BURST_S of them (one at least).
        self._allowance_max = self._allowance = max(1.0, engine.settings.max_messages_per_s * MESSAGE_BURST_S)
        self._allowance_at = asyncio.get_running_loop().time()

    def results(self, segments: list[Segment]) -> None:
        outbox = self._outbox
        for segment in segments:
            last = outbox[-1] if outbox else None
            if (
                last is not None
                and last.index == segment.index
                and not last.final
                and not segment.final
                and (last.end_s is None) == (segment.end_s is None)
            ):
                outbox[-1] = segment  # a newer text of the same segment: the latest is enough
            else:
                outbox.append(segment)
        self._changed.set()

    def failed(self, error: BaseException) -> None:
        self._error = error
        self._interrupt()

    def stop(self) -> None:
        self._stopped = True
        self._interrupt()

    def endpoint_due(self, sample: int | None) -> None:
        pass  # the feed of this process reads it itself (:attr:`~audiomask.serve.feeds.Feed.endpoint_due`)

    def _watch_idle(self) -> None:
        """Interrupt a wait for the client's message once it has lasted ``idle_timeout_s``; else check again
        when it would have (one timer per connection, not one per message)."""
        loop = asyncio.get_running_loop()
        idle_s = self._engine.settings.idle_timeout_s
        if self._receiving and loop.time() - self._receiving_since >= idle_s:
            self._idle = True
            self._interrupt()
            return
        since = self._receiving_since if self._receiving else loop.time()
        self._idle_timer = loop.call_at(since + idle_s, self._watch_idle)

    def _interrupt(self) -> None:
        """Stop waiting for the client's next message (it may never come): the session has to move on."""
        if self._receiving and not self._interrupted and self._task is not None:
            self._interrupted = True
            self._task.cancel()

    async def run(self) -> None:
        """Read until the end message (or a drain), then send the final result; errors end it early."""
        self._task = asyncio.current_task()
        for message in self._protocol.greeting():
            await self._websocket.send_text(message)
        sender = asyncio.create_task(self._send_results())
        self._watch_idle()
        try:
            try:
                await self._read_audio()
                self._audio_ended = True  # the sender sends what it holds and returns
                self._changed.set()
                await asyncio.gather(sender, return_exceptions=True)
                *ended, last = await self._finish()
            except ClientError as error:
                await _cancel(sender)
                await self._websocket.send_text(self._protocol.error(str(error)))
                await self._websocket.close(error.code, _close_reason(str(error)))
                return
            self._outbox.extend(ended)  # after the reports that came while the streams finished
            await self._send_outbox()
            for message in self._protocol.final(last):
                await self._websocket.send_text(message)
            await self._websocket.close(CLOSE_NORMAL)
        except (_DisconnectedError, WebSocketDisconnect):
            pass
        finally:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            await _cancel(sender)
            if self._feed is not None:
                self._engine.detach(self._feed)

    def _attached(self) -> AudioFeed:
        """The connection's feed, attached to the engine with its first audio, cut as its protocol says then."""
        if self._feed is None:
            endpointing = self._protocol.endpointing(self._engine.settings)
            self._feed = self._engine.attach(self, self._name, endpointing)
        return self._feed

    async def _read_audio(self) -> None:
        """Queue each message's samples for the stream, until the end message or a drain."""
        while True:
            message = await self._next_message()
            if message is None:
                return
            event = self._event(message)
            if event is END:
                return
            if isinstance(event, Reply):
                for reply in event.messages:
                    await self._websocket.send_text(reply)
            elif isinstance(event, Samples) and len(event.samples):
                await self._accept(event.samples)
            elif isinstance(event, Commit):
                if len(event.samples):
                    await self._accept(event.samples)
                self._attached().commit()
            elif isinstance(event, Clear):
                if self._feed is not None:
                    self._feed.clear()
                for reply in event.messages:
                    await self._websocket.send_text(reply)

    async def _next_message(self) -> dict | None:
        """The client's next message; ``None`` when the server drains; :class:`ClientError` when idle too
        long or when the stream has failed."""
        if not self._stopped and self._error is None:
            self._receiving, self._receiving_since = True, asyncio.get_running_loop().time()
            try:
                message = await self._websocket.receive()
            except asyncio.CancelledError:
                # Cancelled by _interrupt, or by someone else as well (the server stopping): theirs goes on.
                if not self._interrupted or self._task.uncancel() > 0:  # type: ignore[union-attr]
                    raise
            else:
                if message["type"] == "websocket.disconnect":
                    raise _DisconnectedError
                return message
            finally:
                self._receiving = False
        if self._idle:
            idle_s = self._engine.settings.idle_timeout_s
            raise ClientError(
                f"no message for {idle_s:g} s (--idle-timeout-s): closing an idle connection", CLOSE_POLICY
            )
        if self._error is not None:
            raise self._client_error(self._error)
        return None

    def _take_allowance(self) -> None:
        """Count a message against ``--max-messages-per-s``: :class:`ClientError` (1008) once the bucket is empty."""
        rate = self._engine.settings.max_messages_per_s
        now = asyncio.get_running_loop().time()
        self._allowance = min(self._allowance_max, self._allowance + (now - self._allowance_at) * rate)
        self._allowance_at = now
        if self._allowance < 1:
            raise ClientError(
                f"more than {rate:g} messages a second (--max-messages-per-s): send the audio in fewer, "
                "larger messages",
                CLOSE_POLICY,
            )
        self._allowance -= 1

    def _event(self, message: dict) -> Samples | Reply | End:
        """The protocol's event of a WebSocket message, after the checks every route shares."""
        self._take_allowance()
        data, text = message.get("bytes"), message.get("text")
        size = len(data) if data is not None else len((text or "").encode())
        limit = self._engine.settings.max_message_bytes
        kind = "binary" if data is not None else "text"
        if size > limit:
            raise ClientError(
                f"a {kind} message of {size} bytes is over the limit of {limit} bytes (--max-message-bytes): "
                "send the audio in smaller messages",
                CLOSE_TOO_BIG,
            )
        if data is None:
            return self._protocol.read_text(text or "")
        self._binary_messages += 1
        if self._binary_messages == 1 and data[:4] in WAV_MAGIC:
            raise ClientError(
                f"the first binary message starts with a WAV file header ({data[:4].decode()!r}): send the "
                f"samples, not the file; this route takes {self._protocol.sample_format}"
            )
        return self._protocol.read_bytes(data)

    async def _accept(self, samples: np.ndarray) -> None:
        """Queue ``samples`` for the stream; waits while the feed is full."""
        feed = self._attached()
        try:
            await feed.put(samples)
        except Exception as error:  # noqa: BLE001 - each is the client's error or the server's, reported to it
            raise self._client_error(error) from None

    async def _finish(self) -> list[Segment]:
        """The segments not yet reported, the last final (its text empty when no samples came); waits for the
        steps their last chunks need."""
        if self._feed is None:
            return [Segment(0, Transcript(), 0.0, True, 0.0)]
        try:
            return await self._engine.finish(self._feed)
        except Exception as error:  # noqa: BLE001 - as in _accept
            raise self._client_error(error, finishing=True) from None

    def _client_error(self, error: BaseException, *, finishing: bool = False) -> ClientError:
        """The error that ends the connection when the stream refused samples or cannot go on."""
        if isinstance(error, AudioError):
            return ClientError(f"{error}{self._protocol.bad_samples_hint}")
        if isinstance(error, ValueError):  # a stream ended under it
            return ClientError(str(error), CLOSE_POLICY)
        doing = "finish" if finishing else "continue"
        return ClientError(f"the server cannot {doing} this stream: {error}", CLOSE_INTERNAL_ERROR)

    async def _send_results(self) -> None:
        """Send what the engine reports of the segments, as it comes (the latest text of a segment when several
        came at once); returns once the client's audio has ended."""
        try:
            while not self._audio_ended:
                await self._changed.wait()
                self._changed.clear()
                await self._send_outbox()
        except WebSocketDisconnect:
            pass

    async def _send_outbox(self) -> None:
        """Hand the reports not sent yet to the protocol, in order, and send its messages."""
        while self._outbox:
            for message in self._protocol.result(self._outbox.popleft()):
                await self._websocket.send_text(message)


async def _cancel(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait until it has stopped."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
