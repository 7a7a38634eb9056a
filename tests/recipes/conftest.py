"""The recipe's shared input: a tiny corpus of real espeak-ng speech and 2 training steps of the tiny model on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recipes.ctc_small import corpus, train


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny espeak-ng corpus, then ``train`` for 2 steps of the tiny model on the CPU (with its evaluation).

    Returns the training's ``--out`` folder: ``ctc-small.safetensors``, ``train.json``, ``eval.json``.
    """
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng (apt-get install espeak-ng)")
    root = tmp_path_factory.mktemp("train")
    words = root / "words.txt"
    words.write_text("the cat sat on a mat red dog ran to sun and we see it is big blue sky\n".replace(" ", "\n"))
    text = root / "text.txt"
    text.write_text("The cat sat on the mat. We see the sun; it is big.\n")
    corpus.main(
        [
            "--out",
            str(root / "corpus"),
            "--hours",
            "0.004",
            "--eval-per-engine",
            "2",
            "--workers",
            "1",
            "--wordlist",
            str(words),
            "--engines",
            "espeak-ng",
            "--frequency-text",
            str(text),
        ]
    )
    train.main(
        [
            "--corpus",
            str(root / "corpus"),
            "--out",
            str(root / "out"),
            "--steps",
            "2",
            "--model-size",
            "tiny",
            "--device",
            "cpu",
        ]
    )
    return root / "out"
