"""What every benchmark result records about its run, and how it is written.

``capture_environment(argv)`` returns the command, the date, the git commit
and the machine: Python, numpy, torch and torchaudio versions, torch's thread
count, the CPU, its core count and how fast one of its cores runs Python
(:func:`python_speed`), and the GPU and driver where CUDA is available.
``write_result(path, payload)`` writes a report as indented JSON, creating
its folder.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "capture_environment",
    "command_output",
    "cpu_model",
    "driver_version",
    "git_commit",
    "python_speed",
    "write_result",
]

_REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout this module was imported from
_COMMAND_TIMEOUT_S = 30  # nvidia-smi / git: never hang a benchmark on them
SPEED_LOOPS = 200_000  # one round of python_speed's loop: ~10-20 ms on a server core
SPEED_ROUNDS = 7  # python_speed keeps the fastest: a slower round met other work on its core


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def python_speed(loops: int = SPEED_LOOPS, rounds: int = SPEED_ROUNDS) -> float:
    """How fast one core runs this interpreter: millions of iterations a second of a fixed pure-Python loop
    (a call, an attribute, a dict and a list operation each), the fastest of ``rounds`` rounds of ``loops``.

    Machines of one kind (the same CPU model name) may differ in it, and a server bound by its host runs
    slower on a slower core: two results of a host-bound benchmark compare only with it beside them.

    >>> python_speed(loops=1000, rounds=1) > 0
    True
    """
    table: dict[int, int] = {}
    items: list[int] = []
    best = float("inf")
    for _ in range(rounds):
        table.clear()
        items.clear()
        started = time.perf_counter()
        for index in range(loops):
            table[index & 1023] = len(items)
            items.append(index)
        best = min(best, time.perf_counter() - started)
    return round(loops / best / 1e6, 2)


def command_output(command: Sequence[str], cwd: Path | None = None) -> str | None:
    """First line of ``command``'s output, or ``None`` where it cannot run or fails."""
    try:
        result = subprocess.run(
            list(command), capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=True, cwd=cwd
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0] if lines else None


def driver_version() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi``, or ``None`` where it cannot be read."""
    return command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])


GIT_COMMIT_VARIABLE = "AUDIOMASK_GIT_COMMIT"


def git_commit() -> str | None:
    """The checkout's commit (``HEAD``), with ``+dirty`` when tracked files differ from it; ``None`` outside git.

    A copy of the tree whose ``.git`` is missing or stale (a tarball, a remote
    machine that receives the working tree only) names its commit in the
    ``AUDIOMASK_GIT_COMMIT`` environment variable, which then wins.
    """
    named = os.environ.get(GIT_COMMIT_VARIABLE)
    if named:
        return named
    commit = command_output(["git", "rev-parse", "HEAD"], cwd=_REPOSITORY)
    if commit is None:
        return None
    dirty = command_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPOSITORY)
    return commit + ("+dirty" if dirty else "")


def capture_environment(argv: Sequence[str]) -> dict:
    """The run's command (``argv`` as given to the script), date, commit, versions and hardware, JSON-ready."""
    env: dict = {
        "command": " ".join([Path(sys.executable).name, *argv]),
        "argv": list(argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python_speed_mloops_s": python_speed(),
        "numpy_version": np.__version__,
        "torch_version": None,
        "torchaudio_version": None,
        "torch_threads": None,
        "cuda_version": None,
        "gpu": None,
        "driver": None,
    }
    try:
        import torch
    except ImportError:
        return env
    env.update(torch_version=torch.__version__, torch_threads=torch.get_num_threads(), cuda_version=torch.version.cuda)
    try:
        import torchaudio

        env["torchaudio_version"] = torchaudio.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(), driver=driver_version())
    return env


def write_result(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` as indented JSON (folders created) and say where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
