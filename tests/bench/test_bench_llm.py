"""scripts/bench_llm.py on a CPU (the tiny model, every section, small counts), and the parts it measures with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from audiomask.llm.qwen3_asr import qwen3_asr_prompt
from audiomask.llm.streaming import StreamPolicy
from bench.llm_checkpoints import PHI4MM_SPECIALS, QWEN3_ASR_SPECIALS, phi4mm_tokenizer, qwen3_asr_tokenizer, word_ids
from bench.llm_streams import BenchStreams, ReFeedStreams, build_model, fixed_tokens, one_stream

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_llm.py"
WINDOW_FRAMES = 800  # Qwen3-ASR's encoder windows: 8 s of 10 ms frames
SMOKE = [
    *("--tiny", "--chunks", "0.5", "--anchor-chunks", "0.5", "--seconds", "4", "--start-streams", "1"),
    *("--max-streams", "2", "--warm-s", "0", "--measure-s", "1", "--max-seconds", "10", "--first-repeats", "1"),
    *("--cost-seconds", "20", "--cost-chunk", "2", "--no-plot"),
]


def test_bench_llm_smoke_writes_every_section_and_incremental_work_stays_below_re_feed(tmp_path: Path) -> None:
    out = tmp_path / "llm.json"
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # a toy model: threads only spin on a shared machine
    subprocess.run(
        [sys.executable, str(SCRIPT), *SMOKE, "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
        env=environment,
    )
    report = json.loads(out.read_text())
    assert {"command", "date", "git_commit", "torch_version", "gpu"} <= report["environment"].keys()
    assert report["model"]["size"] == "tiny" and report["model"]["parameters"] > 0
    assert report["settings"]["sections"] == ["capacity", "anchor", "cost", "transformers"]
    for section in ("capacity", "anchor"):
        entry = report[section]["0.5s"]
        assert entry["fixed_tokens"] == fixed_tokens(0.5) == 7
        assert entry["limit"] in ("latency", "max_streams", "memory", "budget")
        assert 0 <= entry["max_streams"] <= 2 and entry["levels"]
        assert {"p50", "p95", "p99"} <= entry["first_partial_ms"].keys()
        for level in entry["levels"]:
            assert level["partials"] > 0 and level["latency_ms"]["p99"] > 0
            assert level["passed"] == (level["latency_ms"]["p99"] < 500 and not level["aborted"])
    summary = report["summary"]
    assert {"capacity_0.5s", "anchor_0.5s", "one_stream_incremental_ms", "cost_last_update"} <= summary.keys()

    cost = report["cost"]
    incremental, refeed = cost["incremental"], cost["refeed"]
    assert (
        [row["audio_s"] for row in incremental] == [row["audio_s"] for row in refeed] == [2.0 * i for i in range(1, 11)]
    )
    for rows in (incremental, refeed):
        assert all(row["encoder_ms"] > 0 and row["decoder_ms"] > 0 and row["decode_steps"] == 12 for row in rows)
    # The re-feed encodes all frames so far and prefills the whole prompt; the incremental path at most the
    # window that closes and the open one, and the tail after the kept head and closed windows.
    assert np.all(np.diff([row["encoder_frames"] for row in refeed]) > 0)
    assert max(row["encoder_frames"] for row in incremental) < WINDOW_FRAMES + 200
    for inc, ref in zip(incremental, refeed):
        if inc["audio_s"] >= 12.0:  # a window closed a chunk before: its frames and tokens are kept
            assert inc["encoder_frames"] < ref["encoder_frames"]
            assert inc["prefill_tokens"] < ref["prefill_tokens"]
    assert refeed[-1]["prefill_tokens"] - incremental[-1]["prefill_tokens"] >= 2 * 104  # two closed windows' tokens

    # The recipe through transformers re-feeds the whole prompt: it grows with every chunk of audio (13 audio
    # tokens a second), the previous answer riding along; 64 audio tokens at least over 4 s more audio.
    recipe = report["transformers"]
    rows = recipe["updates"]
    assert [row["audio_s"] for row in rows] == [2.0 * i for i in range(1, 11)]
    assert all(row["ms"] > 0 for row in rows) and recipe["first_partial_ms"] == rows[0]["ms"]
    prompts = [row["prompt_tokens"] for row in rows]
    assert np.all(np.diff(prompts) > 0) and prompts[-1] - prompts[-3] >= 4 * 13
    assert recipe["real_time_until_s"] is None or recipe["real_time_until_s"] in [row["audio_s"] for row in rows]
    assert summary["transformers_one_stream"]["last_update_audio_s"] == 20.0


def test_the_re_feed_streams_give_the_incremental_partials() -> None:
    """The anchor is the same recipe: with decisive random weights, its tokens are the incremental path's."""
    model = build_model("tiny", "cpu", torch.float32, seed=3, std=1.0)
    policy = StreamPolicy(chunk_s=2.0, fixed_tokens=fixed_tokens(2.0), segment_windows=3)
    tokens = {}
    for cls in (BenchStreams, ReFeedStreams):
        streams = cls(model, 2, policy=policy)
        streams.open("other")  # a second stream in the same slots, never fed
        seen = []
        original = streams.update

        def update(names: list[str], original=original, seen=seen) -> list:
            partials = original(names)
            seen.extend(partial.tokens for partial in partials)
            return partials

        streams.update = update
        one_stream(streams, 20.0, seed=5)
        tokens[cls.__name__] = seen
    assert len(tokens["BenchStreams"]) == 10
    assert tokens["BenchStreams"] == tokens["ReFeedStreams"]


