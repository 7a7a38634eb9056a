"""Fixtures of the server tests: a real ``audiomask serve`` subprocess on a free loopback port.

- ``start_server(*args, open_files=None)`` (a factory; function scope): runs ``python -m audiomask serve --port P *args``
  on a free port of 127.0.0.1, waits (bounded) until ``GET /health`` answers 200, and returns a
  :class:`Served` (``url``, ``ws_url``, ``process``, ``log()``); every server it started is stopped
  when the test ends (SIGTERM, a bounded wait, then SIGKILL).
- ``server_url`` (module scope): one server with the default options; yields its ``http://`` URL.
- ``served`` (session scope): the server most tests share, with a token and small limits
  (:data:`SHARED_ARGS`); clients pass ``served.token``. Twice: without and with WebSocket workers
  (:data:`WS_WORKERS`), so that every test of it holds for both.
- ``sample_audio`` / ``expected_texts`` (session scope): each ``samples/*.wav`` as 16 kHz float32
  (:func:`audiomask.audio.load`), and the text ``audiomask transcribe`` prints for it.
- ``exchange`` (a coroutine function): connect with the ``websockets`` client, send messages, read
  every reply until the server closes; an :class:`Exchange` of the replies and the close code and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import os
import random
import resource
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]') is not installed")
pytest.importorskip("websockets", reason="websockets (the test extra) is not installed")

from websockets.asyncio.client import connect  # after the skips
from websockets.exceptions import ConnectionClosed

from audiomask.audio import load

REPOSITORY = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPOSITORY / "samples").glob("*.wav"))
LOOPBACK = "127.0.0.1"
RAY_WORKER_PORTS_END = 20000  # Ray's workers take ports 10002-19999 by default
READY_TIMEOUT_S = 60.0  # model load and first step, on a busy 2-core machine
STOP_TIMEOUT_S = 15.0  # SIGTERM drains the connections in flight first
HEALTH_POLL_S = 0.05
TRANSCRIBE_TIMEOUT_S = 120.0
EXCHANGE_TIMEOUT_S = 30.0  # one connection's whole exchange
# The shared server: a token, 16 connections, 64 KiB messages, 3 s idle timeout.
SHARED_TOKEN = "test-token"
SHARED_MAX_CONNECTIONS = 16
SHARED_MAX_MESSAGE_BYTES = 65536
SHARED_IDLE_TIMEOUT_S = 3.0
SHARED_ARGS = (
    "--token",
    SHARED_TOKEN,
    "--max-connections",
    str(SHARED_MAX_CONNECTIONS),
    "--max-message-bytes",
    str(SHARED_MAX_MESSAGE_BYTES),
    "--idle-timeout-s",
    str(SHARED_IDLE_TIMEOUT_S),
)
# The tests that share a server run twice: connections served by the recognizer's process (0), and by
# WebSocket worker processes that hand the audio to it (2).
WS_WORKERS = (0, 2)


@dataclass
class Served:
    """A running server: its URLs, process, log file and the token it requires (if any)."""

    url: str  # http(s)://127.0.0.1:PORT
    ws_url: str  # ws(s)://127.0.0.1:PORT
    process: subprocess.Popen
    log_path: Path
    token: str | None = None

    def log(self) -> str:
        """What the server wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def health(self) -> tuple[int, dict]:
        """``(status, JSON body)`` of ``GET /health``."""
        return _health(self.url, _insecure_context() if self.url.startswith("https") else None)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        return self.process.returncode


