"""scripts/train_ctc.py at a tiny scale: training steps, the model file, the evaluation, the card; its helpers."""

from __future__ import annotations

import dataclasses
import doctest
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import _train_data  # noqa: E402
import _train_eval  # noqa: E402
import make_corpus  # noqa: E402
import train_ctc  # noqa: E402

from audiomask.asr.checkpoint import load_model, model_info  # noqa: E402
from audiomask.asr.decoding import CharTokenizer  # noqa: E402

TINY = train_ctc.TrainConfig(**train_ctc.MODEL_SIZES["tiny"])
SHIPPED = train_ctc.TrainConfig()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A toy model: torch's threads only spin on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny espeak-ng corpus, then ``train`` for 2 steps of the tiny model on the CPU (with its evaluation)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng")
    root = tmp_path_factory.mktemp("train")
    words = root / "words.txt"
    words.write_text("the cat sat on a mat red dog ran to sun and we see it is big blue sky\n".replace(" ", "\n"))
    text = root / "text.txt"
    text.write_text("The cat sat on the mat. We see the sun; it is big.\n")
    make_corpus.main(
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
    train_ctc.main(
        [
            "train",
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


def test_doctests() -> None:
    for module in (_train_data, _train_eval, train_ctc):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_train_writes_a_loadable_float16_model(trained: Path) -> None:
    path = trained / train_ctc.MODEL_FILE
    info = model_info(path)
    assert info["dtypes"] == ["F16"]
    assert (info["chunk_ms"], info["left_chunks"]) == (SHIPPED.default_chunk_ms, SHIPPED.default_left_chunks)
    assert info["encoder_config"]["time_reduction"] == SHIPPED.time_reduction
    assert info["alphabet"] == make_corpus.ALPHABET
    assert "espeak-ng" in info["card"]["held_out"]
    model = load_model(path)
    assert model.encoder.config.hidden_size == TINY.hidden_size


def test_train_report(trained: Path) -> None:
    report = json.loads((trained / "train.json").read_text())
    assert {"command", "date", "torch_version", "gpu"} <= report["environment"].keys()
    assert report["training"]["steps"] == 2 and report["training"]["reproduce_with"] == "--steps 2"
    assert report["config"]["seed"] == 0 and report["config"]["hidden_size"] == TINY.hidden_size
    assert all(math.isfinite(point["loss"]) for point in report["training"]["curve"])
    assert report["corpus"]["splits"]["train"]["espeak-ng"]["utterances"] >= 1


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


def test_card_has_a_row_per_engine(trained: Path, tmp_path: Path) -> None:
    card = tmp_path / "MODEL_CARD.md"
    train_ctc.main(
        ["card", "--train", str(trained / "train.json"), "--eval", str(trained / "eval.json"), "--out", str(card)]
    )
    text = card.read_text()
    assert "| espeak-ng | 2 |" in text
    assert "each as often as in 13 words of English text" in text  # the fixture's frequency text
    for ms in SHIPPED.eval_chunk_ms:
        assert f"\n| {ms} | " in text


def test_loss_decreases_on_a_fixed_batch() -> None:
    model = train_ctc.build_model(TINY)
    tokenizer = CharTokenizer(make_corpus.ALPHABET)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 120, 80, generator=generator)
    lengths = np.array([120, 96])
    labels = [tokenizer.encode("a cat"), tokenizer.encode("dog")]
    parameters = [p for module in (model.encoder, model.head) for p in module.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=1e-2)
    losses = []
    for _ in range(6):
        loss = train_ctc.ctc_loss(model, features, lengths, labels, chunk_size=4, left_chunk=2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0] * 0.8, losses


def test_error_rates_of_a_known_pair() -> None:
    rates = _train_eval.error_rates([("kitten sat", "sitting sat"), ("a dog", "a dog")])
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
    assert _train_eval.edit_distance(a, b) == _reference_distance(a, b)


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    total = 5000
    rates = [train_ctc.learning_rate(train_ctc.TrainConfig(), step, total) for step in range(total + 1)]
    warmup = SHIPPED.warmup_steps
    assert all(a < b for a, b in zip(rates[: warmup - 1], rates[1:warmup]))
    assert rates[warmup - 1] == pytest.approx(SHIPPED.peak_lr)
    assert all(a >= b for a, b in zip(rates[warmup:], rates[warmup + 1 :]))
    assert rates[-1] == pytest.approx(SHIPPED.peak_lr * SHIPPED.final_lr_share)


def test_chunkings_drawn_stay_in_their_ranges() -> None:
    rng = np.random.default_rng(0)
    drawn = [train_ctc.draw_chunking(train_ctc.TrainConfig(), rng, tokens=200) for _ in range(2000)]
    full = [d for d in drawn if d[0] == -1]
    assert 0.2 < len(full) / len(drawn) < 0.3
    for chunk, left in drawn:
        if chunk != -1:
            assert SHIPPED.chunk_tokens[0] <= chunk <= SHIPPED.chunk_tokens[1]
            assert SHIPPED.left_chunks[0] <= left <= max(SHIPPED.left_chunks[1], -(-200 // chunk))


def test_batcher_covers_every_copy_once_within_the_budget() -> None:
    lengths = np.random.default_rng(1).integers(50, 500, 300)
    batcher = _train_data.Batcher(lengths, batch_frames=2000, seed=0)
    for _ in range(2):
        batches = batcher.epoch()
        assert sorted(np.concatenate(batches).tolist()) == list(range(300))
        assert all(lengths[b].max() * len(b) <= 2000 for b in batches)
    with pytest.raises(ValueError, match="batch_frames"):
        _train_data.Batcher(lengths, batch_frames=100, seed=0)


def test_augment_is_seeded_and_changes_speed() -> None:
    samples = (np.sin(np.arange(16000) / 7) / 2).astype(np.float32)
    first, drawn = _train_data.augment(samples, np.random.default_rng(5))
    again, _ = _train_data.augment(samples, np.random.default_rng(5))
    np.testing.assert_array_equal(first, again)
    assert len(first) == pytest.approx(len(samples) / drawn["speed"], abs=2)
    assert np.abs(first).max() <= 1.0


def test_planned_steps_fill_the_time_left() -> None:
    expected = 50 + int(train_ctc.PLAN_SAFETY * 100 / 0.02)
    assert train_ctc.planned_steps(done=50, step_s=0.02, seconds_left=100.0) == expected
    assert train_ctc.planned_steps(done=50, step_s=0.02, seconds_left=-5.0) == 51


def test_continue_from_loads_a_model_file_of_the_same_architecture(tmp_path: Path) -> None:
    path = tmp_path / "start.safetensors"
    train_ctc.save(train_ctc.build_model(TINY), path, TINY, card={})
    model = train_ctc.build_model(dataclasses.replace(TINY, seed=1))
    train_ctc.continue_from(model, path)
    saved = load_model(path)
    for mine, theirs in zip(model.encoder.state_dict().values(), saved.encoder.state_dict().values()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    wider = train_ctc.build_model(dataclasses.replace(TINY, hidden_size=32, intermediate_size=32))
    with pytest.raises(ValueError, match="architecture differs"):
        train_ctc.continue_from(wider, path)


def test_profile_lists_the_busiest_operators(tmp_path: Path) -> None:
    model = train_ctc.build_model(TINY)
    labels = [CharTokenizer(make_corpus.ALPHABET).encode("a cat")]
    with torch.profiler.profile(activities=train_ctc.profiled_activities(torch.device("cpu"))) as profiler:
        train_ctc.ctc_loss(model, torch.randn(1, 80, 80), np.array([80]), labels, chunk_size=4, left_chunk=1).backward()
    train_ctc.write_profile(profiler, tmp_path / "profile.txt", steps=1)
    text = (tmp_path / "profile.txt").read_text()
    assert text.startswith("1 training steps") and text.count("by self_cpu_time_total") == 2  # no GPU: host twice
    assert "aten::" in text


def test_spec_augment_masks_bands_and_spans_within_each_utterance() -> None:
    config = train_ctc.TrainConfig(time_masks_per_s=5.0)
    features = torch.ones(3, 400, 80)
    lengths = np.array([400, 250, 100])
    fill = torch.zeros(80)
    masked = train_ctc.spec_augment(config, features, lengths, fill, np.random.default_rng(0)) == 0
    bands = masked.all(dim=1)  # (B, 80): bins masked at every frame
    spans = masked.all(dim=2)  # (B, T): frames masked in every bin
    assert bands.any() and spans.any()
    assert (bands.sum(dim=1) <= config.freq_masks * config.freq_mask_bins).all()
    for row, length in enumerate(lengths):
        assert not spans[row, length:].any()  # spans start inside the utterance and end by its last frame
    assert (masked == (bands[:, None, :] | spans[:, :, None])).all()  # nothing else is touched


def test_warp_mel_is_identity_at_one_and_moves_energy_up_above_one() -> None:
    features = torch.randn(2, 5, 80)
    torch.testing.assert_close(train_ctc.warp_mel(features, torch.ones(2)), features, rtol=0, atol=0)
    peak = torch.zeros(1, 1, 80)
    peak[..., 20] = 1.0
    assert int(train_ctc.warp_mel(peak, torch.tensor([1.1])).argmax()) == 22  # bin 22 reads 20


def test_the_benchmarks_stand_in_has_the_trained_architecture():
    """The latency benchmark measures a random model of the shipped architecture until one ships: the same one."""
    from audiomask.bench.models import SHIPPED_CONFIG

    assert train_ctc.TrainConfig().encoder_config() == SHIPPED_CONFIG


def test_tilt_spectrum_adds_a_line_inside_each_utterance_only() -> None:
    features = torch.randn(2, 6, 80)
    lengths = torch.tensor([6, 3])
    assert torch.equal(train_ctc.tilt_spectrum(features, lengths, torch.zeros(2)), features)
    tilted = train_ctc.tilt_spectrum(features, lengths, torch.tensor([-6.0, 20.0]))
    added = tilted - features
    natural_log_per_db = np.log(10) / 10
    torch.testing.assert_close(added[0, :, -1] - added[0, :, 0], torch.full((6,), -6 * natural_log_per_db))
    torch.testing.assert_close(added[1, :3, -1] - added[1, :3, 0], torch.full((3,), 20 * natural_log_per_db))
    assert torch.equal(added[1, 3:], torch.zeros(3, 80))  # padding untouched
    torch.testing.assert_close(added[:, :3].mean(-1), torch.zeros(2, 3), rtol=0, atol=1e-6)  # a tilt, not a gain


def test_card_lists_the_training_stages(trained: Path, tmp_path: Path) -> None:
    first = tmp_path / "train_stage1.json"
    first.write_text((trained / "train.json").read_text())
    card = tmp_path / "MODEL_CARD.md"
    train_ctc.main(
        [
            "card",
            "--train",
            str(first),
            str(trained / "train.json"),
            "--eval",
            str(trained / "eval.json"),
            "--out",
            str(card),
        ]
    )
    text = card.read_text()
    assert "from 2 training stages" in text
    assert "| 1 | `train_stage1.json` | 2 |" in text and "| 2 | `train.json` | 2 |" in text
    assert "In all: 4 steps" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--device cuda: CUDA is not available here"):
        train_ctc.main(
            ["train", "--corpus", str(tmp_path), "--out", str(tmp_path / "out"), "--steps", "1", "--device", "cuda"]
        )


def test_card_lists_engines_never_trained_on(trained: Path, tmp_path: Path) -> None:
    card = tmp_path / "MODEL_CARD.md"
    unseen = tmp_path / "eval_other_engine.json"
    unseen.write_text((trained / "eval.json").read_text())
    train_ctc.main(
        ["card", "--train", str(trained / "train.json"), "--eval", str(trained / "eval.json")]
        + ["--unseen-engines", str(unseen), "--out", str(card)]
    )
    text = card.read_text()
    assert "Engines never trained on" in text
    voices = json.loads(unseen.read_text())["results"]["engines"]["espeak-ng"]["by_voice_offline_full"]
    for voice in voices:
        assert f"| espeak-ng | `{voice}` |" in text and "`eval_other_engine.json` |" in text
