"""scripts/bench_server.py starts a server, streams real WebSocket clients through it and writes its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_server.py"
CLIENTS = 4


def test_bench_server_checks_every_text_and_times_the_partials(tmp_path):
    out = tmp_path / "server.json"
    command = [sys.executable, str(SCRIPT), "--clients", str(CLIENTS), "--model", "shipped_tiny"]
    finished = subprocess.run([*command, "--out", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    report = json.loads(out.read_text())
    assert {"command", "date", "torch_version", "git_commit", "server_cpu_s", "server_health"} <= report.keys()
    assert (report["model"], report["chunk_ms"], report["clients"]) == ("shipped_tiny", 320, CLIENTS)
    assert (report["correct"], report["lost"], report["wrong"]) == (CLIENTS, 0, 0)
    assert report["partials"] > 0 and report["server_health"]["status"] == "ready"
    latencies = report["partial_latency_ms"]
    assert 0 < latencies["p50"] <= latencies["p99"] <= latencies["max"]
    by_second = report["partial_latency_ms_by_second"]
    assert sum(second["partials"] for second in by_second) == report["partials"] - report["partials_unmatched"]
    assert [second["t_s"] for second in by_second] == sorted({second["t_s"] for second in by_second})
    assert max(second["max"] for second in by_second) == latencies["max"]
