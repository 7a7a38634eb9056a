"""Stream audio to an ``audiomask serve`` (or any sherpa-onnx / WeNet / OpenAI Realtime server) and collect the text.

:func:`stream_audio` sends 16 kHz float32 samples in messages of
``message_samples``, as fast as the server takes them (it reads a message
only after the previous one's samples were accepted) or at real time, and
returns a :class:`StreamResult`: the final text, every partial text with the
time it arrived, and the time each message was sent (``time.perf_counter``
seconds), from which a benchmark computes its latencies. Over ``"sherpa"``
the samples travel as float32, over ``"wenet"`` as int16 PCM (samples are
rounded to the nearest of 65536 levels; those read from 16-bit files travel
exactly), over ``"realtime"`` as OpenAI's Realtime API has them: resampled
to 24 kHz, base64 PCM16 in ``input_audio_buffer.append`` events, under server
VAD (each item a segment), committed at the end.

>>> import asyncio, numpy as np
>>> result = asyncio.run(stream_audio("ws://127.0.0.1:6006/", np.zeros(16000, np.float32)))  # doctest: +SKIP
>>> result.text, len(result.sent_at)  # doctest: +SKIP
('', 10)
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass, field

import numpy as np
import pybase64
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from audiomask.checks import check_int
from audiomask.constants import SAMPLE_RATE
from audiomask.resample import Resampler

__all__ = [
    "DEFAULT_MESSAGE_SAMPLES",
    "PROTOCOLS",
    "REALTIME_RATE",
    "ServerError",
    "StreamResult",
    "heard_over_realtime",
    "stream_audio",
    "to_realtime_rate",
]

PROTOCOLS = ("sherpa", "wenet", "realtime")
DEFAULT_MESSAGE_SAMPLES = SAMPLE_RATE // 10  # 100 ms a message, as sherpa-onnx's file client sends
INT16_FULL_SCALE = 32768
INT16_MIN, INT16_MAX = -INT16_FULL_SCALE, INT16_FULL_SCALE - 1
WENET_START = {"signal": "start", "nbest": 1, "continuous_decoding": False}
WENET_END = {"signal": "end"}
SHERPA_DONE, SHERPA_DONE_REPLY = "Done", "Done!"
REALTIME_RATE = 24_000  # Hz: OpenAI's audio/pcm
REALTIME_SESSION = {
    "type": "session.update",
    "session": {"type": "transcription", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
}
REALTIME_COMMIT = {"type": "input_audio_buffer.commit"}
MS_PER_S = 1000


class ServerError(Exception):
    """The server reported an error (its message), or closed the connection before the final result."""


@dataclass
class StreamResult:
    """What a server sent for one stream.

    Attributes:
        text: the final text: every segment's, joined (the text of the whole stream).
        partials: ``(arrival time, text)`` of each result before the final one, in order; the text is the
            stream's so far (the segments ended before it, then its own).
        partial_token_s: for each partial, where its newest token starts in the stream, seconds (the
            segment's ``start_time`` plus its last ``timestamps``): the chunk that produced it; ``None``
            without token times (the WeNet route) or tokens.
        partial_segments: for each partial, ``(segment, start s, ends it)``: which of the stream's segments it
            reports (sherpa-onnx's ``segment``; over realtime, its item's place in order of first result), where
            that segment starts in the stream, seconds (sherpa-onnx's ``start_time``; realtime's
            ``audio_start_ms`` of its item's ``speech_started``; ``None`` where the server says nothing of it),
            and whether it is that segment's final text (an endpoint's); ``None`` on the WeNet route.
        segments: the text of each segment that ended before the final result (sherpa-onnx's endpoints).
        sent_at: the time each binary message had been handed to the socket.
        done_at: when the end message was sent; ``final_at``: when the final result arrived.
    """

    text: str = ""
    partials: list[tuple[float, str]] = field(default_factory=list)
    partial_token_s: list[float | None] = field(default_factory=list)
    partial_segments: list[tuple[int, float | None, bool] | None] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)
    done_at: float = 0.0
    final_at: float = 0.0


def to_realtime_rate(samples: np.ndarray) -> np.ndarray:
    """``samples`` ``(n,)`` float32 at 16 kHz as this client sends them over realtime: ``(ceil(1.5 n),)`` float32
    at 24 kHz. A client of many connections converts each clip once and passes ``sample_rate=REALTIME_RATE`` to
    :func:`stream_audio`: a conversion is one float64 matrix product over the clip, which numpy's BLAS threads
    share out over every core and then spin on."""
    resampler = Resampler(SAMPLE_RATE, REALTIME_RATE)
    return np.concatenate((resampler.push(samples), resampler.flush()))


def _pcm16(samples: np.ndarray) -> np.ndarray:
    """``samples`` rounded to the nearest of int16 PCM's 65536 levels, as int16."""
    return np.clip(np.rint(samples * np.float32(INT16_FULL_SCALE)), INT16_MIN, INT16_MAX).astype("<i2")


def heard_over_realtime(samples: np.ndarray) -> np.ndarray:
    """What a server hears of ``samples`` ``(n,)`` float32 at 16 kHz streamed over realtime by this client:
    resampled to 24 kHz, rounded to int16 PCM, resampled to 16 kHz (as the server does, to float32 rounding)."""
    pcm = _pcm16(to_realtime_rate(samples)).astype(np.float32) / np.float32(INT16_FULL_SCALE)
    resampler = Resampler(REALTIME_RATE, SAMPLE_RATE)
    return np.concatenate((resampler.push(pcm), resampler.flush()))


def _payload(samples: np.ndarray, protocol: str) -> np.ndarray:
    """What the messages of ``protocol`` carry of ``samples`` ``(n,)`` float32: float32 LE (sherpa) or int16 LE PCM
    (wenet, realtime: samples already at 24 kHz), converted once for the whole stream."""
    return np.ascontiguousarray(samples, "<f4") if protocol == "sherpa" else _pcm16(samples)


def _encode(piece: np.ndarray, protocol: str) -> bytes | str:
    """The message of ``piece`` (a slice of :func:`_payload`): its bytes, or for realtime an append event of them in
    base64 (whose characters JSON writes as they are)."""
    if protocol == "realtime":
        return '{"type": "input_audio_buffer.append", "audio": "' + pybase64.b64encode(piece.tobytes()).decode() + '"}'
    return piece.tobytes()


# What _Reader.parse makes of a message: kind, text, newest token's start s, (segment, its start s).
Parsed = tuple[str, str | None, float | None, tuple[int, float | None] | None]


class _Reader:
    """``(kind, text, newest token's start s, (segment, its start s))`` of each server message: kind ``partial``,
    ``segment`` (a segment ended), ``final``, ``end`` or ``other``; the token time where the message carries token
    times; the segment it reports where the protocol says (:attr:`StreamResult.partial_segments`). A realtime
    reader keeps each item's text (its deltas joined), its place and start, and knows the last item once the
    client has committed."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.committed = False  # realtime: the client has committed its audio
        self._item_texts: dict[str, str] = {}
        self._item_starts: dict[str, tuple[int, float | None]] = {}  # realtime: each item's place and start s
        self._last_item: str | None = None  # realtime: the first item committed after the client's commit

    def parse(self, message: str | bytes) -> Parsed:
        if self.protocol == "realtime":
            return self._realtime(json.loads(message))
        if self.protocol == "sherpa":
            if message == SHERPA_DONE_REPLY:
                return "end", None, None, None
            result = json.loads(message)
            if "error" in result:
                raise ServerError(result["error"])
            kind = "final" if result["is_eof"] else "segment" if result["is_final"] else "partial"
            times = result.get("timestamps")
            newest = result.get("start_time", 0.0) + times[-1] if times else None
            return kind, result["text"], newest, (result.get("segment", 0), result.get("start_time"))
        result = json.loads(message)
        if result.get("status") == "failed":
            raise ServerError(result["message"])
        kind = {"partial_result": "partial", "final_result": "final", "speech_end": "end"}.get(result["type"], "other")
        text = json.loads(result["nbest"])[0]["sentence"] if "nbest" in result else None
        return kind, text, None, None

    def _realtime(self, event: dict) -> Parsed:
        kind = event.get("type")
        if kind == "error":
            raise ServerError(event["error"]["message"])
        if kind == "input_audio_buffer.speech_started":
            self._item(event["item_id"], event["audio_start_ms"] / MS_PER_S)
        elif kind == "conversation.item.input_audio_transcription.delta":
            text = self._item_texts[event["item_id"]] = self._item_texts.get(event["item_id"], "") + event["delta"]
            return "partial", text, None, self._item(event["item_id"])
        elif kind == "input_audio_buffer.committed" and self.committed and self._last_item is None:
            self._last_item = event["item_id"]
        elif kind == "conversation.item.input_audio_transcription.completed":
            place = self._item(event["item_id"])
            if event["item_id"] == self._last_item:  # the last (a later one could only be empty)
                return "final", event["transcript"], None, place
            return "segment", event["transcript"], None, place
        return "other", None, None, None

    def _item(self, item_id: str, start_s: float | None = None) -> tuple[int, float | None]:
        """Item ``item_id``'s place (in order of first mention) and start, seconds (once ``speech_started`` said)."""
        place, known = self._item_starts.get(item_id, (len(self._item_starts), None))
        self._item_starts[item_id] = place, known if start_s is None else start_s
        return self._item_starts[item_id]


async def _receive(connection: ClientConnection, reader: _Reader, result: StreamResult) -> None:
    """Collect partials and the final result until the protocol's last message."""
    try:
        async for message in connection:
            kind, text, newest_s, segment = reader.parse(message)
            before = "".join(result.segments)
            if kind in ("partial", "segment"):
                result.partials.append((time.perf_counter(), before + text))
                result.partial_token_s.append(newest_s)
                result.partial_segments.append(None if segment is None else (*segment, kind == "segment"))
            if kind == "segment":
                result.segments.append(text)
            elif kind == "final":
                result.text, result.final_at = before + text, time.perf_counter()
                if reader.protocol == "realtime":  # the connection stays open: the client is done
                    return
            elif kind == "end":
                return
    except ConnectionClosed:  # closed with an error code: said below
        pass
    raise ServerError(
        f"the server closed the connection before its last message (code {connection.close_code}: "
        f"{connection.close_reason})"
    )


async def stream_audio(
    url: str,
    samples: np.ndarray,
    *,
    protocol: str = "sherpa",
    message_samples: int = DEFAULT_MESSAGE_SAMPLES,
    realtime: bool = False,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    timeout_s: float = 60.0,
    sample_rate: int = SAMPLE_RATE,
) -> StreamResult:
    """Stream ``samples`` ``(n,)`` float32 at ``sample_rate`` Hz to ``url`` over ``protocol``; the server's results.

    Args:
        url: ``ws://HOST:PORT/`` (sherpa), ``ws://HOST:PORT/wenet`` or ``ws://HOST:PORT/v1/realtime``;
            ``wss://`` with TLS.
        protocol: ``"sherpa"`` (float32 messages, ``Done``), ``"wenet"`` (start signal, int16, end signal)
            or ``"realtime"`` (OpenAI's: session update, 24 kHz PCM16 appends, commit; even
            ``message_samples``).
        message_samples: samples per message (of 16 kHz audio).
        realtime: send message ``i`` at ``i * message_samples / 16000`` s after the first, as a live
            source would; otherwise as fast as the server takes them.
        token: sent as ``Authorization: Bearer TOKEN``.
        ssl_context: for ``wss://`` (for example one that trusts a self-signed certificate).
        timeout_s: bound on the whole exchange (``TimeoutError`` past it).
        sample_rate: of ``samples``: 16000, or over realtime also :data:`REALTIME_RATE` (24000: sent as they
            are, converted before by :func:`to_realtime_rate`).

    Raises:
        ServerError: the server sent an error, or closed before its last message.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    message_samples = check_int("message_samples", message_samples, minimum=1)
    if protocol == "realtime" and message_samples % 2:
        raise ValueError(f"message_samples must be even over realtime (1.5 times at 24 kHz), got {message_samples}")
    rates = (SAMPLE_RATE, REALTIME_RATE) if protocol == "realtime" else (SAMPLE_RATE,)
    if sample_rate not in rates:
        raise ValueError(f"sample_rate must be one of {rates} over {protocol}, got {sample_rate}")
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    result = StreamResult()
    async with connect(url, additional_headers=headers, ssl=ssl_context, proxy=None, max_size=None) as connection:
        exchange = _exchange(connection, samples, sample_rate, protocol, message_samples, realtime, result)
        await asyncio.wait_for(exchange, timeout_s)
    return result


async def _exchange(
    connection: ClientConnection,
    samples: np.ndarray,
    sample_rate: int,
    protocol: str,
    message_samples: int,
    realtime: bool,
    result: StreamResult,
) -> None:
    """Send the start message, the samples and the end message while the results are collected."""
    step = message_samples
    if protocol == "wenet":
        await connection.send(json.dumps(WENET_START))
        reply = json.loads(await connection.recv())
        if reply.get("type") != "server_ready":
            raise ServerError(f"expected server_ready, got {reply}")
    elif protocol == "realtime":
        greeting = json.loads(await connection.recv())
        if greeting.get("type") != "session.created":
            raise ServerError(f"expected session.created, got {greeting}")
        await connection.send(json.dumps(REALTIME_SESSION))
        if sample_rate == SAMPLE_RATE:
            samples = to_realtime_rate(samples)
        step = message_samples * REALTIME_RATE // SAMPLE_RATE
    payload = _payload(samples, protocol)
    reader = _Reader(protocol)
    receiver = asyncio.create_task(_receive(connection, reader, result))
    end = {"sherpa": SHERPA_DONE, "wenet": json.dumps(WENET_END), "realtime": json.dumps(REALTIME_COMMIT)}[protocol]

    async def send_all() -> None:
        """Send the samples and then the end message; stop early when the server has ended the exchange."""
        started = time.perf_counter()
        for index, start in enumerate(range(0, len(payload), step)):
            if receiver.done():  # the server sent an error or closed: stop sending
                return
            if realtime:
                await asyncio.sleep(max(0.0, started + index * message_samples / SAMPLE_RATE - time.perf_counter()))
            await connection.send(_encode(payload[start : start + step], protocol))
            result.sent_at.append(time.perf_counter())
        reader.committed = True
        await connection.send(end)
        result.done_at = time.perf_counter()

    try:
        try:
            await send_all()
        except ConnectionClosed:  # the receiver says why
            pass
        await receiver
    finally:
        receiver.cancel()  # on a timeout: stop collecting
