"""Messages between the recognizer's process and its WebSocket worker processes: framed, batched, one stream each way.

With ``audiomask serve --ws-workers N`` the WebSocket connections are served
by N processes and the recognizer by the main process; each worker holds one
Unix socket to the main process. Over it go *frames*: a 4-byte big-endian
length, then a pickled list of messages (tuples whose first item is the
kind). A :class:`Link` gathers every message its side sends during one pass
of the event loop into one frame, so thousands of connections cost a few
frames a pass, not one system call each.

Worker -> recognizer (``cid``: the worker's number for the connection):

- ``(OPEN, cid, name, endpointing)``: a connection attached (``endpointing``: how its audio is cut into
  segments, :data:`~audiomask.serve.settings.Endpointing`); a segment's stream is opened with its first samples;
- ``(AUDIO, cid, samples)``: ``(n,)`` float32 samples, already checked, in whole blocks of the stream;
- ``(COMMIT, cid)``: the client committed its audio: the open segment ends after the samples sent before;
- ``(CLEAR, cid)``: the client dropped its audio not committed: what was not fed, and the open segment;
- ``(END, cid)``: the client ended its audio: feed the rest, finish, answer ``FINAL``;
- ``(WAIT, cid)``: the worker holds the client's messages until ``RESUME`` (it has sent more than the
  feed may hold: ``max_buffered`` samples beyond those a pass has taken);
- ``(CLOSE, cid)``: the connection ended: drop what was not fed, end and free the stream.

Recognizer -> worker:

- ``(HELLO, first_block, block, max_buffered, ahead)``: the feeds' sizes in samples, and whether the
  recognizer takes audio ahead of its blocks (once the recognizer is ready);
- ``(HEALTH, status, body)``: ``/health``'s answer (every :data:`HEALTH_PERIOD_S` and when it changes);
- ``(RESULTS, cid, segments)``: what changed in the stream's segments (:class:`~audiomask.serve.segments.Segment`);
- ``(RESUME, cid, taken)``: answers ``WAIT`` once a pass has taken the feed's samples: ``taken`` samples
  of the connection's have been taken so far;
- ``(FAILED, cid, kind, message)``: the stream cannot go on (``kind``: :data:`ERROR_KINDS`);
- ``(FINAL, cid, segments)`` or ``(FINAL, cid, None, kind, message)``: the segments not reported yet, the
  last final, or why there are none;
- ``(STOP, cid)``: the server is draining: finish the connection now;
- ``(ENDPOINT, cid, sample)``: the connection's open segment's endpoint may be known once ``sample`` samples
  have been sent (``None``: none pending): send the audio as soon as it reaches that, not a block later;
- ``(DRAIN,)``: stop accepting connections; ``(EXIT,)``: shut down.

>>> import asyncio
>>> async def demo():
...     reader = asyncio.StreamReader()
...     reader.feed_data(encode([(AUDIO, 7, "samples")]) + encode([(END, 7)]))
...     return await read_frame(reader), await read_frame(reader)
>>> asyncio.run(demo())
([('audio', 7, 'samples')], [('end', 7)])
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable

from audiomask.errors import AudioError

__all__ = [
    "AUDIO",
    "CLEAR",
    "CLOSE",
    "COMMIT",
    "DRAIN",
    "END",
    "ENDPOINT",
    "ERROR_KINDS",
    "EXIT",
    "FAILED",
    "FINAL",
    "HEALTH",
    "HEALTH_PERIOD_S",
    "HELLO",
    "OPEN",
    "RESUME",
    "STOP",
    "RESULTS",
    "WAIT",
    "Link",
    "dispatch_frames",
    "encode",
    "error_from_wire",
    "error_to_wire",
    "read_frame",
]

OPEN, AUDIO, COMMIT, CLEAR, WAIT, END, CLOSE = "open", "audio", "commit", "clear", "wait", "end", "close"
ENDPOINT = "endpoint"
HELLO, HEALTH, RESULTS, RESUME, FAILED, FINAL, STOP, DRAIN, EXIT = (
    "hello",
    "health",
    "results",
    "resume",
    "failed",
    "final",
    "stop",
    "drain",
    "exit",
)
HEALTH_PERIOD_S = 0.25  # how stale a worker's /health answer may be
LENGTH = struct.Struct(">I")  # a frame's length prefix
# How an error crosses the link: the exception types the connection's session tells apart.
ERROR_KINDS = {"audio": AudioError, "value": ValueError, "runtime": RuntimeError}

logger = logging.getLogger("audiomask.serve")


def encode(messages: list[tuple]) -> bytes:
    """One frame holding ``messages``."""
    payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> list[tuple]:
    """The messages of the next frame; :class:`asyncio.IncompleteReadError` once the other side has gone."""
    (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    return pickle.loads(await reader.readexactly(length))


async def dispatch_frames(reader: asyncio.StreamReader, dispatch: Callable[[tuple], None]) -> None:
    """``dispatch`` each message of every frame, in order, until the other side has gone (then return).

    A message whose ``dispatch`` raises is logged and skipped: one connection's trouble does not end the
    link that the others share.
    """
    while True:
        try:
            messages = await read_frame(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        for message in messages:
            try:
                dispatch(message)
            except Exception:
                logger.exception("audiomask serve: a %r message could not be handled", message[0])


def error_to_wire(error: BaseException) -> tuple[str, str]:
    """``(kind, message)`` of ``error``, for :func:`error_from_wire` on the other side."""
    for kind, error_type in ERROR_KINDS.items():
        if isinstance(error, error_type):
            return kind, str(error)
    return "runtime", f"{type(error).__name__}: {error}"


def error_from_wire(kind: str, message: str) -> Exception:
    """The exception :func:`error_to_wire` described."""
    return ERROR_KINDS.get(kind, RuntimeError)(message)


class Link:
    """One side of a worker's socket: messages sent during a pass of the event loop leave as one frame.

    Every method runs on the event loop. Once the other side has gone, sending does nothing.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._outgoing: list[tuple] = []

    def send(self, message: tuple) -> None:
        """Queue ``message``; the pass's messages are written together once the pass is over."""
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(message)

    def _flush(self) -> None:
        messages, self._outgoing = self._outgoing, []
        if messages and not self.writer.is_closing():
            self.writer.write(encode(messages))

    async def close(self) -> None:
        """Write what is queued, then close the socket."""
        self._flush()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