@pytest.mark.parametrize("vocab_size", [151936, 512])
def test_the_tokenizer_round_trips_answers_and_counts_the_prompt_as_qwen3_asr(vocab_size: int) -> None:
    tokenizer = qwen3_asr_tokenizer(vocab_size)
    assert len(tokenizer) == vocab_size
    parts = qwen3_asr_prompt(tokenizer, "", None)
    special = [tokenizer.convert_tokens_to_ids(token) for token in ("<|im_start|>", "<|im_end|>", "<|audio_end|>")]
    assert len(parts.head) == 9 and parts.head[0] == special[0] and parts.head[3] == special[1]
    assert len(parts.tail) == 6 and parts.tail[:2] == (special[2], special[1])
    words = word_ids(tokenizer)
    assert tokenizer.convert_ids_to_tokens([words.start - 1, words.stop]) == ["assistant", QWEN3_ASR_SPECIALS[0]]
    words = [int(i) for i in np.random.default_rng(0).integers(words.start, words.stop, 500)]
    assert tokenizer.encode(tokenizer.decode(words), add_special_tokens=False) == words


PHI4MM_SMOKE = [
    *("--model", "phi4mm_tiny", "--sections", "capacity", "cost", "--chunks", "0.5", "--seconds", "4"),
    *("--start-streams", "1", "--max-streams", "2", "--warm-s", "0", "--measure-s", "1", "--max-seconds", "10"),
    *("--first-repeats", "1", "--cost-seconds", "10", "--cost-chunk", "2", "--no-plot"),
]


def test_bench_llm_streams_phi4mm_by_re_feeding(tmp_path: Path) -> None:
    """A Phi-4-multimodal runs capacity and cost through the re-feed streams (how it streams); the sections that
    compare against the recipe are refused with the ones it runs."""
    out = tmp_path / "phi4mm.json"
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = [sys.executable, str(SCRIPT), *PHI4MM_SMOKE, "--out", str(out)]
    subprocess.run(run, check=True, capture_output=True, timeout=120, env=environment)
    report = json.loads(out.read_text())
    assert report["model"]["size"] == "phi4mm_tiny" and "Phi-4-multimodal" in report["model"]["tokenizer"]
    entry = report["capacity"]["0.5s"]
    assert 1 <= entry["max_streams"] <= 2 and all(level["partials"] > 0 for level in entry["levels"])
    assert list(report["cost"]) == ["chunk_s", "seconds", "segment_windows", "refeed"]
    assert [row["audio_s"] for row in report["cost"]["refeed"]] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert all(row["host_ms"] > 0 for row in report["cost"]["refeed"])
    refused = subprocess.run(
        [*run[:2], "--model", "phi4mm_tiny", "--sections", "anchor", "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "runs the sections capacity, cost" in refused.stderr


def test_the_phi4mm_tokenizer_round_trips_answers_of_its_words() -> None:
    tokenizer = phi4mm_tokenizer(200064)
    assert len(tokenizer) == 200064
    words = word_ids(tokenizer)
    assert tokenizer.convert_ids_to_tokens(words.stop) == PHI4MM_SPECIALS[0]
    words = [int(i) for i in np.random.default_rng(1).integers(words.start, words.stop, 500)]
    assert tokenizer.encode(tokenizer.decode(words), add_special_tokens=False) == words
