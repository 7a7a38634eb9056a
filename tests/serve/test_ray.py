"""``audiomask serve --ray``: two local CPU replicas of the server on Ray Serve, driven by real WebSocket clients.

Each handshake's ``x-audiomask-replica`` header names the replica that
serves the connection (the protocols' messages are unchanged), so the test
sees where every connection landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import connect  # the conftest skips the module without websockets

from audiomask.serve.client import DEFAULT_MESSAGE_SAMPLES, stream_audio

from .conftest import free_port
from .test_replicas import _running

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason='needs Ray Serve (pip install -e ".[ray]")'),
    pytest.mark.system,  # Ray's start and two replicas take a minute on 2 cores
]

REPOSITORY = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
REPLICAS = 2
CLIENTS = 16
# Each replica's recognizer: 16 slots, so that either replica could take every client; Ray's
# routing, not a full replica, is what spreads them.
MAX_CONNECTIONS = 16
REPLICA_HEADER = "x-audiomask-replica"
READY_TIMEOUT_S = 120.0  # Ray's start and two replicas' first steps, on a busy 2-core machine
HEALTH_POLL_S = 0.2
EXCHANGE_TIMEOUT_S = 60.0  # the 16 clients' exchanges together
DRAINED_CLIENTS = 4
SIGTERM_AFTER_S = 1.0  # into streams of 3 s and more sent at real time
STOP_TIMEOUT_S = 60.0  # the drain, the deployment's deletion and Ray's shutdown
KILL_TIMEOUT_S = 10.0


def _ray_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _processes_under(root: int) -> list[int]:
    """The ids of ``root``'s descendants now (Ray's local cluster: its servers, raylet and workers)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            # /proc/PID/stat: "PID (COMMAND) STATE PPID ...", COMMAND may hold spaces
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@dataclass
class RayServer:
    """``audiomask serve --ray`` running: its URLs, its process and its log."""

    url: str
    ws_url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _replica_answering(url: str) -> str | None:
    """The replica that answered ``GET url/health`` with 200, or ``None``."""
    with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        return response.headers.get(REPLICA_HEADER) if response.status == 200 else None
    return None


@pytest.fixture
def ray_server(tmp_path: Path) -> Iterator[RayServer]:
    """Two CPU replicas on a free loopback port, both answering ``/health``; stopped (SIGTERM) after the test,
    and whatever of Ray's local cluster is left then is killed."""
    if _ray_cpus() < REPLICAS:
        pytest.skip(f"{REPLICAS} replicas reserve a CPU each; this machine has {_ray_cpus()}")
    port = free_port()
    log_path = tmp_path / "serve-ray.log"
    arguments = ["--ray", "--replicas", str(REPLICAS), "--device", "cpu", "--max-connections", str(MAX_CONNECTIONS)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "audiomask", "serve", "--host", LOOPBACK, "--port", str(port), *arguments],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPOSITORY,
            # Ray's workers import audiomask from the checkout; no usage report is attempted
            env=os.environ | {"PYTHONPATH": str(REPOSITORY), "RAY_USAGE_STATS_ENABLED": "0"},
            start_new_session=True,
        )
    server = RayServer(f"http://{LOOPBACK}:{port}", f"ws://{LOOPBACK}:{port}", process, log_path)
    cluster: list[int] = []
    try:
        replicas: set[str] = set()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(replicas) < REPLICAS:  # Ray routes each request to a random replica with room
            if process.poll() is not None:
                pytest.fail(f"audiomask serve --ray exited with {process.returncode}:\n{server.log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"replicas answering after {READY_TIMEOUT_S} s: {replicas}\n{server.log()}")
            replica = _replica_answering(server.url)
            if replica is not None:
                replicas.add(replica)
            time.sleep(HEALTH_POLL_S)
        cluster = _processes_under(process.pid)
        yield server
    finally:
        cluster = cluster or _processes_under(process.pid)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT_S)
        for pid in [process.pid, *cluster]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(KILL_TIMEOUT_S)


