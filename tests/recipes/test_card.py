"""recipes.ctc_small.card: MODEL_CARD.md from a tiny model's train and eval reports."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from recipes.ctc_small import card
from recipes.ctc_small.config import TrainConfig

SHIPPED = TrainConfig()


def test_doctests() -> None:
    assert doctest.testmod(card).failed == 0


def test_card_has_a_row_per_engine(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "MODEL_CARD.md"
    card.main(["--train", str(trained / "train.json"), "--eval", str(trained / "eval.json"), "--out", str(out)])
    text = out.read_text()
    assert "| espeak-ng | 2 |" in text
    assert "each as often as in 13 words of English text" in text  # the fixture's frequency text
    assert " -m recipes.ctc_small.train --corpus " in text  # the recorded command reruns the step
    for ms in SHIPPED.eval_chunk_ms:
        assert f"\n| {ms} | " in text


def test_card_lists_the_training_stages(trained: Path, tmp_path: Path) -> None:
    first = tmp_path / "train_stage1.json"
    first.write_text((trained / "train.json").read_text())
    out = tmp_path / "MODEL_CARD.md"
    card.main(
        [
            "--train",
            str(first),
            str(trained / "train.json"),
            "--eval",
            str(trained / "eval.json"),
            "--out",
            str(out),
        ]
    )
    text = out.read_text()
    assert "from 2 training stages" in text
    assert "| 1 | `train_stage1.json` | 2 |" in text and "| 2 | `train.json` | 2 |" in text
    assert "In all: 4 steps" in text


def test_card_lists_engines_never_trained_on(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "MODEL_CARD.md"
    unseen = tmp_path / "eval_other_engine.json"
    unseen.write_text((trained / "eval.json").read_text())
    card.main(
        ["--train", str(trained / "train.json"), "--eval", str(trained / "eval.json")]
        + ["--unseen-engines", str(unseen), "--out", str(out)]
    )
    text = out.read_text()
    assert "Engines never trained on" in text
    voices = json.loads(unseen.read_text())["results"]["engines"]["espeak-ng"]["by_voice_offline_full"]
    for voice in voices:
        assert f"| espeak-ng | `{voice}` |" in text and "`eval_other_engine.json` |" in text


def test_a_missing_report_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "train.json"
    with pytest.raises(SystemExit, match="card: error: --train .*train.json.*not a readable JSON report"):
        card.main(["--train", str(missing), "--eval", str(missing), "--out", str(tmp_path / "MODEL_CARD.md")])
