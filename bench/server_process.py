"""An ``audiomask serve`` subprocess for the server benchmarks: started on a free loopback port, read, stopped.

- :func:`running_server` starts ``python -m audiomask serve`` with the options
  given on a free port of 127.0.0.1, waits (bounded) until ``GET /health``
  answers 200, yields a :class:`ServerProcess` and stops it afterwards
  (SIGTERM, which finishes the connections in flight; SIGKILL past a bound);
- :func:`health` reads any server's ``/health``;
- :func:`cpu_seconds` and :func:`process_memory` read a process's CPU time and
  memory from Linux ``/proc``;
- :func:`single_stream_references` is what one recognizer alone makes of each
  clip: the reference every text a server sends is compared with.

>>> process_memory(-1) is None  # no such process
True
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = [
    "REPOSITORY",
    "LOOPBACK",
    "READY_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "ServerProcess",
    "cpu_seconds",
    "tree_cpu_seconds",
    "health",
    "process_memory",
    "running_server",
    "References",
    "single_stream_references",
]

REPOSITORY = Path(__file__).resolve().parents[1]  # the checkout: the server runs from here
LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 120.0  # model load and first step, on a busy machine (a cold GPU compiles kernels)
STOP_TIMEOUT_S = 30.0  # SIGTERM finishes the connections in flight first
HEALTH_TIMEOUT_S = 5.0  # one GET /health
HEALTH_POLL_S = 0.1  # between GET /health while the server starts
KIB = 1024  # /proc/PID/status counts memory in kB (kibibytes)


@dataclass
class ServerProcess:
    """A running ``audiomask serve``: its URLs (``ws://`` and ``http://``, no trailing slash), process and log."""

    ws_url: str
    http_url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def health(http_url: str) -> tuple[int, dict]:
    """``(HTTP status, JSON body)`` of ``GET http_url/health``; ``(0, {})`` when nothing answers."""
    try:
        with urllib.request.urlopen(f"{http_url}/health", timeout=HEALTH_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}
    except OSError:
        return 0, {}


@contextlib.contextmanager
def running_server(
    options: Mapping[str, object | None], ready_timeout_s: float = READY_TIMEOUT_S
) -> Iterator[ServerProcess]:
    """``audiomask serve`` on a free loopback port with ``options`` (``{"--device": "cpu", ...}``; ``None``
    values are left out), ready (with ``--replicas``: every replica has answered ``/health``); stopped on exit.
    ``RuntimeError`` with the server's log when it exits or is not ready within ``ready_timeout_s`` seconds."""
    port = _free_port()
    command = [sys.executable, "-m", "audiomask", "serve", "--host", LOOPBACK, "--port", str(port)]
    for flag, value in options.items():
        if value is not None:
            command += [flag, str(value)]
    log_path = Path(tempfile.gettempdir()) / f"audiomask_serve_{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPOSITORY)
    served = ServerProcess(f"ws://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{port}", process, log_path)
    try:
        deadline = time.monotonic() + ready_timeout_s
        replicas, ready = int(options.get("--replicas") or 1), set()
        while len(ready) < replicas:  # a request reaches whichever replica the kernel picks
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"audiomask serve did not start ({' '.join(command)}):\n{log_path.read_text()}")
            status, body = health(served.http_url)
            if status == 200:
                ready.add(body.get("replica"))
            else:
                time.sleep(HEALTH_POLL_S)
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of process ``pid`` and of every process below it (replicas, front-end and WebSocket
    workers), by process id."""
    seconds = {pid: cpu_seconds(pid)}
    for child in _children(pid):
        seconds |= tree_cpu_seconds(child)
    return seconds


def _children(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (every thread's), or none where ``/proc`` does not list them."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                children += [int(child) for child in (task / "children").read_text().split()]
    return children


def process_memory(pid: int) -> dict[str, int] | None:
    """Process ``pid``'s memory and handles from Linux ``/proc``; ``None`` when it cannot be read.

    Keys: ``rss_bytes`` (``VmRSS``, resident now), ``hwm_bytes`` (``VmHWM``, the highest RSS so far),
    ``threads``, ``fds`` (open file descriptors, sockets included), and ``children_rss_bytes``: the RSS of
    its child processes together (front-end worker processes; 0 without any).
    """
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    children = [process_memory(child) for child in _children(pid)]
    return {
        "rss_bytes": int(fields["VmRSS"].split()[0]) * KIB,
        "hwm_bytes": int(fields["VmHWM"].split()[0]) * KIB,
        "threads": int(fields["Threads"]),
        "fds": fds,
        "children_rss_bytes": sum(child["rss_bytes"] + child["children_rss_bytes"] for child in children if child),
    }


class References(NamedTuple):
    """What one recognizer alone makes of each clip (:func:`single_stream_references`)."""

    partials: dict[str, list[str]] | None  # per clip, the text after each message; None: no reference texts
    finals: dict[str, str] | None  # per clip, the final text; None: no reference texts
    chunk_ms: int  # the recognizer's chunk
    first_block: int  # samples a stream's first chunk needs (the front end's window reaches past it)
    block: int  # samples each later chunk needs: chunk k is complete at first_block + k * block samples


def single_stream_references(
    audio: Mapping[str, np.ndarray],
    model: str | None,
    chunk_ms: int | None,
    left_chunks: int | None,
    message_samples: int,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    max_streams: int = 1,
) -> References:
    """Each clip fed alone to one :class:`~audiomask.asr.recognizer.StreamingRecognizer` of these settings.

    Args:
        audio: clip name -> ``(n,)`` float32 samples at 16 kHz.
        model: a model file; ``None``: the shipped model.
        chunk_ms, left_chunks: the server's streaming settings (``None``: the model's).
        message_samples: samples per ``accept``, as a client's messages carry them.
        device, dtype, max_streams: where the recognizer runs (default one CPU stream in float32).
            A server's own device, dtype and slot count give the reference its kernels; random
            weights' near ties may still flip between its steps of one stream and the server's
            steps over many (measured with full-size Phi-4MM: ``docs/benchmarks.md``).

    Returns:
        :class:`References`: per clip the text after each message and the final text; the chunk, and the
        samples that complete a stream's first chunk and each later one.
    """
    import torch

    from audiomask.asr.checkpoint import load_model
    from audiomask.asr.recognizer import StreamingRecognizer

    torch.set_num_threads(1)
    partials, finals = {}, {}
    weights = load_model(model, dtype=getattr(torch, dtype))
    with StreamingRecognizer(weights, device, chunk_ms, left_chunks, max_streams=max_streams) as recognizer:
        for name, samples in audio.items():
            stream = recognizer.open_stream(name)
            texts = []
            for start in range(0, len(samples), message_samples):
                stream.accept(samples[start : start + message_samples])
                texts.append(stream.partial())
            partials[name], finals[name] = texts, stream.finish()
        return References(
            partials, finals, recognizer.chunk_ms, recognizer.first_block_samples, recognizer.block_samples
        )
