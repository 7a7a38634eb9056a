"""Measurement harness of the transfer benchmark and the GPU tests.

It holds a calibrated GPU queue filler (the "busy CUDA
stream" of the measurements), a feed that keeps a CUDA stream's queue at a known
depth, a host workload that keeps the host as busy as a streaming server's,
and the in-place mask builder used to fill ring slots.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from audiomask.transfer import resolve_device

__all__ = [
    "HostWorkload",
    "QueueFeed",
    "QueueFiller",
    "mask_builder",
]

# torch.cuda._sleep cycles per calibration round: milliseconds at a GPU's clocks, long enough to time well with
# events (figures: docs/defaults.md).
_CALIBRATION_CYCLES = 20_000_000
_CALIBRATION_ROUNDS = 2  # the first round also warms the clocks up; the last one counts
# Phi-4MM-like in-place mask: 8 feature frames per token, chunks of 16 tokens, 4 chunks of left context.
_TIME_REDUCTION = 8
_CHUNK_SIZE = 16
_LEFT_CHUNK = 4
_HOST_WORK_ELEMENTS = 1 << 18  # float32 operands of the host workload: 1 MiB each, enough for intra-op threads


class QueueFiller:
    """Queues a calibrated amount of GPU time (``torch.cuda._sleep``) on a CUDA stream.

    ``fill(50)`` leaves ~50 ms of work queued on the stream: the busy stream
    behind which a stalling copy waits. ``cycles_per_ms`` comes from timing
    ``_sleep`` with CUDA events at construction.
    """

    def __init__(self, device: object = "cuda") -> None:
        self.device = resolve_device(device)
        if self.device.type != "cuda":
            raise ValueError(f"QueueFiller needs a CUDA device, got {device!r}")
        self.cycles_per_ms = 0.0
        for _ in range(_CALIBRATION_ROUNDS):
            self.cycles_per_ms = _CALIBRATION_CYCLES / self._time_cycles(_CALIBRATION_CYCLES)

    def fill(self, ms: float, stream: torch.cuda.Stream | None = None) -> None:
        """Queue ~``ms`` milliseconds of GPU work on ``stream`` (default: the current CUDA stream)."""
        with torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream(self.device)):
            torch.cuda._sleep(int(ms * self.cycles_per_ms))

    def measure(self, ms: float) -> float:
        """Milliseconds that ``fill(ms)`` keeps the GPU busy, measured with CUDA events."""
        return self._time_cycles(int(ms * self.cycles_per_ms))

    def _time_cycles(self, cycles: int) -> float:
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            torch.cuda._sleep(cycles)
            end.record(stream)
        end.synchronize()
        return start.elapsed_time(end)


class QueueFeed:
    """Keeps at least ``depth_ms`` of GPU work queued on ``stream`` whenever it is topped up.

    The GPU of a server under load never drains between copies. A copy made
    in the first milliseconds after work is queued on an idle GPU costs many
    times more host time, whatever its strategy (figures: docs/defaults.md), so a measurement that fills an
    idle GPU before every copy measures that transient, not the busy GPU.
    Work is queued in pieces of ``piece_ms``,
    each followed by an event: the depth still queued is then known from
    event queries alone, to within the piece that is running.

    Args:
        filler: the calibrated source of GPU work.
        stream: the CUDA stream kept busy (the copies' consumer).
        depth_ms: milliseconds of work :meth:`top_up` leaves queued, at least.
        piece_ms: milliseconds per queued piece: the resolution of :meth:`queued_ms`.
    """

    def __init__(self, filler: QueueFiller, stream: torch.cuda.Stream, depth_ms: float, piece_ms: float = 1.0) -> None:
        if not depth_ms > 0:
            raise ValueError(f"depth_ms must be > 0, got {depth_ms}")
        if not 0 < piece_ms <= depth_ms:
            raise ValueError(f"piece_ms must be > 0 and <= depth_ms ({depth_ms}), got {piece_ms}")
        self.filler, self.stream = filler, stream
        self.depth_ms, self.piece_ms = depth_ms, piece_ms
        self._pieces: deque[torch.cuda.Event] = deque()  # one event after each piece still queued, oldest first
        self._spare: list[torch.cuda.Event] = []  # events of completed pieces, recorded again by later pieces

    def queued_ms(self) -> float:
        """Milliseconds of work queued on the CUDA stream now, at least: whole pieces not yet started.

        Events complete in queue order, so the pieces whose events have not
        completed are the queue; the first of them may be running, so it does
        not count.
        """
        pieces = self._pieces
        while pieces and pieces[0].query():
            self._spare.append(pieces.popleft())
        return max(len(pieces) - 1, 0) * self.piece_ms

    def top_up(self) -> bool:
        """Queue pieces until at least ``depth_ms`` is queued; return whether the queue had drained before.

        ``True`` means the GPU ran out of work since the last top-up (or was
        never fed): it went idle, and the next copy follows a fresh queue.
        """
        self.queued_ms()
        drained = not self._pieces
        missing = math.ceil(self.depth_ms / self.piece_ms) + 1 - len(self._pieces)
        for _ in range(missing):
            self.filler.fill(self.piece_ms, self.stream)
            event = self._spare.pop() if self._spare else torch.cuda.Event()
            event.record(self.stream)
            self._pieces.append(event)
        return drained


class HostWorkload:
    """Keeps the host busy the way a streaming server's is, while it waits for the GPU to drain.

    A driver's host never idles between chunks: it computes the next chunk's
    features with torch's intra-op threads. A measurement that instead blocks in
    ``torch.cuda.synchronize()`` for tens of ms leaves the cores, their caches
    and torch's thread pool cold, and the next call of *any* strategy then costs
    many times more. ``wait_idle()`` waits for the device
    while running small torch CPU kernels (front-end-like work), so the timed
    call that follows starts on a hot host.

    >>> HostWorkload("cpu").wait_idle()  # no CUDA device to wait for: one round of work
    1
    """

    def __init__(self, device: object = "cuda") -> None:
        self.device = resolve_device(device)
        self._left = torch.rand(_HOST_WORK_ELEMENTS)
        self._right = torch.rand(_HOST_WORK_ELEMENTS)
        self._out = torch.empty(_HOST_WORK_ELEMENTS)

    def wait_idle(self) -> int:
        """Run host work until the device's current CUDA stream has drained, then synchronise; return the rounds done.

        The final ``torch.cuda.synchronize()`` only catches short work left on
        other CUDA streams (copies), so the host does not go idle in it.
        """
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
        rounds = 0
        while True:
            torch.mul(self._left, self._right, out=self._out)
            rounds += 1
            if done is None or done.query():
                break
        if done is not None:
            torch.cuda.synchronize(self.device)
        return rounds

    def run_for(self, ms: float) -> int:
        """Run host work for ``ms`` milliseconds (at least one round); return the rounds done.

        What a driver's host does between launching a GPU step and submitting
        the next chunk's copies: it computes that chunk's features.

        >>> HostWorkload("cpu").run_for(0.0)
        1
        """
        end = time.perf_counter() + ms / 1e3
        rounds = 0
        while True:
            torch.mul(self._left, self._right, out=self._out)
            rounds += 1
            if time.perf_counter() >= end:
                return rounds


def mask_builder() -> tuple[str, Callable[[np.ndarray, np.random.Generator], None]]:
    """A builder that writes a ``(B, L, L)`` bool mask in place: ``(name, build(out, rng))``.

    It is Phi-4MM's ``hs_mask`` with random feature lengths, or, where
    :mod:`audiomask.masks` is missing, a plain fill.

    >>> name, build = mask_builder()
    >>> out = np.zeros((2, 4, 4), dtype=bool)
    >>> build(out, np.random.default_rng(0))
    >>> bool(out[:, :, 0].all())  # every query may attend to the first key
    True
    """
    try:
        from audiomask.masks.phi4mm import hs_mask
    except ImportError:
        return "numpy fill", lambda out, rng: out.fill(True)

    def build(out: np.ndarray, rng: np.random.Generator) -> None:
        batch, tokens, _ = out.shape
        max_frames = tokens * _TIME_REDUCTION
        lengths = rng.integers(1, max_frames + 1, size=batch)
        hs_mask(lengths, max_frames, _CHUNK_SIZE, _LEFT_CHUNK, _TIME_REDUCTION, out=out)

    return "audiomask.masks.phi4mm.hs_mask", build
