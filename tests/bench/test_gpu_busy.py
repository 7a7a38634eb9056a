"""bench.gpu_busy: nvidia-smi's utilisation sampled beside a benchmark (here a stand-in printing what it prints)."""

from __future__ import annotations

import os
import time

from bench.gpu_busy import gpu_busy

PERCENTS = [10.0, 20.0, 30.0, 40.0, 50.0]
WAIT_S = 30.0  # bound on waiting for the stand-in's lines


def _stand_in(directory, lines: list[str]) -> None:
    """An ``nvidia-smi`` on ``directory`` that prints ``lines`` (as ``--format=csv,noheader,nounits`` does), then
    stays running as the real one does until it is stopped."""
    script = directory / "nvidia-smi"
    body = "".join(f"echo '{line}'; sleep 0.02\n" for line in lines)
    script.write_text(f"#!/bin/sh\n{body}exec sleep 60\n")
    script.chmod(0o755)


def test_the_utilisation_fills_in_while_the_block_runs_and_the_sampler_stops_with_it(tmp_path, monkeypatch):
    _stand_in(tmp_path, [str(int(p)) for p in PERCENTS[:2]] + ["[N/A]"] + [str(int(p)) for p in PERCENTS[2:]])
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with gpu_busy(0) as samples:
        deadline = time.monotonic() + WAIT_S
        while len(samples) < len(PERCENTS) and time.monotonic() < deadline:
            time.sleep(0.02)
    assert [percent for _, percent in samples] == PERCENTS  # "[N/A]" is no sample
    times = [t_s for t_s, _ in samples]
    assert times == sorted(times) and times[0] >= 0


def test_without_a_gpu_or_nvidia_smi_nothing_is_sampled(tmp_path, monkeypatch):
    with gpu_busy(None) as samples:
        pass
    assert samples == []
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    with gpu_busy(0) as samples:
        pass
    assert samples == []
