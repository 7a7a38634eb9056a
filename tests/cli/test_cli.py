"""The ``audiomask`` command line, run as a subprocess: transcribe (text, JSON, partials, errors, stdin, Ctrl-C),
help, info, bench, demo; user errors are one line and never a traceback."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from audiomask import AudioError
from audiomask.asr.checkpoint import DEFAULT_MODEL_PATH, load_model, model_info, save_model
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.audio import MAX_CHANNELS, load
from audiomask.cli import main
from audiomask.constants import FRAME_MS

ROOT = Path(__file__).resolve().parents[2]
# The checkout first, then whatever the caller had on the path (the H200 keeps soundfile there).
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
SAMPLES = ROOT / "samples"
HELLO, NUMBERS = SAMPLES / "hello_world.wav", SAMPLES / "numbers.wav"
SUBPROCESS_TIMEOUT_S = 120  # a hang fails the test instead of blocking the suite
CHUNK_MS, LEFT_CHUNKS = 320, 4  # the streaming defaults the model_path fixture saves
UNKNOWN_HUGE_DATA_BYTES = 0xFFFFFFF0  # a WAV data size far beyond any test file, and no pipe writer's marker


@pytest.fixture(scope="module")
def expected_text(model_path: Path) -> dict[Path, str]:
    """What the streaming API gives for each sample with the tiny model (the CLI must print the same)."""
    with StreamingRecognizer(load_model(model_path), overlap=False) as recognizer:
        texts = {path: recognizer.transcribe(path) for path in sorted(SAMPLES.glob("*.wav"))}
    assert all(texts.values()), "the tiny model should say something for each sample"
    return texts


def start_cli(*arguments: object, **popen: object) -> subprocess.Popen:
    """The CLI running in the background, its stdout and stderr piped (``popen`` overrides)."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    command = [sys.executable, "-m", "audiomask", *map(str, arguments)]
    return subprocess.Popen(command, cwd=ROOT, env=SUBPROCESS_ENV, **popen)


@pytest.fixture(scope="module")
def long_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten minutes of speech: still being transcribed when a test's signal comes."""
    hello, rate = sf.read(HELLO, dtype="float32")
    path = tmp_path_factory.mktemp("long") / "long.wav"
    sf.write(path, np.tile(hello, 200), rate)
    return path


def wav_bytes(samples: np.ndarray, rate: int, subtype: str) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


def write_bad_files(directory: Path) -> dict[Path, str]:
    """Files the audio reader refuses, each with the reason it gives (the CLI must print it)."""
    speech, rate = sf.read(HELLO, dtype="float32")
    with_nan = speech.copy()
    with_nan[1234] = np.nan
    contents = {
        "bad_empty.wav": b"",
        "bad_text.wav": b"a transcript, not a recording\n" * 20,
        "bad_header.wav": HELLO.read_bytes()[:30],
        "bad_nan.wav": wav_bytes(with_nan, rate, "FLOAT"),
        "bad_channels.wav": wav_bytes(np.zeros((100, MAX_CHANNELS + 1), np.float32), rate, "PCM_16"),
    }
    reasons = {}
    for name, data in contents.items():
        path = directory / name
        path.write_bytes(data)
        with pytest.raises(AudioError) as refused:
            load(path)
        reasons[path] = str(refused.value).removeprefix(f"{path}: ")
    return reasons


def run_cli(*arguments: object, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "audiomask", *map(str, arguments)],
        check=False,
        input=stdin.decode("latin-1") if stdin is not None else None,
        capture_output=True,
        text=True,
        encoding="latin-1",
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


# -- transcribe ---------------------------------------------------------------------------------


def test_text_lines_in_argument_order(model_path: Path, expected_text: dict[Path, str]) -> None:
    result = run_cli("transcribe", NUMBERS, HELLO, "--model", model_path, "--device", "cpu")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.splitlines() == [f"{NUMBERS}\t{expected_text[NUMBERS]}", f"{HELLO}\t{expected_text[HELLO]}"]


def test_json_lines(model_path: Path, expected_text: dict[Path, str]) -> None:
    result = run_cli("transcribe", HELLO, SAMPLES / "stereo_44k.wav", "--model", model_path, "--json")
    assert result.returncode == 0
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["file"] for line in lines] == [str(HELLO), str(SAMPLES / "stereo_44k.wav")]
    for line in lines:
        path = Path(line["file"])
        assert line["kind"] == "final" and line["text"] == expected_text[path] and line["interrupted"] is False
        assert line["duration_s"] == round(len(load(path)[0]) / 16000, 3)  # resampled to 16 kHz
        assert line["processing_s"] > 0
        assert line["rtf"] == pytest.approx(line["processing_s"] / line["duration_s"], rel=1e-2, abs=1e-4)


