"""``audiomask serve --ws-workers N``: connections in worker processes, the one recognizer in the main process.

The protocol, bad-client, limit and load tests run against a server with two
workers as well (the ``served`` fixture); these are about the processes: a
graceful stop that leaves none behind, a worker that dies, and when the main
process gives up on its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

from audiomask.serve import workers as serve_workers
from audiomask.serve.client import stream_audio
from audiomask.serve.settings import ServeSettings

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


# -- the main process's watch over its workers (real processes, short timeouts) -----------------


def _watch(monkeypatch, dead: int, alive: int, connected: int, watch_s: float) -> serve_workers._Supervisor:
    """Run the supervisor's watch for ``watch_s`` at most (it returns early when it stops the server) over
    ``dead`` worker processes that have exited and ``alive`` ones that live on, ``connected`` of all of
    which have reached the hub."""
    monkeypatch.setattr(serve_workers, "WATCH_PERIOD_S", 0.05)
    monkeypatch.setattr(serve_workers, "WORKER_CONNECT_TIMEOUT_S", 0.3)
    context = multiprocessing.get_context("spawn")  # as the server starts its workers
    processes = [
        context.Process(target=time.sleep, args=(0.0 if index < dead else 60.0,)) for index in range(dead + alive)
    ]
    supervisor = serve_workers._Supervisor(ServeSettings(), None, len(processes))
    supervisor.connections = context.Array("q", [3] * len(processes))
    hub = SimpleNamespace(workers_connected_ever=connected)

    async def watch() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(supervisor._watch(processes, hub), watch_s)

    try:
        for process in processes:
            process.start()
        for process in processes[:dead]:
            process.join()
        asyncio.run(watch())
    finally:
        for process in processes:
            process.kill()
            process.join()
    return supervisor


def test_a_worker_dying_after_start_up_leaves_the_server_serving(monkeypatch):
    supervisor = _watch(monkeypatch, dead=1, alive=1, connected=2, watch_s=1.0)  # past the connect timeout
    assert not supervisor.stop.is_set() and not supervisor.failed
    assert list(supervisor.connections) == [0, 3]  # the dead worker's connections are no longer counted


def test_a_worker_that_never_connects_stops_the_server(monkeypatch):
    supervisor = _watch(monkeypatch, dead=0, alive=2, connected=1, watch_s=20.0)
    assert supervisor.stop.is_set() and supervisor.failed


def test_the_server_stops_when_every_worker_has_died(monkeypatch):
    supervisor = _watch(monkeypatch, dead=2, alive=0, connected=2, watch_s=20.0)
    assert supervisor.stop.is_set() and supervisor.failed
