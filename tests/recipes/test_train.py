"""recipes.ctc_small.train at a tiny scale: the model file and report it writes, the loss, the schedule, --init."""

from __future__ import annotations

import dataclasses
import doctest
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from audiomask.asr.checkpoint import load_model, model_info
from audiomask.asr.decoding import CharTokenizer
from recipes.ctc_small import train
from recipes.ctc_small.config import MODEL_SIZES, TrainConfig
from recipes.ctc_small.corpus import ALPHABET

TINY = TrainConfig(**MODEL_SIZES["tiny"])
SHIPPED = TrainConfig()


def test_doctests() -> None:
    assert doctest.testmod(train).failed == 0


def test_train_writes_a_loadable_float16_model(trained: Path) -> None:
    path = trained / train.MODEL_FILE
    info = model_info(path)
    assert info["dtypes"] == ["F16"]
    assert (info["chunk_ms"], info["left_chunks"]) == (SHIPPED.default_chunk_ms, SHIPPED.default_left_chunks)
    assert info["encoder_config"]["time_reduction"] == SHIPPED.time_reduction
    assert info["alphabet"] == ALPHABET
    assert "espeak-ng" in info["card"]["held_out"]
    model = load_model(path)
    assert model.encoder.config.hidden_size == TINY.hidden_size


def test_train_report(trained: Path) -> None:
    report = json.loads((trained / "train.json").read_text())
    assert {"command", "date", "torch_version", "gpu"} <= report["environment"].keys()
    assert report["environment"]["argv"][:2] == ["-m", "recipes.ctc_small.train"]
    assert report["training"]["steps"] == 2 and report["training"]["reproduce_with"] == "--steps 2"
    assert report["config"]["seed"] == 0 and report["config"]["hidden_size"] == TINY.hidden_size
    assert all(math.isfinite(point["loss"]) for point in report["training"]["curve"])
    assert report["corpus"]["splits"]["train"]["espeak-ng"]["utterances"] >= 1


def test_loss_decreases_on_a_fixed_batch() -> None:
    model = train.build_model(TINY)
    tokenizer = CharTokenizer(ALPHABET)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 120, 80, generator=generator)
    lengths = np.array([120, 96])
    labels = [tokenizer.encode("a cat"), tokenizer.encode("dog")]
    parameters = [p for module in (model.encoder, model.head) for p in module.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=1e-2)
    losses = []
    for _ in range(6):
        loss = train.ctc_loss(model, features, lengths, labels, chunk_size=4, left_chunk=2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0] * 0.8, losses


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    total = 5000
    rates = [train.learning_rate(TrainConfig(), step, total) for step in range(total + 1)]
    warmup = SHIPPED.warmup_steps
    assert all(a < b for a, b in zip(rates[: warmup - 1], rates[1:warmup]))
    assert rates[warmup - 1] == pytest.approx(SHIPPED.peak_lr)
    assert all(a >= b for a, b in zip(rates[warmup:], rates[warmup + 1 :]))
    assert rates[-1] == pytest.approx(SHIPPED.peak_lr * SHIPPED.final_lr_share)


def test_chunkings_drawn_stay_in_their_ranges() -> None:
    rng = np.random.default_rng(0)
    drawn = [train.draw_chunking(TrainConfig(), rng, tokens=200) for _ in range(2000)]
    full = [d for d in drawn if d[0] == -1]
    assert 0.2 < len(full) / len(drawn) < 0.3
    for chunk, left in drawn:
        if chunk != -1:
            assert SHIPPED.chunk_tokens[0] <= chunk <= SHIPPED.chunk_tokens[1]
            assert SHIPPED.left_chunks[0] <= left <= max(SHIPPED.left_chunks[1], -(-200 // chunk))


def test_planned_steps_fill_the_time_left() -> None:
    expected = 50 + int(train.PLAN_SAFETY * 100 / 0.02)
    assert train.planned_steps(done=50, step_s=0.02, seconds_left=100.0) == expected
    assert train.planned_steps(done=50, step_s=0.02, seconds_left=-5.0) == 51


def test_continue_from_loads_a_model_file_of_the_same_architecture(tmp_path: Path) -> None:
    path = tmp_path / "start.safetensors"
    train.save(train.build_model(TINY), path, TINY, card={})
    model = train.build_model(dataclasses.replace(TINY, seed=1))
    train.continue_from(model, path)
    saved = load_model(path)
    for mine, theirs in zip(model.encoder.state_dict().values(), saved.encoder.state_dict().values()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    wider = train.build_model(dataclasses.replace(TINY, hidden_size=32, intermediate_size=32))
    with pytest.raises(ValueError, match="architecture differs"):
        train.continue_from(wider, path)


def test_profile_lists_the_busiest_operators(tmp_path: Path) -> None:
    model = train.build_model(TINY)
    labels = [CharTokenizer(ALPHABET).encode("a cat")]
    with torch.profiler.profile(activities=train.profiled_activities(torch.device("cpu"))) as profiler:
        train.ctc_loss(model, torch.randn(1, 80, 80), np.array([80]), labels, chunk_size=4, left_chunk=1).backward()
    train.write_profile(profiler, tmp_path / "profile.txt", steps=1)
    text = (tmp_path / "profile.txt").read_text()
    assert text.startswith("1 training steps") and text.count("by self_cpu_time_total") == 2  # no GPU: host twice
    assert "aten::" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--device cuda: CUDA is not available here"):
        train.main(["--corpus", str(tmp_path), "--out", str(tmp_path / "out"), "--steps", "1", "--device", "cuda"])
