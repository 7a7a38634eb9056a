"""``audiomask transcribe --model DIR`` and ``audiomask info --model DIR`` with tiny LLM checkpoints."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile

from audiomask.cli import main
from audiomask.llm import checkpoint
from audiomask.llm.model import DEFAULT_MAX_NEW_TOKENS

pytest.importorskip("transformers")


def _wav(path: Path, samples: np.ndarray) -> Path:
    soundfile.write(path, samples, 16000, subtype="FLOAT")
    return path


@pytest.mark.parametrize("language", [None, "en"])
def test_transcribe_prints_the_offline_answer_of_each_file_and_goes_on_past_a_bad_one(
    tiny_qwen3_asr_dir: Path, speech: Callable, tmp_path: Path, capsys: pytest.CaptureFixture, language: str | None
) -> None:
    signals = {"a.wav": speech(3.7, 1), "b.wav": speech(0.4, 2)}
    paths = [_wav(tmp_path / name, signal) for name, signal in signals.items()]
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF not a wav")
    options = ["--language", language] if language else []
    status = main(
        [
            "transcribe",
            "--model",
            str(tiny_qwen3_asr_dir),
            "--device",
            "cpu",
            "--json",
            *options,
            str(paths[0]),
            str(bad),
            str(paths[1]),
        ]
    )
    captured = capsys.readouterr()
    assert status == 1 and "bad.wav" in captured.err
    printed = {
        Path(row["file"]).name: row["text"] for row in map(json.loads, captured.out.splitlines()) if "text" in row
    }
    model = checkpoint.load(tiny_qwen3_asr_dir)
    for name, signal in signals.items():
        expected = model.transcribe([signal], language=language, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)[0].text
        assert printed[name] == expected


def test_context_changes_what_the_model_is_told(tiny_qwen3_asr_dir: Path, speech: Callable) -> None:
    model = checkpoint.load(tiny_qwen3_asr_dir)
    signal = speech(2.0, 5)
    plain, told = (model.transcribe([signal], context=text, max_new_tokens=16)[0] for text in ("", "Ada Lovelace"))
    assert plain.tokens != told.tokens


def test_info_describes_the_checkpoint(tiny_qwen3_asr_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["info", "--model", str(tiny_qwen3_asr_dir), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "qwen3_asr" in out and "transformers" in out and "chunk_ms" in out


def test_a_directory_without_its_tokenizer_or_weights_is_one_line_naming_what_is_missing(
    tiny_qwen3_asr_dir: Path, speech: Callable, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    wav = _wav(tmp_path / "a.wav", speech(1.0, 1))
    for missing, said in (("tokenizer.json", "tokenizer"), ("model.safetensors", "weights")):
        broken = tmp_path / f"no-{missing}"
        shutil.copytree(tiny_qwen3_asr_dir, broken)
        (broken / missing).unlink()
        status = main(["transcribe", "--model", str(broken), "--device", "cpu", str(wav)])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1 and said in err[0] and str(broken) in err[0]


def test_left_chunks_and_language_without_an_llm_are_refused(
    tiny_qwen3_asr_dir: Path, speech: Callable, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    wav = _wav(tmp_path / "a.wav", speech(1.0, 1))
    assert main(["transcribe", "--model", str(tiny_qwen3_asr_dir), "--left-chunks", "2", str(wav)]) == 2
    assert "--left-chunks" in capsys.readouterr().err
    assert main(["transcribe", "--language", "en", str(wav)]) == 2
    assert "--language" in capsys.readouterr().err


def test_info_describes_a_phi4mm_checkpoint_with_its_audio_token(
    tiny_phi4mm_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    described = checkpoint.describe(tiny_phi4mm_dir)
    config = json.loads((tiny_phi4mm_dir / "config.json").read_text())
    assert described["family"] == "phi4_multimodal"
    assert described["audio_token_id"] == config["audio_config"]["audio_token_id"]
    assert main(["info", "--model", str(tiny_phi4mm_dir), "--device", "cpu"]) == 0
    assert "phi4_multimodal" in capsys.readouterr().out
