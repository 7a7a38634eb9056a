"""sync_check and classify_copy on the CPU, and the transfer benchmark script without CUDA.

sync_check watches copies to the ``meta`` device, which count as host->device.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from audiomask.transfer import (
    CopyVerdict,
    KiB,
    PinnedRing,
    UnsafeCopyError,
    UnsafeCopyWarning,
    classify_copy,
    sync_check,
    to_device,
)
from audiomask.transfer.baselines import direct_copy

# --------------------------------------------------------------------------- sync_check


@pytest.mark.parametrize(
    ("source", "target", "non_blocking", "pinned", "dense", "verdict"),
    [
        ("cpu", "cuda", True, False, True, CopyVerdict.PAGEABLE),
        ("cpu", "cuda:1", True, False, False, CopyVerdict.PAGEABLE),
        ("cpu", "cuda", True, True, False, CopyVerdict.NOT_DENSE),
        ("cpu", "cuda", True, True, True, CopyVerdict.OK),
        ("cpu", "cuda", False, False, False, CopyVerdict.OK),
        ("cpu", "cpu", True, False, False, CopyVerdict.OK),
        ("cuda", "cpu", True, False, False, CopyVerdict.OK),
        ("cuda:0", "cuda:1", True, False, False, CopyVerdict.OK),
        ("cpu", "meta", True, False, True, CopyVerdict.PAGEABLE),
        (torch.device("cpu"), torch.device("cuda", 0), True, True, True, CopyVerdict.OK),
    ],
)
def test_classify_copy(source, target, non_blocking: bool, pinned: bool, dense: bool, verdict: CopyVerdict) -> None:
    assert (
        classify_copy(source_device=source, target_device=target, non_blocking=non_blocking, pinned=pinned, dense=dense)
        is verdict
    )


@pytest.mark.parametrize("method", ["to", "copy_"])
def test_sync_check_raises_on_a_pageable_non_blocking_copy(method: str) -> None:
    source = torch.ones(4, 4)
    with sync_check() as check, pytest.raises(UnsafeCopyError, match="reads pageable memory"):
        direct_copy(source, "meta", method=method)
    assert [flag.verdict for flag in check.flagged] == [CopyVerdict.PAGEABLE]
    assert check.flagged[0].nbytes == 64 and check.flagged[0].shape == (4, 4)


def test_sync_check_warns_and_lets_the_copy_run() -> None:
    with sync_check("warn") as check, pytest.warns(UnsafeCopyWarning, match="non_blocking host->device copy"):
        result = direct_copy(torch.ones(3), "meta")
    assert result.device.type == "meta"
    assert len(check.flagged) == 1


def test_sync_check_flags_a_strided_pinned_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)  # no pinned memory without CUDA
    with sync_check() as check:
        direct_copy(torch.ones(4, 4), "meta")  # pinned and dense: fine
        with pytest.raises(UnsafeCopyError, match="non-dense tensor"):
            direct_copy(torch.ones(4, 4)[:, ::2], "meta")
    assert [flag.verdict for flag in check.flagged] == [CopyVerdict.NOT_DENSE]


def test_sync_check_ignores_blocking_and_host_copies_and_to_device() -> None:
    with sync_check() as check:
        direct_copy(torch.ones(3), "meta", non_blocking=False)
        direct_copy(torch.ones(3), "cpu")
        torch.ones(3).to(torch.float16)
        to_device(np.ones((2, 2)), "cpu")
        to_device(np.ones((2, 2)), "cpu", ring=PinnedRing(slot_bytes=KiB, num_slots=1))
    assert check.flagged == []


def test_sync_check_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match=r"mode must be one of \('error', 'warn'\), got 'raise'"):
        sync_check("raise")


# --------------------------------------------------------------------------- benchmark script


@pytest.mark.skipif(torch.cuda.is_available(), reason="the H200 runs the full benchmark instead")
def test_bench_transfer_quick_runs_without_cuda(tmp_path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_transfer.py"
    out = tmp_path / "transfer.json"
    completed = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "GPU strategies skipped" in completed.stdout
    report = json.loads(out.read_text())
    assert report["entries"] == []
    assert report["skipped"] == [
        "pageable",
        "pin_per_copy",
        "ring",
        "ring_in_place",
        "staging_numpy",
        "staging_torch",
        "bare_copy",
    ]
    assert {row["method"] for row in report["staging"]} == {"stage_copy", "numpy_copyto", "torch_copy"}
    assert {"command", "date", "torch_version", "gpu", "driver", "cpu_count"} <= report.keys()
