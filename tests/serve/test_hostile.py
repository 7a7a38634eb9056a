"""Hostile clients: half-finished handshakes and message floods are closed, and the clients beside them are served.

Real servers on loopback, real clients: raw TCP sockets for the handshakes that never finish, the
``websockets`` client for the rest.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from audiomask.serve.client import stream_audio
from audiomask.serve.settings import ServeSettings

from .conftest import LOOPBACK

# A server that may open 128 files (16 are its own when idle) and keeps at most 32 connections whose
# handshake is unfinished, for at most 2 s; 160 half handshakes would take every file it may open.
OPEN_FILES = 128
HALF_HANDSHAKES = 160
MAX_PENDING = 32
HANDSHAKE_TIMEOUT_S = 2.0
CLOSED_WITHIN_S = 15.0  # bound on the wait for the server to close every half handshake
PARTIAL_UPGRADE = b"GET /wenet HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
HEALTH_REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
CLIENT_TIMEOUT_S = 20.0
READ_BYTES = 4096
FLOOD_MESSAGES = 50_000  # 4-byte messages, as fast as the server reads them: far over --max-messages-per-s
FLOOD_TIMEOUT_S = 60.0


def _half_handshake(port: int, index: int) -> socket.socket:
    """A TCP connection to the server that says nothing, sends half of a WebSocket upgrade request, or (one in
    three of each) gets a whole ``/health`` response and then sends half of a second request on the kept-alive
    connection."""
    sock = socket.create_connection((LOOPBACK, port))
    kind = index % 3
    if kind == 1:
        sock.sendall(PARTIAL_UPGRADE)
    elif kind == 2:
        sock.sendall(HEALTH_REQUEST)
        assert sock.recv(len(b"HTTP/1.1 200")).startswith(b"HTTP/1.1 ")
        sock.sendall(HEALTH_REQUEST[: len(HEALTH_REQUEST) // 2])
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (end of file or reset; what it sent before is read and dropped);
    waits up to ``sock``'s timeout."""
    try:
        while sock.recv(READ_BYTES):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_half_finished_handshakes_are_closed_and_a_real_client_is_served_beside_them(
    start_server, sample_audio, expected_texts
):
    server = start_server(
        "--max-connections",
        "4",
        "--handshake-timeout-s",
        str(HANDSHAKE_TIMEOUT_S),
        "--max-pending-handshakes",
        str(MAX_PENDING),
        open_files=OPEN_FILES,
    )
    port = int(server.url.rsplit(":", 1)[1])
    half = [_half_handshake(port, index) for index in range(HALF_HANDSHAKES)]
    try:
        result = asyncio.run(
            stream_audio(server.ws_url + "/", sample_audio["hello_world.wav"], timeout_s=CLIENT_TIMEOUT_S)
        )
        assert result.text == expected_texts["hello_world.wav"]
        deadline = time.monotonic() + CLOSED_WITHIN_S
        open_ones = []
        for sock in half:
            sock.settimeout(max(0.0, deadline - time.monotonic()))
            if not _closed_by_server(sock):
                open_ones.append(sock)
        assert not open_ones, f"{len(open_ones)} of {HALF_HANDSHAKES} half handshakes still open"
    finally:
        for sock in half:
            sock.close()
    assert server.health()[0] == 200  # and the server serves on
    assert server.process.poll() is None


def test_a_client_flooding_messages_is_closed_with_1008_and_a_client_beside_it_is_unaffected(
    served, sample_audio, expected_texts
):
    hello = sample_audio["hello_world.wav"]
    headers = {"Authorization": f"Bearer {served.token}"}

    async def flood() -> tuple[int, str, list[str | bytes]]:
        async with connect(served.ws_url + "/", additional_headers=headers, proxy=None) as websocket:
            try:
                for _ in range(FLOOD_MESSAGES):
                    await websocket.send(bytes(4))
                await websocket.send("Done")
            except ConnectionClosed:
                pass
            replies = []
            try:
                async for reply in websocket:
                    replies.append(reply)
            except ConnectionClosed:
                pass
            return websocket.close_code, websocket.close_reason, replies

    async def both():
        good = asyncio.create_task(stream_audio(served.ws_url + "/", hello, realtime=True, token=served.token))
        await asyncio.sleep(0.5)  # the good client is streaming
        flooded = await flood()
        return await good, flooded

    good, (code, reason, replies) = asyncio.run(asyncio.wait_for(both(), FLOOD_TIMEOUT_S))
    assert good.text == expected_texts["hello_world.wav"]
    assert code == 1008, (code, reason)
    error = json.loads(replies[-1])["error"]
    assert "--max-messages-per-s" in error and error.startswith(reason.removesuffix("...")), error


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("handshake_timeout_s", 0, "--handshake-timeout-s must be a positive number of seconds, got 0"),
        ("max_pending_handshakes", 0, "--max-pending-handshakes must be >= 1, got 0"),
        ("max_messages_per_s", float("nan"), "--max-messages-per-s must be a positive number, got nan"),
        ("max_messages_per_s", 0, "--max-messages-per-s must be a positive number, got 0"),
    ],
)
def test_the_limits_refuse_bad_values_naming_the_option(field, value, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        ServeSettings(**{field: value})
