"""How busy the GPU is while a benchmark runs: ``nvidia-smi``'s utilisation, sampled in a process beside it.

``utilization.gpu`` is the share of the last sample period in which one kernel or more ran on the device:
a server that keeps it well under 100 % under a load it cannot hold is bound by its host, not its GPU.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

__all__ = ["SAMPLE_MS", "gpu_busy", "means_per_span"]

SAMPLE_MS = 500  # nvidia-smi's period: two samples a second
STOP_TIMEOUT_S = 5.0


@contextlib.contextmanager
def gpu_busy(device: int | None) -> Iterator[list[tuple[float, float]]]:
    """A list that fills, while the block runs, with ``(t_s, percent)``: seconds since the block began and GPU
    ``device``'s utilisation (0-100) every :data:`SAMPLE_MS` ms. ``None``, or no ``nvidia-smi`` on the path:
    it stays empty."""
    samples: list[tuple[float, float]] = []
    command = shutil.which("nvidia-smi")
    if device is None or command is None:
        yield samples
        return
    query = [command, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", f"--id={device}"]
    process = subprocess.Popen([*query, f"--loop-ms={SAMPLE_MS}"], stdout=subprocess.PIPE, text=True)
    started = time.perf_counter()

    def read() -> None:
        for line in process.stdout:
            with contextlib.suppress(ValueError):  # a line that is not a number ("[N/A]"): no sample
                samples.append((round(time.perf_counter() - started, 2), float(line)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield samples
    finally:
        process.terminate()
        process.wait(STOP_TIMEOUT_S)
        reader.join(STOP_TIMEOUT_S)


def means_per_span(samples: list[tuple[float, float]], seconds: int = 10) -> list[dict]:
    """The mean utilisation over each ``seconds`` of the run: ``{"t_s": start, "percent": mean, "samples": n}``.

    >>> means_per_span([(0.5, 10.0), (1.0, 30.0), (10.5, 50.0)])
    [{'t_s': 0, 'percent': 20.0, 'samples': 2}, {'t_s': 10, 'percent': 50.0, 'samples': 1}]
    """
    spans: dict[int, list[float]] = {}
    for t_s, percent in samples:
        spans.setdefault(int(t_s // seconds) * seconds, []).append(percent)
    return [
        {"t_s": start, "percent": round(sum(values) / len(values), 1), "samples": len(values)}
        for start, values in sorted(spans.items())
    ]
