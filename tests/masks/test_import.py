"""`import audiomask.masks` (and each of its modules) must not import torch: the masks are numpy only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # import the checkout under test, installed or not
MODULES = [
    "audiomask.masks",
    "audiomask.masks.band",
    "audiomask.masks.chunk",
    "audiomask.masks.phi4mm",
    "audiomask.masks.qwen3_asr",
]


@pytest.mark.parametrize("module", MODULES)
def test_import_does_not_load_torch(module):
    code = (
        f"import sys, {module}\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        f"{module}.__name__\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_building_masks_does_not_load_torch():
    code = (
        "import sys\n"
        "from audiomask.masks import phi4mm, qwen3_asr, subsequent_chunk_mask, padding_mask\n"
        "phi4mm.hs_mask([40, 17], 40, 2, 1); phi4mm.streaming_mask(8, 2, 2, 1)\n"
        "qwen3_asr.window_mask([250, 1000]); subsequent_chunk_mask(4, 2); padding_mask([1, 2])\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr
