"""How one host->device copy strategy is timed: on the host (idle, busy or kept-busy GPU), on the GPU, end to end.

A :class:`Strategy` is three calls: ``prepare`` (untimed, before any GPU work
is queued), ``run`` (the timed call) and ``finish`` (untimed, after it). The
passes time ``run`` in the GPU states of :mod:`audiomask.bench.transfer`:
:func:`host_pass` from a synchronised device (idle, or behind freshly queued
work), :func:`steady_pass` with the queue kept fed through a whole block,
:func:`gpu_pass` the copy alone on the GPU, :func:`end_to_end_pass` from the
lengths on the host to the mask on the device.

Right after work is queued on an idle GPU every CUDA call, whatever its
strategy, costs several times what it costs once the queue has run a while:
``SETTLE_MS`` of host work does not remove that, ``STEADY_LEAD_MS`` removes
most of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from audiomask.bench.harness import HostWorkload, QueueFeed, QueueFiller
from audiomask.bench.timing import percentiles

__all__ = [
    "GATE_MS",
    "SETTLE_MS",
    "STEADY_LEAD_MS",
    "STEADY_WARMUP_DEPTHS",
    "Strategy",
    "end_to_end_pass",
    "gpu_pass",
    "host_pass",
    "steady_pass",
]

SETTLE_MS = 1.0  # busy_hot: host work between queueing the GPU work and the timed call (the GPU is running it)
# busy_steady: the GPU runs the fed queue this long before a block's first copy (and again after the
# queue drained): 10 ms removes most of the transient after work is queued on an idle GPU.
STEADY_LEAD_MS = 10.0
# busy_steady: untimed repetitions last at least this many queue depths, so that blocks the caching
# allocators hand back only once the queue has passed them (a ring result used on the busy CUDA stream,
# pin_per_copy's pinned block) are being reused when timing starts, as in a server under load.
STEADY_WARMUP_DEPTHS = 2.0
GATE_MS = 20.0  # GPU work queued ahead of a GPU-side timing: longer than any strategy's host work


def _nothing(_: object) -> None:
    return None


@dataclass
class Strategy:
    """A copy strategy or a floor, run on a case (the payload it moves: any object its calls understand).

    ``prepare(case)`` runs untimed before the queue is filled and returns a state;
    ``run(case, stream, state)`` is the timed call; ``finish(state)`` runs untimed after it.
    ``end_to_end(case)``, where set, builds the case's mask (on the host or the device) and
    delivers it to the device: the whole way from lengths to a mask the encoder can use.
    """

    name: str
    side_stream: bool  # copies on a copy stream (timed there), not on the current CUDA stream
    run: Callable[[Any, torch.cuda.Stream | None, object], object]
    prepare: Callable[[Any], object] = _nothing
    finish: Callable[[object], None] = _nothing
    end_to_end: Callable[[Any], torch.Tensor] | None = None
    build_ms: list[float] = field(default_factory=list)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_call(
    strategy: Strategy, case: Any, state: object, consumer: torch.cuda.Stream | None
) -> tuple[float, float, bool]:
    """``(host ms of strategy.run, host ms of dropping its result, whether the consumer was still busy after)``."""
    start = time.perf_counter()
    result = strategy.run(case, None, state)
    elapsed = (time.perf_counter() - start) * 1e3
    queue_busy = consumer is not None and not consumer.query()
    start = time.perf_counter()
    del result
    freed = (time.perf_counter() - start) * 1e3
    return elapsed, freed, queue_busy


def _host_row(times: list[float], frees: list[float]) -> dict:
    row = {f"host_ms_{key}": value for key, value in percentiles(times).items()}
    row.update({f"free_ms_{key}": value for key, value in percentiles(frees).items() if key in ("p50", "p99")})
    return row


def host_pass(
    strategy: Strategy,
    case: Any,
    busy_ms: float,
    repeats: int,
    warmup: int,
    filler: QueueFiller | None,
    consumer: torch.cuda.Stream | None,
    wait_ms: float = 0.0,
    workload: HostWorkload | None = None,
) -> dict:
    """Host milliseconds of ``strategy.run`` behind ``busy_ms`` of queued work (0: idle), from a synchronised device.

    ``wait_ms``: the host first sleeps that long with the GPU idle, which leaves it as cold as the
    synchronise after a busy repetition does: the control that tells queue effects from host effects.
    ``workload``: wait for the previous repetition's GPU work while running host work
    (:class:`~audiomask.bench.harness.HostWorkload`) instead of blocking in a synchronise, and
    run it for ``SETTLE_MS`` after queueing the busy work, so the host is as hot as a streaming
    server's and the GPU already running the queue when the timed call starts.
    Without CUDA (``filler`` and ``consumer`` None) only idle cases run.
    """
    device = consumer.device if consumer is not None else torch.device("cpu")
    times, frees, still_busy = [], [], 0
    strategy.build_ms.clear()
    for i in range(warmup + repeats):
        if workload is not None:
            workload.wait_idle()
        else:
            _synchronize(device)
        if wait_ms:
            time.sleep(wait_ms / 1e3)
        state = strategy.prepare(case)
        if busy_ms:
            filler.fill(busy_ms, consumer)  # type: ignore[union-attr]
            if workload is not None:
                workload.run_for(SETTLE_MS)
        elapsed, freed, queue_busy = _timed_call(strategy, case, state, consumer)
        strategy.finish(state)
        if i >= warmup:
            times.append(elapsed)
            frees.append(freed)
            still_busy += queue_busy
    _synchronize(device)
    row = _host_row(times, frees)
    if busy_ms:
        row["queue_still_busy"] = still_busy / repeats
    if strategy.build_ms:
        row["build_ms_p50"] = float(np.median(strategy.build_ms[warmup:]))
    return row


def steady_pass(
    strategy: Strategy,
    case: Any,
    repeats: int,
    warmup: int,
    feed: QueueFeed,
    workload: HostWorkload,
) -> dict:
    """Host milliseconds of ``strategy.run`` with the GPU kept busy through the whole block (``busy_steady``).

    ``feed`` keeps at least its ``depth_ms`` of work queued on the current stream: it is topped up
    between copies, outside the timed region, and the depth queued right before each timed copy is
    recorded (``queue_ms_min`` / ``queue_ms_p50``: lower bounds, to within ``feed.piece_ms``). The GPU
    runs the queue for ``STEADY_LEAD_MS`` before the block's first copy; the untimed repetitions last
    ``warmup`` repetitions and ``STEADY_WARMUP_DEPTHS`` queue depths. A top-up that finds the queue
    drained (a copy that waited for it) lets the GPU run the new queue for ``STEADY_LEAD_MS`` again, and
    counts one ``gpu_idle_gaps`` in a timed repetition. Between copies the host runs a round of
    front-end-like work (``workload``), so it never idles either.
    """
    workload.wait_idle()
    feed.top_up()
    workload.run_for(STEADY_LEAD_MS)
    warm_until = time.perf_counter() + STEADY_WARMUP_DEPTHS * feed.depth_ms / 1e3
    times, frees, depths = [], [], []
    still_busy = gaps = untimed = 0
    strategy.build_ms.clear()
    while len(times) < repeats:
        timed = untimed >= warmup and time.perf_counter() >= warm_until
        workload.run_for(0.0)
        state = strategy.prepare(case)
        if feed.top_up():
            gaps += timed
            workload.run_for(STEADY_LEAD_MS)
        depth = feed.queued_ms()
        elapsed, freed, queue_busy = _timed_call(strategy, case, state, feed.stream)
        strategy.finish(state)
        if timed:
            times.append(elapsed)
            frees.append(freed)
            depths.append(depth)
            still_busy += queue_busy
        else:
            untimed += 1
    workload.wait_idle()
    row = _host_row(times, frees)
    row.update(
        queue_still_busy=still_busy / repeats,
        queue_ms_min=min(depths),
        queue_ms_p50=float(np.median(depths)),
        gpu_idle_gaps=gaps,
        untimed_reps=untimed,
    )
    if strategy.build_ms:
        row["build_ms_p50"] = float(np.median(strategy.build_ms[untimed:]))
    return row


def gpu_pass(
    strategy: Strategy, case: Any, repeats: int, warmup: int, filler: QueueFiller, side_stream: torch.cuda.Stream
) -> dict:
    """GPU milliseconds of the copy alone: GATE_MS of work queued ahead hides the host's share."""
    stream = side_stream if strategy.side_stream else torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spans = []
    for i in range(warmup + repeats):
        torch.cuda.synchronize()
        state = strategy.prepare(case)
        filler.fill(GATE_MS, stream)
        start.record(stream)
        strategy.run(case, stream if strategy.side_stream else None, state)
        end.record(stream)
        end.synchronize()
        strategy.finish(state)
        if i >= warmup:
            spans.append(start.elapsed_time(end))
    gpu_ms = float(np.median(spans))
    return {"gpu_ms_p50": gpu_ms, "gpu_ms_max": float(max(spans)), "gbps": case.nbytes / gpu_ms / 1e6}


def end_to_end_pass(strategy: Strategy, case: Any, device: torch.device, repeats: int, warmup: int) -> dict:
    """Milliseconds from the lengths on the host to the mask complete on ``device`` (build, copy, wait), idle GPU."""
    times = []
    for i in range(warmup + repeats):
        _synchronize(device)
        start = time.perf_counter()
        result = strategy.end_to_end(case)  # type: ignore[misc]
        _synchronize(device)  # the copy (or the build) has landed where the encoder reads it
        elapsed = (time.perf_counter() - start) * 1e3
        del result
        if i >= warmup:
            times.append(elapsed)
    stats = percentiles(times)
    return {"end_to_end_ms_p50": stats["p50"], "end_to_end_ms_p99": stats["p99"]}