@pytest.fixture(autouse=True)
def _unfreeze_collections() -> Iterator[None]:
    """An engine started in the test process freezes the objects alive then (as a server does): undone after each
    test, so that later tests' garbage checks see every object."""
    yield
    gc.unfreeze()


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range and above Ray's worker ports (10002-19999):
    no process that binds port 0 can take it before the server binds it, and neither can Ray's components
    (its dashboard agent's default, 52365, is an ephemeral port). Where that range is empty, the kernel's pick."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral = int(ranges.read().split()[0])
    candidates = list(range(RAY_WORKER_PORTS_END, ephemeral))
    random.shuffle(candidates)
    for port in [*candidates, 0]:
        with socket.socket() as probe:
            try:
                probe.bind((LOOPBACK, port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise RuntimeError("no free loopback port")


def _insecure_context() -> ssl.SSLContext:
    """An SSL context that trusts any certificate (the tests' self-signed ones)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _health(url: str, context: ssl.SSLContext | None) -> tuple[int, dict]:
    """``(status, JSON body)`` of ``GET url/health``."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _limit_open_files(count: int) -> None:
    """Limit this process to ``count`` open file descriptors (run in the server's process before it starts)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


@contextlib.contextmanager
def _running_server(log_dir: Path, *args: str, open_files: int | None = None) -> Iterator[Served]:
    """``audiomask serve *args`` on a free loopback port, ready; stopped on exit. ``open_files``: the server's
    limit of open file descriptors (``RLIMIT_NOFILE``), as ``ulimit -n`` would set it; ``None``: this process's."""
    port = free_port()
    secure = "--certfile" in args
    log_path = log_dir / f"serve-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "audiomask", "serve", "--host", LOOPBACK, "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPOSITORY,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
            preexec_fn=None if open_files is None else functools.partial(_limit_open_files, open_files),
        )
    scheme = "https" if secure else "http"
    token = args[args.index("--token") + 1] if "--token" in args else None
    served = Served(
        f"{scheme}://{LOOPBACK}:{port}", f"ws{'s' if secure else ''}://{LOOPBACK}:{port}", process, log_path, token
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"audiomask serve exited with {process.returncode} before it was ready:\n{served.log()}")
            with contextlib.suppress(OSError, ValueError):
                if served.health()[0] == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"audiomask serve was not ready after {READY_TIMEOUT_S} s:\n{served.log()}")
            time.sleep(HEALTH_POLL_S)
        yield served
    finally:
        served.stop()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """A factory: ``start_server(*args, open_files=None)`` runs a ready server with those options (and that limit
    of open files), stopped after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda *args, **limits: stack.enter_context(_running_server(tmp_path, *args, **limits))


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The ``http://127.0.0.1:PORT`` URL of a server with the default options (for the module)."""
    with _running_server(tmp_path_factory.mktemp("serve")) as served:
        yield served.url


@pytest.fixture(scope="session", params=WS_WORKERS, ids=lambda workers: f"ws-workers-{workers}")
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The server most tests share: ``SHARED_ARGS`` (token, 16 connections, 64 KiB messages, 3 s idle), with
    the connections served by the recognizer's process, then by two WebSocket worker processes."""
    args = (*SHARED_ARGS, "--ws-workers", str(request.param))
    with _running_server(tmp_path_factory.mktemp("serve"), *args) as server:
        yield server


@pytest.fixture(scope="session")
def sample_audio() -> dict[str, np.ndarray]:
    """Each sample file's name and its samples, ``(n,)`` float32 at 16 kHz."""
    return {path.name: load(path)[0] for path in SAMPLES}


def transcribe_texts(paths: list[Path]) -> dict[str, str]:
    """Each file's name and the text ``audiomask transcribe --json`` gives it (the shipped model)."""
    result = subprocess.run(
        [sys.executable, "-m", "audiomask", "transcribe", "--json", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=TRANSCRIBE_TIMEOUT_S,
        check=True,
        cwd=REPOSITORY,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return {Path(line["file"]).name: line["text"] for line in lines}


@pytest.fixture(scope="session")
def expected_texts() -> dict[str, str]:
    """Each sample file's name and the text ``audiomask transcribe --json`` gives it (the shipped model)."""
    return transcribe_texts(list(SAMPLES))


@pytest.fixture(scope="session")
def insecure_ssl_context() -> ssl.SSLContext:
    """A client SSL context that trusts the tests' self-signed certificates."""
    return _insecure_context()


@dataclass
class Exchange:
    """What a server sent on one connection: its messages, then its close code and reason."""

    replies: list[str | bytes]
    close_code: int | None
    close_reason: str


async def _exchange(
    url: str,
    messages: list[str | bytes],
    *,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    timeout_s: float = EXCHANGE_TIMEOUT_S,
) -> Exchange:
    """Send ``messages`` on a new connection to ``url``, then read every reply until the server closes."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}

    async def run() -> Exchange:
        async with connect(url, additional_headers=headers, ssl=ssl_context, proxy=None, max_size=None) as socket_:
            for message in messages:
                try:
                    await socket_.send(message)
                except ConnectionClosed:  # the server refused an earlier message
                    break
            replies = []
            try:
                async for reply in socket_:
                    replies.append(reply)
            except ConnectionClosed:  # closed with an error code: recorded below
                pass
            return Exchange(replies, socket_.close_code, socket_.close_reason)

    return await asyncio.wait_for(run(), timeout_s)


@pytest.fixture(scope="session")
def exchange() -> Callable[..., Awaitable[Exchange]]:
    """The coroutine function ``exchange(url, messages, token=, ssl_context=)`` -> :class:`Exchange`."""
    return _exchange
