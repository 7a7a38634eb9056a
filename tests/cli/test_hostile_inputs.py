"""The ``audiomask`` command line given paths it cannot check, model files it must refuse, and audio of an odd
sample width, run as a subprocess: one ``audiomask: error:`` line each, the other files still transcribed."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
HELLO = ROOT / "samples" / "hello_world.wav"
SUBPROCESS_TIMEOUT_S = 120  # a hang fails the test instead of blocking the suite
# Address space a CLI process may map: far more than the tiny model needs, far less than an absurd model
# file would make it allocate, so a missed check fails the test instead of exhausting the machine.
CLI_ADDRESS_SPACE_BYTES = 8 * 2**30
NAME_MAX = 255  # bytes of one path component on Linux file systems
# prctl(PR_CAPBSET_DROP, cap): what exec leaves a root process of file-permission overrides.
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CLI_ADDRESS_SPACE_BYTES, CLI_ADDRESS_SPACE_BYTES))


def _bounded_and_permission_checked() -> None:
    """In the child before exec: bounded, and (as root) subject to file permissions like any user."""
    _bounded()
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
            if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_cli(*arguments: object, preexec: Callable[[], None] = _bounded) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "audiomask", *map(str, arguments)],
        check=False,
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        cwd=ROOT,
        timeout=SUBPROCESS_TIMEOUT_S,
        preexec_fn=preexec,
    )


def assert_only_hello_transcribed(result: subprocess.CompletedProcess[str], errors: list[str]) -> None:
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [f"audiomask: error: {line}" for line in errors]
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"{HELLO}\t") and line.split("\t")[1]


def test_paths_that_cannot_be_checked_fail_alone(model_path: Path, tmp_path: Path) -> None:
    too_long = tmp_path / ("x" * (NAME_MAX + 45) + ".wav")
    regular = tmp_path / "take.wav"
    regular.write_bytes(HELLO.read_bytes())
    through_a_file = regular / "inner.wav"
    dangling = tmp_path / "dangling.wav"
    dangling.symlink_to(tmp_path / "gone.wav")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    result = run_cli("transcribe", too_long, through_a_file, dangling, loop, HELLO, "--model", model_path)
    assert_only_hello_transcribed(
        result,
        [
            f"{too_long}: cannot be read (File name too long)",
            f"{through_a_file}: no such file (a part of its path is a file, not a directory)",
            f"{dangling}: dangling symbolic link (to {tmp_path / 'gone.wav'}, which does not exist)",
            f"{loop}: symbolic link loop (too many levels of symbolic links)",
        ],
    )


def test_folders_it_may_not_list_or_enter_fail_alone(model_path: Path, tmp_path: Path) -> None:
    closed, unlistable, unenterable = (tmp_path / name for name in ("closed", "unlistable", "unenterable"))
    for folder, mode in ((closed, 0), (unlistable, 0o100), (unenterable, 0o400)):
        folder.mkdir()
        (folder / "a.wav").write_bytes(HELLO.read_bytes())
        folder.chmod(mode)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", f"import os; os.listdir({str(closed)!r})"],
            check=False,
            capture_output=True,
            preexec_fn=_bounded_and_permission_checked,
        )
    except subprocess.SubprocessError:  # prctl refused: this root process may not give up its overrides
        probe = None
    if probe is None or probe.returncode == 0:
        for folder in (closed, unlistable, unenterable):
            folder.chmod(0o700)
        pytest.skip("this process reads folders whatever their permissions say")
    try:
        result = run_cli(
            "transcribe",
            closed,
            closed / "a.wav",
            unlistable,
            unenterable,
            HELLO,
            "--model",
            model_path,
            preexec=_bounded_and_permission_checked,
        )
    finally:
        for folder in (closed, unlistable, unenterable):
            folder.chmod(0o700)
    assert_only_hello_transcribed(
        result,
        [
            f"{closed}: directory cannot be listed (Permission denied)",
            f"{closed / 'a.wav'}: cannot be read (Permission denied)",
            f"{unlistable}: directory cannot be listed (Permission denied)",
            f"{unenterable / 'a.wav'}: cannot be read (Permission denied)",
        ],
    )


def _model_variant(source: Path, directory: Path, **changes: object) -> Path:
    """The model file ``source`` with ``changes`` to its encoder config (``chunk_ms``/``left_chunks``: metadata)."""
    with safe_open(str(source), framework="pt") as reader:
        metadata = reader.metadata()
        tensors = {name: reader.get_tensor(name) for name in reader.keys()}  # noqa: SIM118
    config = json.loads(metadata["encoder_config"])
    for key, value in changes.items():
        if key in ("chunk_ms", "left_chunks"):
            metadata[key] = str(value)
        else:
            config[key] = value
    metadata["encoder_config"] = json.dumps(config)
    path = directory / "bad.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    return path


WIDE = 65536
ABSURD_MODELS = {
    "left_chunks": ({"left_chunks": 99999999}, "left_chunks 99999999 with chunk_ms 320"),
    "hidden_size": (
        {"hidden_size": WIDE, "ext_pw_out_channel": WIDE, "depthwise_separable_out_channel": WIDE},
        f"hidden_size {WIDE}",
    ),
    "num_blocks": ({"num_blocks": 100000000}, "num_blocks 100000000 exceeds MAX_ENCODER_BLOCKS"),
    "bias_max_distance": ({"bias_max_distance": 10**10}, f"bias_max_distance {10**10} (beyond the released"),
    "num_blocks_disagrees": ({"num_blocks": 3}, "the weights do not fit the stored config"),
}


@pytest.mark.parametrize("case", list(ABSURD_MODELS))
def test_absurd_model_files_are_status_2_and_one_line(model_path: Path, tmp_path: Path, case: str) -> None:
    changes, message = ABSURD_MODELS[case]
    bad = _model_variant(model_path, tmp_path, **changes)
    result = run_cli("transcribe", HELLO, "--model", bad)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"audiomask: error: model {str(bad)!r}: ") and message in line
    assert result.stdout == ""


@pytest.mark.parametrize("case", ["hidden_size", "left_chunks"])
def test_serve_refuses_an_absurd_model_file_before_it_starts(model_path: Path, tmp_path: Path, case: str) -> None:
    changes, message = ABSURD_MODELS[case]
    bad = _model_variant(model_path, tmp_path, **changes)
    result = run_cli("serve", "--model", bad, "--port", "0", "--device", "cpu")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()  # no banner: nothing was served
    assert line.startswith(f"audiomask: error: model {str(bad)!r}: ") and message in line


def test_a_model_that_is_not_a_regular_file_is_named_and_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)  # no writer: opening it to read would block
    for model, kind in (("/dev/urandom", "a character device"), (fifo, "a named pipe")):
        result = run_cli("transcribe", HELLO, "--model", model)
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"audiomask: error: model {str(model)!r}: not a regular file ({kind})\n"


def _wav(bits_per_sample: int, data: bytes, rate: int = 16000) -> bytes:
    """A mono WAVE_FORMAT_PCM file declaring ``bits_per_sample`` in containers of whole bytes, around ``data``."""
    block_align = -(-bits_per_sample // 8)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * block_align, block_align, bits_per_sample)
    body = b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_a_wav_of_7_bits_whose_data_does_not_fit_is_a_bad_file(model_path: Path, tmp_path: Path) -> None:
    odd = tmp_path / "seven.wav"
    odd.write_bytes(_wav(7, bytes(range(256)) * 64))  # every byte value: the low (padding) bit is set in half
    result = run_cli("transcribe", odd, HELLO, "--model", model_path)
    assert_only_hello_transcribed(
        result,
        [
            f"{odd}: sample at frame 1 (0.000 s) does not fit the header's 7 bits per sample "
            "(the low 1 bit of its 8-bit container is set): the data is not laid out as the header says"
        ],
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_stdout_is_one_line_and_status_2_as_the_help_says(model_path: Path) -> None:
    result = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m audiomask transcribe {HELLO} --model {model_path} > /dev/full'],
        check=False,
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        cwd=ROOT,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert result.returncode == 2
    assert result.stderr == "audiomask: error: cannot write to <stdout>: No space left on device\n"
    help_text = " ".join(run_cli("transcribe", "--help").stdout.split())
    assert "2 a bad argument or model" in help_text
    assert "or when the results cannot be written (stdout full or failing" in help_text