async def stream_on_one_connection(url: str, samples: np.ndarray) -> tuple[str | None, str, list[str | bytes], int]:
    """Connect, then send ``samples`` (float32 messages, as fast as the server takes them) and ``Done``;
    ``(replica named by the handshake, final text, every reply, close code)``."""
    async with connect(url, max_size=None, proxy=None) as websocket:
        replica = websocket.response.headers.get(REPLICA_HEADER)
        for start in range(0, len(samples), DEFAULT_MESSAGE_SAMPLES):
            await websocket.send(samples[start : start + DEFAULT_MESSAGE_SAMPLES].astype("<f4").tobytes())
        await websocket.send("Done")
        replies = [reply async for reply in websocket]
    finals = [json.loads(reply) for reply in replies[:-1] if json.loads(reply).get("is_final")]
    return replica, finals[-1]["text"] if finals else "", replies, websocket.close_code


@pytest.mark.parametrize("sigterm_to", ["process", "group"])
def test_two_replicas_share_16_clients_and_drain_on_sigterm(ray_server, sample_audio, expected_texts, sigterm_to):
    names = [sorted(sample_audio)[client % len(sample_audio)] for client in range(CLIENTS)]

    async def all_clients():
        return await asyncio.gather(
            *(stream_on_one_connection(ray_server.ws_url + "/", sample_audio[name]) for name in names)
        )

    results = asyncio.run(asyncio.wait_for(all_clients(), EXCHANGE_TIMEOUT_S))
    for name, (_, text, replies, close_code) in zip(names, results):
        assert (replies[-1], close_code) == ("Done!", 1000), (name, replies[-3:], close_code)
        assert text == expected_texts[name], name
    replicas = [replica for replica, *_ in results]
    assert None not in replicas and len(set(replicas)) == REPLICAS, replicas

    # SIGTERM to `audiomask serve --ray`, or to its whole process group (`kill -TERM -PGID`, as systemd and
    # shells stop a job): the replicas finish the streams in flight, then everything stops.
    long_audio = np.concatenate(list(sample_audio.values()))

    async def stop_mid_stream():
        streams = [
            asyncio.create_task(stream_audio(ray_server.ws_url + "/", long_audio, realtime=True))
            for _ in range(DRAINED_CLIENTS)
        ]
        await asyncio.sleep(SIGTERM_AFTER_S)
        if sigterm_to == "group":
            os.killpg(ray_server.process.pid, signal.SIGTERM)  # the fixture started it as a group's leader
        else:
            ray_server.process.send_signal(signal.SIGTERM)
        return await asyncio.gather(*streams)

    drained = asyncio.run(asyncio.wait_for(stop_mid_stream(), STOP_TIMEOUT_S))
    assert ray_server.process.wait(STOP_TIMEOUT_S) == 0, ray_server.log()
    for result in drained:
        assert 0 < len(result.sent_at) < len(long_audio) / DEFAULT_MESSAGE_SAMPLES, "SIGTERM did not come mid-stream"
        assert result.final_at > 0, "no final result"
        assert result.text.startswith(result.partials[-1][1] if result.partials else "")


RAY_NODE_AGENTS = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")


def test_killing_audiomask_serve_stops_ray_too(ray_server):
    """SIGKILL to `audiomask serve --ray` (nothing passed on): its driver, in a process group of its own, drains
    and stops Ray's processes instead of serving on without it."""
    descendants = _processes_under(ray_server.process.pid)
    ray_server.process.kill()
    ray_server.process.wait()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while [pid for pid in descendants if _running(pid)] and time.monotonic() < deadline:
        time.sleep(HEALTH_POLL_S)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in descendants if _running(pid)}
    # Ray's node agents (not serving, holding no port) are left to Ray: they can outlive its raylet by minutes.
    serving = {pid: name for pid, name in left.items() if not name.startswith(RAY_NODE_AGENTS)}
    assert not serving, f"Ray's processes outlived audiomask serve: {serving}"
