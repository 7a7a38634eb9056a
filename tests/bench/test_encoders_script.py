"""scripts/bench_encoders.py runs on a CPU (a toy config, host times only) and writes its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_encoders.py"


def test_bench_encoders_smoke(tmp_path):
    out = tmp_path / "encoders.json"
    command = [sys.executable, str(SCRIPT), "--tiny", "--chunks", "2", "--warmup", "1", "--batch-sizes", "1", "3"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # a toy model: threads only spin on a shared machine
    subprocess.run([*command, "--out", str(out)], check=True, capture_output=True, timeout=300, env=environment)
    report = json.loads(out.read_text())
    assert {"command", "date", "torch_version", "gpu", "config", "parameters", "dtype", "chunk_ms"} <= report.keys()
    assert [run["batch_size"] for run in report["runs"]] == [1, 3]
    for run in report["runs"]:
        assert len(run["per_chunk"]["host_ms"]) == 2
        assert {"p50", "p95", "p99"} <= run["host_ms"].keys()
