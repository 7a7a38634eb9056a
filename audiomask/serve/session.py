"""One WebSocket connection, whatever its protocol: admission, audio in, text changes out, final result, errors.

A protocol (:mod:`audiomask.serve.sherpa`, :mod:`audiomask.serve.wenet`) is a
:class:`ClientProtocol`: it turns each client message into an event
(:class:`Samples`, :class:`Reply`, :data:`END`) or a :class:`ClientError`, and
formats partial results, final results and errors. Everything else is here,
once for both:

- the handshake: the token (HTTP 401) and the connection limit (HTTP 503 with
  ``Retry-After``) are checked before the connection is accepted;
- backpressure: the next message is read only after the previous one's samples
  were accepted by the recognizer, so a client that sends faster than real
  time waits, and the server holds at most one message per connection
  (uvicorn stops reading the socket until the app takes the message);
- the stream is opened with the first samples (a connection that sends nothing
  holds no encoder slot) and named after the client's address;
- the text is sent each time it changes (the engine's ticker sweeps it after
  every cycle); the final result after the client's end message, or when the
  server drains;
- a client error (a message over ``--max-message-bytes``, a malformed message,
  NaN/Inf samples, no message for ``--idle-timeout-s``) gets the protocol's
  error message, then a close frame with a code that says which (and the
  message, cut to the 123 bytes a close reason holds); its stream is ended and
  freed, and nobody else notices. So is a client that disconnects mid-stream.
"""

from __future__ import annotations

import asyncio
import hmac
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from audiomask.asr.recognizer import RecognizerStream
from audiomask.errors import AudioError
from audiomask.serve.engine import Engine, Refusal

__all__ = [
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_INVALID_DATA",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "CLOSE_TOO_BIG",
    "CLOSE_UNSUPPORTED",
    "END",
    "MAX_CLOSE_REASON_BYTES",
    "ClientError",
    "ClientProtocol",
    "End",
    "Reply",
    "Samples",
    "serve_connection",
]

# WebSocket close codes (RFC 6455, section 7.4.1).
CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED = 1003  # a kind of message the route does not take
CLOSE_INVALID_DATA = 1007  # a message the route takes, with a payload it cannot use
CLOSE_POLICY = 1008  # idle past the timeout
CLOSE_TOO_BIG = 1009  # a message over --max-message-bytes
CLOSE_INTERNAL_ERROR = 1011  # the recognizer failed
MAX_CLOSE_REASON_BYTES = 123  # a close frame's payload is at most 125 bytes, 2 of them the code
WAV_MAGIC = (b"RIFF", b"RIFX", b"RF64")  # how WAV files start: a file sent where raw samples belong


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

    @abstractmethod
    def read_text(self, text: str) -> Samples | Reply | End:
        """The event of a text message; :class:`ClientError` when the protocol has no such message."""

    @abstractmethod
    def read_bytes(self, data: bytes) -> Samples | Reply | End:
        """The event of a binary message; :class:`ClientError` when it is not audio of the route's format."""

    @abstractmethod
    def partial(self, text: str) -> str:
        """The message that reports the stream's text so far."""

    @abstractmethod
    def final(self, text: str) -> tuple[str, ...]:
        """The messages that end the connection with the stream's final text."""

    @abstractmethod
    def error(self, message: str) -> str:
        """The message that tells the client what it did wrong."""


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


