"""What every benchmark result records about its run, and how it is written (shared by scripts/bench_*.py).

``capture_environment(argv)`` returns the command, the date and the machine:
Python, numpy and torch versions, torch's thread count, the CPU, and the GPU
and driver where CUDA is available. ``write_result(path, payload)`` writes a
report as indented JSON, creating its folder.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["capture_environment", "write_result"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def driver_version() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi``, or ``None`` where it cannot be read."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0] if lines else None


def capture_environment(argv: Sequence[str]) -> dict:
    """The run's command (``argv`` as given to the script), date, versions and hardware, JSON-ready."""
    env: dict = {
        "command": " ".join([Path(sys.executable).name, *argv]),
        "argv": list(argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "numpy_version": np.__version__,
        "torch_version": None,
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
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(), driver=driver_version())
    return env


def write_result(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` as indented JSON (folders created) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
