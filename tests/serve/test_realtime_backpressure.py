"""A realtime client that sends faster than its audio is taken is held: its next event is read only when the
feed has room (the session's backpressure, as on the other routes), whatever the dialect."""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace

import numpy as np
import pytest

from audiomask.serve.realtime import RealtimeProtocol
from audiomask.serve.session import serve_connection
from audiomask.serve.settings import ServeSettings

WAIT_S = 5.0  # bound on every wait for an event the test itself causes
APPENDS = 6


class _Feed:
    """A feed that takes one put, then is full until the test makes room."""

    def __init__(self) -> None:
        self.puts: list[int] = []
        self.room = asyncio.Event()
        self.full = asyncio.Event()

    async def put(self, samples: np.ndarray) -> None:
        self.puts.append(len(samples))
        if len(self.puts) > 1:
            self.full.set()
            await self.room.wait()

    def commit(self) -> None: ...

    def clear(self) -> None: ...


class _Engine:
    """The recognizer's side, as far as a session sees it."""

    def __init__(self) -> None:
        self.settings = ServeSettings()
        self.feed = _Feed()

    def admit(self) -> None:
        return None

    def release(self) -> None: ...

    def attach(self, listener, name, endpointing=(None, None)) -> _Feed:
        return self.feed

    def detach(self, feed) -> None: ...


class _WebSocket:
    """A client that has sent every message at once: the session reads them one by one."""

    def __init__(self, messages: list[str]) -> None:
        self.messages = list(messages)
        self.read = 0
        self.sent: list[str] = []
        self.url = SimpleNamespace(path="/v1/realtime")
        self.client = SimpleNamespace(host="127.0.0.1", port=1)
        self.headers: dict[str, str] = {}
        self.query_params: dict[str, str] = {}

    async def accept(self) -> None: ...

    async def receive(self) -> dict:
        if not self.messages:
            await asyncio.sleep(WAIT_S * 10)  # the client waits for its results
        self.read += 1
        return {"type": "websocket.receive", "text": self.messages.pop(0)}

    async def send_text(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


def _append(samples: int) -> str:
    audio = base64.b64encode(np.zeros(samples, "<i2").tobytes()).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


@pytest.mark.parametrize(
    "first",
    [
        {"type": "session.update", "session": {"type": "transcription"}},  # OpenAI
        {"type": "session.update", "model": "any"},  # vLLM
    ],
)
def test_a_client_faster_than_its_audio_is_taken_is_read_no_further_until_there_is_room(first):
    async def run() -> None:
        engine = _Engine()
        websocket = _WebSocket([json.dumps(first)] + [_append(4800) for _ in range(APPENDS)])
        session = asyncio.create_task(serve_connection(websocket, engine, RealtimeProtocol(engine.settings)))
        await asyncio.wait_for(engine.feed.full.wait(), WAIT_S)
        await asyncio.sleep(0.05)
        assert websocket.read == 3  # the update and two appends: the second waits for room
        engine.feed.room.set()
        for _ in range(100):
            if websocket.read == APPENDS + 1:
                break
            await asyncio.sleep(0.01)
        assert websocket.read == APPENDS + 1 and len(engine.feed.puts) == APPENDS
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)

    asyncio.run(run())
