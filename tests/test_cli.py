"""The ``audiomask`` command line: the demo runs end to end, user errors are one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from audiomask.cli import main


def test_demo_moves_masks_and_checks_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "(B, T_q, T_k) = (4, 375, 375)" in out
    assert "cu_seqlens [0, 104, 208, 312, 390," in out
    assert "equal their host source: yes" in out
    # the DESIGN.md worked example, batch row 1
    assert "    11000\n    11000\n    11100\n    11100\n    00100" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_cuda_is_one_line_and_status_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "audiomask", "demo", "--device", "cuda"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "audiomask: error: --device cuda: CUDA is not available on this machine (use --device cpu or auto)"
    ]
    assert "Traceback" not in result.stderr


def test_unknown_device_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("audiomask: error: ") and "tpu" in err


@pytest.mark.gpu
def test_demo_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "pinned ring slot" in out and "equal their host source: yes" in out