async def serve_connection(websocket: WebSocket, engine: Engine, protocol: ClientProtocol) -> None:
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
    """A connection after its handshake: the engine's :class:`~audiomask.serve.engine.Listener`."""

    def __init__(self, websocket: WebSocket, engine: Engine, protocol: ClientProtocol) -> None:
        self._websocket, self._engine, self._protocol = websocket, engine, protocol
        client = websocket.client
        self._name = f"{websocket.url.path} {client.host}:{client.port}" if client else websocket.url.path
        self._stream: RecognizerStream | None = None
        self._binary_messages = 0
        self._latest = self._sent = ""  # the text the ticker last reported, and the text last sent
        self._changed = asyncio.Event()
        self._stopped = asyncio.Event()  # the server is draining

    @property
    def stream(self) -> RecognizerStream | None:
        return self._stream

    def text_changed(self, text: str) -> None:
        self._latest = text
        self._changed.set()

    def stop(self) -> None:
        self._stopped.set()

    async def run(self) -> None:
        """Read until the end message (or a drain), then send the final result; errors end it early."""
        self._engine.attach(self)
        sender = asyncio.create_task(self._send_partials())
        try:
            try:
                await self._read_audio()
                await _cancel(sender)
                text = await self._finish()
            except ClientError as error:
                await _cancel(sender)
                await self._websocket.send_text(self._protocol.error(str(error)))
                await self._websocket.close(error.code, _close_reason(str(error)))
                return
            for message in self._protocol.final(text):
                await self._websocket.send_text(message)
            await self._websocket.close(CLOSE_NORMAL)
        except (_DisconnectedError, WebSocketDisconnect):
            pass
        finally:
            await _cancel(sender)
            await self._end_stream()
            self._engine.detach(self)

    async def _read_audio(self) -> None:
        """Feed the stream each message's samples, one message at a time, until the end message or a drain."""
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

    async def _next_message(self) -> dict | None:
        """The client's next message; ``None`` when the server drains; :class:`ClientError` when idle too long."""
        if self._stopped.is_set():
            return None
        receive = asyncio.ensure_future(self._websocket.receive())
        stopped = asyncio.ensure_future(self._stopped.wait())
        idle_s = self._engine.settings.idle_timeout_s
        done, _ = await asyncio.wait({receive, stopped}, timeout=idle_s, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if receive in done:
            message = receive.result()
            if message["type"] == "websocket.disconnect":
                raise _DisconnectedError
            return message
        receive.cancel()
        if stopped in done:
            return None
        raise ClientError(f"no message for {idle_s:g} s (--idle-timeout-s): closing an idle connection", CLOSE_POLICY)

    def _event(self, message: dict) -> Samples | Reply | End:
        """The protocol's event of a WebSocket message, after the checks every route shares."""
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
        try:
            await self._engine.call(self._accept_now, samples)
        except AudioError as error:
            raise ClientError(f"{error}{self._protocol.bad_samples_hint}") from None
        except ValueError as error:  # after the recognizer's idle timeout ended the stream
            raise ClientError(str(error), CLOSE_POLICY) from None
        except RuntimeError as error:  # the recognizer stopped after an error in an encoder step
            raise ClientError(f"the server cannot continue this stream: {error}", CLOSE_INTERNAL_ERROR) from None
        self._engine.nudge()

    def _accept_now(self, samples: np.ndarray) -> None:
        """Open the stream with its first samples, then accept them (a pool thread)."""
        if self._stream is None:
            self._stream = self._engine.recognizer.open_stream(self._name)
        self._stream.accept(samples)

    async def _finish(self) -> str:
        """The stream's final text (``""`` when no samples came); waits for the steps its last chunks need."""
        if self._stream is None:
            return ""
        try:
            return await self._engine.call(self._stream.finish, None)
        except RuntimeError as error:
            raise ClientError(f"the server cannot finish this stream: {error}", CLOSE_INTERNAL_ERROR) from None

    async def _end_stream(self) -> None:
        """End an unfinished stream (an error, a disconnect): its slot is freed and it holds nobody's steps."""
        stream = self._stream
        if stream is None or stream.finished:
            return
        try:
            await self._engine.call(stream.input_finished)
        except RuntimeError:  # the recognizer stopped, or the pool was shut down: nothing left to free
            pass

    async def _send_partials(self) -> None:
        """Send the text each time the ticker reports a change (the latest text when several came at once)."""
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                if self._latest != self._sent:
                    self._sent = self._latest
                    await self._websocket.send_text(self._protocol.partial(self._sent))
        except WebSocketDisconnect:
            pass


async def _cancel(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait until it has stopped."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