def test_json_partials_grow_into_the_final_text(model_path: Path, expected_text: dict[Path, str]) -> None:
    result = run_cli("transcribe", HELLO, NUMBERS, "--model", model_path, "--json", "--partials")
    assert result.returncode == 0
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    for path in (HELLO, NUMBERS):
        mine = [line for line in lines if line["file"] == str(path)]
        partials, final = mine[:-1], mine[-1]
        assert final["kind"] == "final" and final["text"] == expected_text[path]
        assert len(partials) >= 2 and all(line["kind"] == "partial" for line in partials)
        texts = [line["text"] for line in partials]
        assert len(set(texts)) == len(texts)  # a line only when the text changed
        assert all(final["text"].startswith(text) for text in texts)  # greedy CTC never revises
        seconds = [line["audio_s"] for line in partials]
        assert seconds == sorted(seconds) and seconds[-1] <= final["duration_s"]
    assert lines.index(next(line for line in lines if line["file"] == str(NUMBERS))) > lines.index(
        next(line for line in lines if line["file"] == str(HELLO) and line["kind"] == "final")
    )


def test_plain_partials_go_to_stderr(model_path: Path, expected_text: dict[Path, str]) -> None:
    result = run_cli("transcribe", HELLO, "--model", model_path, "--partials")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [f"{HELLO}\t{expected_text[HELLO]}"]
    partials = [line.split("\t") for line in result.stderr.splitlines()]
    assert len(partials) >= 2
    assert all(kind == "partial" and name == str(HELLO) for kind, name, _ in partials)
    assert all(expected_text[HELLO].startswith(text) for _, _, text in partials)


def with_huge_data_size(data: bytes, kept_bytes: int) -> bytes:
    """A WAV's bytes whose data chunk declares UNKNOWN_HUGE_DATA_BYTES but holds its first ``kept_bytes``."""
    size_field = data.index(b"data") + 4
    declared = UNKNOWN_HUGE_DATA_BYTES.to_bytes(4, "little")
    return data[:size_field] + declared + data[size_field + 4 : size_field + 4 + kept_bytes]


