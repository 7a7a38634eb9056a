"""``audiomask serve --replicas N``: N server processes of one recognizer each on one port.

Real processes on loopback: both replicas take connections, every text is
right, SIGTERM to the supervisor drains every replica (each client in flight
gets its final result) and leaves no process; a replica that cannot load its model
ends the server with status 1 and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audiomask.serve.client import stream_audio
from audiomask.serve.launch import REPLICA_HEADROOM

from .conftest import LOOPBACK, REPOSITORY
from .test_workers import STOP_TIMEOUT_S, _alive, _workers_of

REPLICAS = 2
CLIENTS = 12  # spread over the replicas as each accepts: both take some (checked)
HEALTH_TIMEOUT_S = 30.0  # each replica answers /health once its model is loaded and its first step has run
POLL_S = 0.05
SIGTERM_AFTER_S = 1.0  # seconds into a 3 s sample streamed at real time


def _replicas_ready(server) -> dict[int, dict]:
    """Each replica's ``/health`` body once every one has answered 200 (a request reaches whichever accepts)."""
    seen: dict[int, dict] = {}
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while len(seen) < REPLICAS:
        status, body = server.health()
        if status == 200:
            seen[body["replica"]] = body
        if time.monotonic() > deadline:
            pytest.fail(f"replicas ready: {sorted(seen)} of {REPLICAS} after {HEALTH_TIMEOUT_S} s:\n{server.log()}")
        time.sleep(POLL_S)
    return seen


def test_replicas_share_the_connections_of_one_port_and_drain_on_sigterm(start_server, sample_audio, expected_texts):
    server = start_server("--replicas", str(REPLICAS), "--device", "cpu", "--max-connections", str(2 * CLIENTS))
    before = _replicas_ready(server)
    share = math.ceil(2 * CLIENTS * REPLICA_HEADROOM / REPLICAS)
    assert all(body["max_connections"] == share for body in before.values()), before  # each its share
    replicas = _workers_of(server.process.pid)  # the spawned replica processes
    assert len(replicas) == REPLICAS, replicas
    names = sorted(sample_audio)

    async def stream_all():
        return await asyncio.gather(
            *(stream_audio(server.ws_url + "/", sample_audio[names[i % len(names)]]) for i in range(CLIENTS))
        )

    results = asyncio.run(stream_all())
    assert [result.text for result in results] == [expected_texts[names[i % len(names)]] for i in range(CLIENTS)]
    after = _replicas_ready(server)
    served = [replica for replica in after if after[replica]["cycles"] > before[replica]["cycles"]]
    assert sorted(served) == list(range(REPLICAS)), (before, after)  # each replica ran steps for some clients

    samples = sample_audio["hello_world.wav"]

    async def stop_mid_stream():
        clients = [asyncio.create_task(stream_audio(server.ws_url + "/", samples, realtime=True)) for _ in range(4)]
        await asyncio.sleep(SIGTERM_AFTER_S)
        server.process.send_signal(signal.SIGTERM)
        return await asyncio.gather(*clients)

    for result in asyncio.run(stop_mid_stream()):  # each ended where the drain stopped it, with its final result
        assert result.final_at > 0, "no final result"
        assert result.partials, "no partial result before SIGTERM"
        assert result.text.startswith(result.partials[-1][1])
    assert server.process.wait(STOP_TIMEOUT_S) == 0, server.log()
    assert not [pid for pid in replicas if _alive(pid)], "a replica outlived the server"


def test_replicas_that_cannot_load_their_model_end_the_server_with_status_1(tmp_path):
    missing = tmp_path / "missing.safetensors"
    process = subprocess.run(
        [sys.executable, "-m", "audiomask", "serve", "--host", LOOPBACK, "--port", "0", "--device", "cpu"]
        + ["--replicas", str(REPLICAS), "--model", str(missing)],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        timeout=HEALTH_TIMEOUT_S,
    )
    assert process.returncode == 1, process.stderr
    for replica in range(REPLICAS):
        assert f"replica {replica}: error: " in process.stderr and str(missing) in process.stderr, process.stderr


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie, exited and not yet reaped, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_the_replicas_stop_when_their_supervisor_is_killed(start_server):
    server = start_server("--replicas", str(REPLICAS), "--device", "cpu", "--max-connections", "4")
    _replicas_ready(server)
    replicas = _workers_of(server.process.pid)
    assert len(replicas) == REPLICAS, replicas
    try:
        server.process.kill()  # SIGKILL: no drain is passed on
        server.process.wait()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(map(_running, replicas)) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert not [pid for pid in replicas if _running(pid)], "a replica outlived its supervisor"
    finally:
        for pid in replicas:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
