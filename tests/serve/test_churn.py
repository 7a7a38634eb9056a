"""Connection churn: a thousand short connections of every kind leave the server holding nothing of them.

Kinds (:mod:`bench.server_churn`): a clip and ``Done`` on ``/``, a
clip on ``/wenet``, a close at once, a TCP drop after audio, a text frame that
is not ``Done``. Afterwards ``/health`` reports no connection and no stream,
every final is the clip's single-stream text, and the server holds no more open
file descriptors than before; with WebSocket workers as well (the main
process's descriptors: the workers' sockets are theirs). Its RSS is measured by ``scripts/soak_server.py``
over 10,000 connections (``bench/results/server_churn_cpu.json``), not bounded
here: over a thousand connections its allocator moves it by tens of MiB either
way on a loaded machine, as much as a small leak would.
"""

from __future__ import annotations

import time

import pytest

from bench.server_churn import KINDS, MESSAGE_SAMPLES, churn_clips, run_churn
from bench.server_process import process_memory, single_stream_references

CYCLES = 1000
# The server's thread pool grows to what the load needs over its first few hundred connections.
WARMUP_CYCLES = 500
CONCURRENCY = 16
MAX_CONNECTIONS = 2 * CONCURRENCY  # a client's next connection may come before the server has seen its last end
FDS_TIMEOUT_S = 10.0  # the server closes its last sockets within this once /health reports no connection
POLL_S = 0.05


def _fds_down_to(pid: int, limit: int) -> int:
    """The server's open file descriptors once they are at most ``limit``, or after FDS_TIMEOUT_S."""
    deadline = time.monotonic() + FDS_TIMEOUT_S
    while (fds := process_memory(pid)["fds"]) > limit and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return fds


@pytest.mark.parametrize("ws_workers", [0, 2], ids=["one-process", "2-ws-workers"])
def test_connection_churn_frees_every_connection(start_server, ws_workers):
    served = start_server("--device", "cpu", "--max-connections", str(MAX_CONNECTIONS), "--ws-workers", str(ws_workers))
    audio = churn_clips()
    expected = single_stream_references(audio, None, None, None, MESSAGE_SAMPLES).finals
    assert all(expected.values()), expected  # every clip holds words: a final that loses them is caught

    report = run_churn(
        served.ws_url, served.process.pid, audio, expected, CYCLES, CONCURRENCY, warmup_cycles=WARMUP_CYCLES
    )

    assert report["errors"] == 0, report["error_examples"]
    assert report["wrong"] == 0, report["wrong_examples"]
    for kind in KINDS:
        counts = report["kinds"][kind]
        assert counts["planned"] > 0 and counts["ok"] == counts["planned"], (kind, counts)
    assert report["correct_finals"] == report["finals"] > 0
    assert (report["connections_left"], report["streams_left"]) == (0, 0), report["health_end"]
    memory = report["memory"]
    before = memory["before"]["fds"]  # a socket the server was closing then may count: hence at most, not equal
    assert _fds_down_to(served.process.pid, before) <= before, memory
