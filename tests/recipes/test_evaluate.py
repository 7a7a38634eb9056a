"""recipes.ctc_small.evaluate: error rates, and the report of a tiny model's evaluation (in training and alone)."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from recipes.ctc_small import evaluate
from recipes.ctc_small.config import TrainConfig

SHIPPED = TrainConfig()


def test_doctests() -> None:
    assert doctest.testmod(evaluate).failed == 0


def test_eval_report_covers_every_mode(trained: Path) -> None:
    report = json.loads((trained / "eval.json").read_text())
    entry = report["results"]["engines"]["espeak-ng"]
    sizes = [str(ms) for ms in SHIPPED.eval_chunk_ms]
    assert set(entry["offline"]) == {"full", *sizes} and set(entry["streaming"]) == set(sizes)
    for rates in [*entry["offline"].values(), *entry["streaming"].values()]:
        assert rates["utterances"] == 2 and rates["chars"] > 0 and rates["cer"] >= 0
    assert entry["streaming"][str(SHIPPED.default_chunk_ms)]["run"]["cycles"] > 0
    assert [run["chunk_ms"] for run in report["results"]["latency"]] == list(SHIPPED.eval_chunk_ms)
    assert all(run["rtf"] > 0 and run["latency_ms"] > run["chunk_ms"] for run in report["results"]["latency"])


def test_eval_of_a_model_file_scores_the_split_it_is_asked_for(trained: Path, tmp_path: Path) -> None:
    corpus = trained.parent / "corpus"
    out = tmp_path / "eval_train_split.json"
    evaluate.main(
        ["--corpus", str(corpus), "--model", str(trained / "ctc-small.safetensors"), "--out", str(out)]
        + ["--split", "train", "--limit", "1", "--chunk-ms", "320"]
    )
    report = json.loads(out.read_text())
    assert report["environment"]["argv"][:2] == ["-m", "recipes.ctc_small.evaluate"]
    entry = report["results"]["engines"]["espeak-ng"]
    assert entry["offline"]["full"]["utterances"] == 1 and set(entry["streaming"]) == {"320"}
    records = [json.loads(line) for line in (corpus / "manifest.jsonl").read_text().splitlines()]
    assert set(entry["voices"]) <= {record["voice"] for record in records if record["split"] == "train"}
    assert not set(entry["voices"]) & {record["voice"] for record in records if record["split"] == "eval"}
    assert [run["chunk_ms"] for run in report["results"]["latency"]] == [320]


def test_error_rates_of_a_known_pair() -> None:
    rates = evaluate.error_rates([("kitten sat", "sitting sat"), ("a dog", "a dog")])
    assert (rates["char_edits"], rates["chars"]) == (3, 15)
    assert (rates["word_edits"], rates["words"]) == (1, 4)
    assert rates["cer"] == round(3 / 15, 4) and rates["wer"] == 0.25


def _reference_distance(a: str, b: str) -> int:
    table = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        previous, table[0] = table[0], i
        for j, y in enumerate(b, start=1):
            previous, table[j] = table[j], min(table[j] + 1, table[j - 1] + 1, previous + (x != y))
    return table[-1]


@given(st.text("abc ", max_size=12), st.text("abc ", max_size=12))
def test_edit_distance_equals_the_textbook_recurrence(a: str, b: str) -> None:
    assert evaluate.edit_distance(a, b) == _reference_distance(a, b)
