"""The ``audiomask`` command line under hostile but ordinary use, run as a subprocess: closed or full outputs,
absurd sizes, odd file names, SIGTERM, and audio arriving through pipes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import soundfile as sf

import audiomask.cli.transcribe as transcribe_module
from audiomask.asr.capacity import MAX_CHUNK_MS, MAX_CONTEXT_MS
from audiomask.cli import main

ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
HELLO = ROOT / "samples" / "hello_world.wav"
SUBPROCESS_TIMEOUT_S = 120  # a hang fails the test instead of blocking the suite
SLOW_FEED_PAUSE_S = 0.5  # between the pieces of a slowly fed pipe


def cli(*arguments: object) -> list[str]:
    return [sys.executable, "-m", "audiomask", *map(str, arguments)]


def run_cli(*arguments: object) -> subprocess.CompletedProcess[str]:
    return _run(cli(*arguments), SUBPROCESS_ENV)


def read_line_within(process: subprocess.Popen, timeout_s: float) -> bytes:
    """The next line of ``process``'s stdout; fails when none starts within ``timeout_s`` (no hang)."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    assert ready, f"no output within {timeout_s} s"
    return process.stdout.readline()


def shell(command: str, **run: object) -> subprocess.CompletedProcess[str]:
    """``command`` in bash (for redirections such as ``>&-``), with ``$CLI`` the audiomask command."""
    return _run(["bash", "-c", command], {**SUBPROCESS_ENV, "CLI": f"{sys.executable} -m audiomask"}, **run)


def _run(command: list[str], env: dict[str, str], **run: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=SUBPROCESS_TIMEOUT_S, **run
    )


def test_closed_stdout_is_one_line_and_status_2(model_path: Path) -> None:
    result = shell(f"$CLI transcribe {HELLO} --model {model_path} >&-")
    assert result.returncode == 2
    assert result.stderr == "audiomask: error: stdout is closed: nowhere to write the results\n"


def test_closed_stderr_still_transcribes(model_path: Path) -> None:
    result = shell(f"$CLI transcribe {HELLO} --model {model_path} 2>&-")
    assert result.returncode == 0
    assert result.stdout.startswith(f"{HELLO}\t")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--left-chunks", "1000000000"], f"more than MAX_CONTEXT_MS = {MAX_CONTEXT_MS}"),
        (["--chunk-ms", "80000000"], f"chunk_ms must be <= {MAX_CHUNK_MS}"),
        (["--threads", "1000"], "--threads must be 1 to "),
        (["--threads", "99999999999"], "--threads must be 1 to "),
    ],
)
def test_absurd_sizes_are_one_line_and_status_2(model_path: Path, arguments: list[str], message: str) -> None:
    result = run_cli("transcribe", HELLO, "--model", model_path, *arguments)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("audiomask: error: ") and message in line


def test_tab_and_newline_in_names_are_escaped(model_path: Path, tmp_path: Path) -> None:
    odd = tmp_path / "take\t1\nfinal.wav"
    odd.write_bytes(HELLO.read_bytes())
    result = run_cli("transcribe", odd, "--model", model_path)
    assert result.returncode == 0
    (line,) = result.stdout.splitlines()
    name, text = line.split("\t")
    assert name == str(tmp_path / "take\\t1\\nfinal.wav") and text


def test_symlink_loop_is_named(model_path: Path, tmp_path: Path) -> None:
    (tmp_path / "a.wav").symlink_to(tmp_path / "b.wav")
    (tmp_path / "b.wav").symlink_to(tmp_path / "a.wav")
    result = run_cli("transcribe", tmp_path / "a.wav", "--model", model_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"audiomask: error: {tmp_path / 'a.wav'}: symbolic link loop (too many levels of symbolic links)"
    ]


def test_sigterm_prints_the_text_so_far_and_exits_143(model_path: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    process = subprocess.Popen(
        cli("transcribe", "-", "--model", model_path, "--json", "--partials"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=False,
        env={**SUBPROCESS_ENV, "TMPDIR": str(scratch)},
        cwd=ROOT,
    )
    try:
        data = HELLO.read_bytes()
        process.stdin.write(data)  # a WAV whose stream has not ended: the CLI waits for more
        process.stdin.flush()
        first = json.loads(read_line_within(process, SUBPROCESS_TIMEOUT_S))
        assert first["kind"] == "partial"
        process.send_signal(signal.SIGTERM)
        rest, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM
    assert stderr.decode().splitlines()[-1] == "audiomask: interrupted"
    final = json.loads(rest.decode().splitlines()[-1])
    assert final["kind"] == "final" and final["interrupted"] is True
    assert list(scratch.iterdir()) == []  # no temporary file left behind


def test_stdin_is_streamed_as_it_arrives(model_path: Path) -> None:
    """A pipe fed slowly gets partials before its end, and the text of the whole file at the end."""
    data = HELLO.read_bytes()
    process = subprocess.Popen(
        cli("transcribe", "-", "--model", model_path, "--json", "--partials"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=SUBPROCESS_ENV,
        cwd=ROOT,
    )
    half = len(data) // 2
    try:
        process.stdin.write(data[:half])
        process.stdin.flush()
        first = json.loads(read_line_within(process, SUBPROCESS_TIMEOUT_S))  # while the second half is unsent
        assert first["kind"] == "partial" and first["audio_s"] > 0
        rest, stderr = process.communicate(data[half:], timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    final = json.loads(rest.decode().splitlines()[-1])
    expected = run_cli("transcribe", HELLO, "--model", model_path)
    assert final["kind"] == "final" and final["text"] == expected.stdout.split("\t")[1].rstrip("\n")
    assert final["duration_s"] == round(sf.info(HELLO).frames / sf.info(HELLO).samplerate, 3)


def test_process_substitution(model_path: Path) -> None:
    result = shell(f"$CLI transcribe <(cat {HELLO}) {HELLO} --model {model_path}")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first.split("\t")[1] == second.split("\t")[1]


def test_a_fifo_fed_slowly(model_path: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "live.fifo"
    os.mkfifo(fifo)
    data = HELLO.read_bytes()

    def feed() -> None:
        with fifo.open("wb") as pipe:
            for start in range(0, len(data), len(data) // 4):
                pipe.write(data[start : start + len(data) // 4])
                pipe.flush()
                time.sleep(SLOW_FEED_PAUSE_S)

    writer = threading.Thread(target=feed)
    writer.start()
    result = run_cli("transcribe", fifo, "--model", model_path)
    writer.join()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{fifo}\t")


def test_dev_zero_on_stdin_is_refused_quickly(model_path: Path) -> None:
    result = shell(f"$CLI transcribe - --model {model_path} < /dev/zero")
    assert result.returncode == 1
    assert result.stderr.startswith("audiomask: error: -: not an audio stream")


def test_a_fifo_without_writer_does_not_hold_up_later_files(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(transcribe_module, "FIFO_WRITER_WAIT_S", 0.2)
    fifo = tmp_path / "silent.fifo"
    os.mkfifo(fifo)
    assert main(["transcribe", str(fifo), str(HELLO), "--model", str(model_path)]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"audiomask: error: {fifo}: named pipe without a writer (nothing arrived in 0.2 s)"
    ]
    assert captured.out.startswith(f"{HELLO}\t")