def test_directory_of_good_and_bad_files(model_path: Path, expected_text: dict[Path, str], tmp_path: Path) -> None:
    bad = write_bad_files(tmp_path)
    shutil.copy(HELLO, tmp_path / "a_good.wav")
    shutil.copy(NUMBERS, tmp_path / "z_good.WAV")
    (tmp_path / "notes.txt").write_text("not an audio suffix: not read\n")
    data = HELLO.read_bytes()
    cut = tmp_path / "m_cut.wav"
    cut.write_bytes(data[: len(data) // 2])  # the data ends early: transcribed, with a warning
    # A header declaring far more data than the file holds: what is there is transcribed, with a
    # warning, never silently; with no sample there, the file is an error.
    kept_bytes = 3200  # 0.1 s of 16-bit mono samples
    huge = tmp_path / "m_huge_header.wav"
    huge.write_bytes(with_huge_data_size(data, kept_bytes))
    huge_empty = tmp_path / "bad_huge_header_no_data.wav"
    huge_empty.write_bytes(with_huge_data_size(data, 0))
    bad[huge_empty] = f"truncated: data ends after 0 of the {UNKNOWN_HUGE_DATA_BYTES} bytes its header declares"
    missing = tmp_path / "absent.wav"
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()

    result = run_cli("transcribe", tmp_path, missing, empty_dir, HELLO, "--model", model_path)
    assert result.returncode == 1
    names = [line.split("\t")[0] for line in result.stdout.splitlines()]
    assert names == [str(tmp_path / "a_good.wav"), str(cut), str(huge), str(tmp_path / "z_good.WAV"), str(HELLO)]
    assert result.stdout.splitlines()[0] == f"{tmp_path / 'a_good.wav'}\t{expected_text[HELLO]}"
    assert result.stdout.splitlines()[3] == f"{tmp_path / 'z_good.WAV'}\t{expected_text[NUMBERS]}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("audiomask: error: ")]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("audiomask: warning: ")]
    assert len(errors) + len(warnings) == len(result.stderr.splitlines())
    assert len(errors) == len(bad) + 2  # one line per bad file, the missing one and the empty directory
    for path, reason in bad.items():
        assert f"audiomask: error: {path}: {reason}" in errors
    assert f"audiomask: error: {missing}: no such file" in errors
    assert any(line.startswith(f"audiomask: error: {empty_dir}: directory without audio files") for line in errors)
    assert len(warnings) == 2 and warnings[0].startswith(f"audiomask: warning: {cut}: truncated: ")
    assert warnings[1] == (
        f"audiomask: warning: {huge}: truncated: data ends after {kept_bytes} of the {UNKNOWN_HUGE_DATA_BYTES} "
        f"bytes its header declares; using the {kept_bytes // 2} frames that are there"
    )


def test_stdin(model_path: Path, expected_text: dict[Path, str]) -> None:
    result = run_cli("transcribe", "-", "--model", model_path, "--json", stdin=HELLO.read_bytes())
    assert result.returncode == 0
    (line,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert line["file"] == "-" and line["text"] == expected_text[HELLO]
    empty = run_cli("transcribe", "-", HELLO, "--model", model_path, stdin=b"")
    assert empty.returncode == 1
    assert empty.stderr.splitlines() == ["audiomask: error: -: empty file (0 bytes)"]
    assert empty.stdout.splitlines() == [f"{HELLO}\t{expected_text[HELLO]}"]
    noise = run_cli("transcribe", "-", "--model", model_path, stdin=b"RIFF not really a wav file at all")
    assert noise.returncode == 1 and noise.stderr.startswith("audiomask: error: -: corrupt or truncated header")


def test_ctrl_c_prints_the_text_so_far_and_exits_130(model_path: Path, long_file: Path) -> None:
    process = start_cli(
        "transcribe", HELLO, long_file, NUMBERS, "--model", model_path, "--json", "--partials", text=True
    )
    try:
        seen = []
        while not seen or json.loads(seen[-1])["file"] != str(long_file):  # the long file is under way
            seen.append(process.stdout.readline())
            assert seen[-1], "the CLI ended before the long file started"
        process.send_signal(signal.SIGINT)
        rest, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        process.kill()
    assert process.returncode == 130
    assert "Traceback" not in stderr and stderr.splitlines()[-1] == "audiomask: interrupted"
    lines = [json.loads(line) for line in seen + rest.splitlines()]
    finals = [line for line in lines if line["kind"] == "final"]
    assert [line["file"] for line in finals] == [str(HELLO), str(long_file)]  # NUMBERS never started
    assert finals[0]["interrupted"] is False and finals[1]["interrupted"] is True
    partial_texts = [line["text"] for line in lines if line["kind"] == "partial" and line["file"] == str(long_file)]
    assert finals[1]["text"].startswith(partial_texts[-1]) and finals[1]["text"]
    assert 0 < finals[1]["duration_s"] < 600


def test_interrupted_plain_line_is_marked(model_path: Path, long_file: Path) -> None:
    process = start_cli("transcribe", long_file, "--model", model_path, "--partials", text=True)
    try:
        assert process.stderr.readline().startswith(f"partial\t{long_file}\t")
        process.send_signal(signal.SIGINT)
        stdout, _ = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        process.kill()
    assert process.returncode == 130
    ((name, text, mark),) = [line.split("\t") for line in stdout.splitlines()]
    assert name == str(long_file) and text and mark.startswith("[interrupted at ") and mark.endswith(" s]")


def test_progress_line_on_a_terminal(model_path: Path, expected_text: dict[Path, str]) -> None:
    controller, terminal = pty.openpty()
    try:
        process = start_cli("transcribe", HELLO, NUMBERS, "--model", model_path, stderr=terminal, text=True)
        stdout, _ = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
        os.close(terminal)
        shown = b""
        while chunk := _read_available(controller):
            shown += chunk
    finally:
        os.close(controller)
    assert process.returncode == 0
    assert stdout.splitlines() == [f"{HELLO}\t{expected_text[HELLO]}", f"{NUMBERS}\t{expected_text[NUMBERS]}"]
    status = shown.decode()
    assert f"[1/2] {HELLO} " in status and f"[2/2] {NUMBERS} " in status
    assert status.endswith("\r\x1b[K")  # the status line is cleared at the end


def _read_available(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the terminal's other side is closed and drained
        return b""


def test_broken_pipe_is_quiet(model_path: Path) -> None:
    process = start_cli("transcribe", *[HELLO] * 30, "--model", model_path)
    assert process.stdout.readline().startswith(str(HELLO).encode())
    process.stdout.close()  # as `| head -1` does
    _, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert process.returncode == 0 and stderr == b""


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--chunk-ms", "100"], "audiomask: error: --chunk-ms/--left-chunks: chunk_ms must be a multiple of "),
        (["--left-chunks", "-1"], "audiomask: error: --chunk-ms/--left-chunks: left_chunks must be >= 0, got -1"),
        (["--device", "tpu"], "audiomask: error: --device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
        (["--threads", "0"], "audiomask: error: --threads must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_one_line_and_status_2(model_path: Path, arguments: list[str], message: str) -> None:
    result = run_cli("transcribe", HELLO, "--model", model_path, *arguments)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(message)


def test_bad_model_is_one_line_and_status_2(tmp_path: Path) -> None:
    for model, reason in ((tmp_path / "absent.safetensors", "no such file"), (HELLO, "not a readable safetensors")):
        result = run_cli("transcribe", HELLO, "--model", model)
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"audiomask: error: model '{model}': {reason}")


@pytest.mark.skipif(DEFAULT_MODEL_PATH.is_file(), reason="checks the message for an install without its model")
def test_missing_shipped_model_says_so() -> None:
    result = run_cli("transcribe", HELLO)
    assert result.returncode == 2
    assert result.stderr.startswith(f"audiomask: error: the shipped model '{DEFAULT_MODEL_PATH}' is missing")


def _character_error_rate(reference: str, hypothesis: str) -> float:
    """Levenshtein distance over characters / reference length."""
    previous = list(range(len(hypothesis) + 1))
    for i, expected in enumerate(reference, 1):
        current = [i]
        for j, got in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (expected != got)))
        previous = current
    return previous[-1] / max(len(reference), 1)


@pytest.mark.skipif(not DEFAULT_MODEL_PATH.is_file(), reason=f"the shipped model {DEFAULT_MODEL_PATH} is not built yet")
def test_quick_start_transcribes_the_samples() -> None:
    """The README's first command: the shipped model on samples/*.wav."""
    transcripts = dict(line.split("\t") for line in (SAMPLES / "transcripts.tsv").read_text().splitlines())
    result = run_cli("transcribe", *sorted(SAMPLES.glob("*.wav")))
    assert result.returncode == 0
    got = dict(line.split("\t") for line in result.stdout.splitlines())
    assert sorted(got) == sorted(str(SAMPLES / name) for name in transcripts)
    for name, text in transcripts.items():
        assert _character_error_rate(text, got[str(SAMPLES / name)]) <= 0.05, (name, got[str(SAMPLES / name)])


# -- help, info, bench --------------------------------------------------------------------------


def test_help_is_plain_text() -> None:
    """No reST markup from the docstring it comes from; the transcribe help holds its whole contract."""
    for command in ([], ["transcribe"]):
        result = run_cli(*command, "--help")
        assert result.returncode == 0
        assert not re.search(r"`|:(class|func|mod|data|meth):", result.stdout), result.stdout
    assert "Exit status: 0 all files transcribed" in result.stdout


def test_bench_help_names_the_subcommand() -> None:
    result = run_cli("bench", "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: audiomask bench "), result.stdout


def test_info_describes_model_device_versions_and_settings(model_path: Path) -> None:
    result = run_cli("info", "--model", model_path, "--device", "cpu")
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert [line for line in lines if not line.startswith(" ")] == ["versions", "device", "model", "settings"]
    fields = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.startswith("  ") and line.split()}
    info = model_info(model_path)
    config = info["encoder_config"]
    assert fields["torch"] == torch.__version__ and fields["numpy"] == np.__version__
    assert fields["name"] == f"cpu ({os.cpu_count()} cores)"
    assert fields["threads"].startswith("1 ")
    assert fields["path"].startswith(f"{model_path} (") and fields["parameters"] == f"{info['parameters']:,}"
    assert fields["encoder"] == (
        f"Phi-4MM Conformer: {config['num_blocks']} blocks of {config['hidden_size']}, "
        f"{config['num_attention_heads']} heads, feed-forward {config['intermediate_size']}, "
        f"{config['time_reduction'] * FRAME_MS} ms per token"
    )
    assert fields["card"] == "data: none: random weights"
    assert fields["chunk_ms"] == str(CHUNK_MS)
    assert fields["left_chunks"] == f"{LEFT_CHUNKS} ({LEFT_CHUNKS * CHUNK_MS} ms of left context)"


STAGED_CARD = """## Training

The weights come from 2 training stages, each started from the previous stage's model file:

| stage | report | steps | seconds | batch s |
| --- | --- | --- | --- | --- |
| 1 | `first.json` | 1,030 | 7 | 600 |
| 2 | `second.json` | 12 | 3.4 | 1800 |

In all: 1,042 steps in 10 s of training.
"""


def test_info_spells_out_a_trained_card_and_points_to_the_card_file(tmp_path: Path, tiny_asr_model) -> None:
    """The card beside the model lists its training stages: each is shown, as the total."""
    path = tmp_path / "trained.safetensors"
    held_out = {"espeak-ng": {"offline_full": {"cer": 0.0397}, "streaming_320ms": {"cer": 0.0471}}}
    save_model(tiny_asr_model(), path, card={"held_out": held_out, "training": {"steps": 12, "train_s": 3.4}})
    (tmp_path / "MODEL_CARD.md").write_text(STAGED_CARD)
    result = run_cli("info", "--model", path, "--device", "cpu")
    assert result.returncode == 0
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "card        held_out: espeak-ng CER 3.97 % offline, 4.71 % streaming 320 ms" in lines
    start = lines.index("training: 1,042 steps in 10 s, in 2 stages")
    assert lines[start + 1 : start + 3] == [
        "stage 1: 1,030 steps in 7 s (first.json)",
        "stage 2: 12 steps in 3 s (second.json)",
    ]
    assert f"the whole card: {tmp_path / 'MODEL_CARD.md'}" in lines


@pytest.mark.skipif(not DEFAULT_MODEL_PATH.is_file(), reason=f"the shipped model {DEFAULT_MODEL_PATH} is not built yet")
def test_info_on_the_shipped_model_lists_the_training_stages_of_its_card() -> None:
    card = DEFAULT_MODEL_PATH.with_name("MODEL_CARD.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `([^`]+)` \| ([\d,]+) \|", card, re.MULTILINE)
    (steps, seconds), *_ = re.findall(r"^In all: ([\d,]+) steps in (\d+) s of training", card, re.MULTILINE)
    result = run_cli("info", "--device", "cpu")
    assert result.returncode == 0
    lines = [line.strip() for line in result.stdout.splitlines()]
    totals = [re.fullmatch(rf"training: {steps} steps in (\d+) s, in {len(rows)} stages", line) for line in lines]
    (total,) = [match for match in totals if match]
    assert abs(int(total[1]) - int(seconds)) <= len(rows)  # a sum of the table's rounded seconds
    stages = [line for line in lines if line.startswith("stage ")]
    assert len(stages) == len(rows) > 1
    for line, (number, report, stage_steps) in zip(stages, rows):
        assert line.startswith(f"stage {number}: {stage_steps} steps in ") and line.endswith(f" s ({report})")


def test_info_with_a_bad_model_still_shows_versions(tmp_path: Path) -> None:
    result = run_cli("info", "--model", tmp_path / "absent.safetensors", "--device", "cpu")
    assert result.returncode == 2
    assert result.stdout.splitlines()[0] == "versions" and "model" not in result.stdout.splitlines()
    assert result.stderr.splitlines() == [f"audiomask: error: model '{tmp_path / 'absent.safetensors'}': no such file"]


def test_bench_forwards_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fake = types.ModuleType("audiomask.bench.latency")
    fake.main = lambda argv: calls.append(argv) or 7
    monkeypatch.setitem(sys.modules, "audiomask.bench.latency", fake)
    assert main(["bench", "--streams", "4", "--help"]) == 7
    assert calls == [["--streams", "4", "--help"]]


def test_bench_without_the_benchmark_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "audiomask.bench.latency", None)  # as if the module were absent
    assert main(["bench"]) == 2
    assert capsys.readouterr().err == (
        "audiomask: error: bench: the latency benchmark (audiomask.bench.latency) is not in this install\n"
    )


# -- demo ---------------------------------------------------------------------------------------


def test_demo_moves_masks_and_checks_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "(B, T_q, T_k) = (4, 375, 375)" in out
    assert "cu_seqlens [0, 104, 208, 312, 390," in out
    assert "equal their host source: yes" in out
    # the worked example of hs_mask's docstring, batch row 1
    assert "    11000\n    11000\n    11100\n    11100\n    00100" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_cuda_is_one_line_and_status_2() -> None:
    result = run_cli("demo", "--device", "cuda")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "audiomask: error: --device cuda: CUDA is not available on this machine (use --device cpu or auto)"
    ]


def test_unknown_device_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("audiomask: error: ") and "tpu" in err


@pytest.mark.gpu
def test_demo_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "pinned ring slot" in out and "equal their host source: yes" in out


@pytest.mark.gpu
def test_transcribe_on_cuda_equals_cpu(model_path: Path, expected_text: dict[Path, str]) -> None:
    result = run_cli("transcribe", HELLO, NUMBERS, "--model", model_path, "--device", "cuda")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [f"{HELLO}\t{expected_text[HELLO]}", f"{NUMBERS}\t{expected_text[NUMBERS]}"]
