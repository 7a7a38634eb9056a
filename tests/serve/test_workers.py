"""``audiomask serve --ws-workers N``: connections in worker processes, the one recognizer in the main process.

The protocol, bad-client, limit and load tests run against a server with two
workers as well (the ``served`` fixture); these are about the processes: a
graceful stop that leaves none behind, and a worker that dies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from audiomask.serve.client import stream_audio

STOP_TIMEOUT_S = 15.0
SIGTERM_AFTER_S = 1.0  # seconds into a 3 s sample streamed at real time
WORKERS = 2
POLL_S = 0.1
HEALTH_TIMEOUT_S = 10.0  # the main process notices a dead worker within this
WORKER_MARK = "from multiprocessing.spawn import spawn_main"  # how a spawned process's command line starts


def _workers_of(pid: int) -> list[int]:
    """The spawned worker processes of process ``pid`` (not its multiprocessing resource tracker)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += map(int, (task / "children").read_text().split())
    workers = []
    for child in children:
        try:
            command = (Path(f"/proc/{child}/cmdline").read_bytes()).replace(b"\0", b" ").decode()
        except OSError:
            continue
        if WORKER_MARK in command and "resource_tracker" not in command:
            workers.append(child)
    return workers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for_health(server, predicate) -> dict:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while True:
        health = server.health()[1]
        if predicate(health) or time.monotonic() > deadline:
            return health
        time.sleep(POLL_S)


def test_sigterm_finishes_the_streams_on_every_worker_and_leaves_no_process(start_server, sample_audio):
    server = start_server("--max-connections", "8", "--ws-workers", str(WORKERS))
    workers = _workers_of(server.process.pid)
    assert len(workers) == WORKERS, workers
    assert server.health()[1]["ws_workers"] == WORKERS
    for pid in workers:  # a worker speaks WebSocket and loads no model code: no torch in its memory
        assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text(), pid
    samples = sample_audio["hello_world.wav"]

    async def stop_mid_stream():
        clients = [
            asyncio.create_task(stream_audio(server.ws_url + route, samples, protocol=protocol, realtime=True))
            for route, protocol in [("/", "sherpa"), ("/wenet", "wenet")] * 3
        ]
        await asyncio.sleep(SIGTERM_AFTER_S)
        server.process.send_signal(signal.SIGTERM)
        return await asyncio.gather(*clients)

    results = asyncio.run(stop_mid_stream())
    assert server.process.wait(STOP_TIMEOUT_S) == 0, server.log()
    for result in results:
        assert result.final_at > 0, "no final result"
        assert result.partials, "no partial result before SIGTERM"
        assert result.text.startswith(result.partials[-1][1])
    assert not [pid for pid in workers if _alive(pid)], "a worker outlived the server"


def test_a_worker_that_dies_ends_only_its_connections(start_server, sample_audio, expected_texts):
    server = start_server("--max-connections", "8", "--ws-workers", str(WORKERS))
    victim = _workers_of(server.process.pid)[0]
    samples = sample_audio["hello_world.wav"]

    async def kill_mid_stream():
        clients = [asyncio.create_task(stream_audio(server.ws_url + "/", samples, realtime=True)) for _ in range(6)]
        await asyncio.sleep(SIGTERM_AFTER_S)
        os.kill(victim, signal.SIGKILL)
        return await asyncio.gather(*clients, return_exceptions=True)

    results = asyncio.run(kill_mid_stream())
    survivors = [result for result in results if not isinstance(result, BaseException)]
    assert all(result.text == expected_texts["hello_world.wav"] for result in survivors), survivors
    # the dead worker's streams, and its connections once the main process sees it has gone, are freed
    expected = {"status": "ready", "ws_workers": 1, "connections": 0, "streams": 0}
    health = _wait_for_health(server, lambda body: expected.items() <= body.items())
    assert expected.items() <= health.items(), health

    async def after():
        return await stream_audio(server.ws_url + "/wenet", samples, protocol="wenet")

    assert asyncio.run(after()).text == expected_texts["hello_world.wav"]
    assert server.process.poll() is None, server.log()
