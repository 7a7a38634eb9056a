"""Fixtures of the command-line tests: the tiny model as a file, as ``--model`` takes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from audiomask.asr.checkpoint import save_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory, tiny_asr_model) -> Path:
    """The tiny random model saved with 320 ms chunks and 4 chunks of left context, and a card."""
    path = tmp_path_factory.mktemp("model") / "tiny.safetensors"
    card = {"data": "none: random weights", "cer": {"offline": 1.0}}
    save_model(tiny_asr_model(), path, chunk_ms=320, left_chunks=4, card=card)
    return path
