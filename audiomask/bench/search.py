"""How many concurrent real-time streams a probe (:mod:`audiomask.bench.throughput`) holds, and what stops it.

:func:`search` doubles ``N`` from ``start`` until a probe fails, then bisects
between the last pass and the first failure to within :data:`TOLERANCE`,
within its time budget; with ``counts`` it probes those stream counts alone
(the short form: the committed capacities checked again after a change, in
minutes). A probe that raises (out of device memory, a staging request above
the pinned ring's bound) fails and records why. :func:`limiting_resource`
names from a probe's costs what stops a row; :func:`memory_per_stream` and
:func:`host_cores` say what a stream costs and what the host lent.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from audiomask.bench.limits import device_memory_bytes
from audiomask.bench.throughput import ProbeTimes
from audiomask.bench.timing import MS_PER_S, Budget, log, percentiles
from audiomask.features.process import available_cores

__all__ = [
    "ENQUEUE_STEP",
    "HOST_STAGES",
    "RESOURCES",
    "TIME_BUDGET",
    "TOLERANCE",
    "host_cores",
    "judged_costs",
    "limiting_resource",
    "memory_per_stream",
    "search",
]

TOLERANCE = 0.05  # bisection stops when the bracket is within 5 % of the last passing N
# Of the device's memory: a probe predicted to peak above it is not run. The prediction, linear from the
# largest clean probe, overestimates (a step's fixed activations are counted per stream); a Phi-4MM step that
# peaks at 97 % of an H100's memory runs (figures: docs/benchmarks.md).
MEMORY_FRACTION = 0.96
GPU_COMPUTE, GPU_MEMORY, HOST_FRONTEND, HOST_LOOP = "gpu compute", "gpu memory", "host front end", "host driver loop"
RESOURCES = (GPU_COMPUTE, GPU_MEMORY, HOST_FRONTEND, HOST_LOOP)
TIME_BUDGET = "time budget"  # the search stopped for time before a probe settled the row
COST_FIELDS = ("gpu_ms_per_cycle", "frontend_ms_per_cycle", "host_ms_per_cycle")  # a probe's mean costs per cycle
_WALL_COSTS = ("gpu_s", "frontend_s", "waited_s")  # the ChunkCost fields behind COST_FIELDS
# The driver's main thread by stage (ChunkCost's *_cpu_s): its CPU ms per cycle, where host_ms_per_cycle goes;
# ENQUEUE_STEP, reported beside them, is the part of the enqueue spent in the encoder step's call.
HOST_STAGES = ("feed", "enqueue", "loop")
ENQUEUE_STEP = "step"


def _release_memory(device: torch.device) -> None:
    """On CUDA, give the last probe's buffers back, so that the next one starts from the same free device memory
    (probes on the CPU measure no memory)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def _cost_fields(times: ProbeTimes) -> dict:
    """Mean milliseconds per cycle (one chunk of every stream) of the device, the front end and host work; for a
    driver, ``host_cpu_ms_per_cycle``: the main thread's CPU ms per cycle by stage (:data:`HOST_STAGES`)."""
    if not times.costs:
        return {}
    seconds = np.array(times.seconds)
    gpu, frontend, waited = (np.array([getattr(cost, name) for cost in times.costs]) for name in _WALL_COSTS)
    host = np.maximum(seconds - waited, 0.0)
    means = [float(values.mean() * MS_PER_S) for values in (gpu, frontend, host)]
    fields = {
        **dict(zip(COST_FIELDS, means)),
        "gpu_busy": float(gpu.sum() / seconds.sum()),  # of the cycles' wall time
        "frontend_processes": times.frontend_processes,
        "torch_threads": times.torch_threads,
        "driver_processes": times.driver_processes,
    }
    if all(cost.feed_cpu_s is not None for cost in times.costs):
        fields["host_cpu_ms_per_cycle"] = {
            stage: float(np.mean([getattr(cost, f"{stage}_cpu_s") for cost in times.costs]) * MS_PER_S)
            for stage in (*HOST_STAGES, ENQUEUE_STEP)
        }
    return fields


def _run_probe(probe: Callable[[int], ProbeTimes], streams: int, duration_ms: float, device: torch.device) -> dict:
    """One probe as a JSON-ready row: passed, chunk latency percentiles and costs, or the error that failed it.

    On CUDA the row also holds the memory allocated before the probe (``baseline_bytes``: weights)
    and its peak (``peak_bytes``), from which :func:`search` predicts larger probes.
    """
    began = time.perf_counter()
    row: dict = {"streams": streams}
    cuda = device.type == "cuda"
    elsewhere = 0  # the peak device bytes of the probe's other driver processes
    if cuda:
        row["baseline_bytes"] = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        with torch.no_grad():
            times = probe(streams)
    except (torch.OutOfMemoryError, RuntimeError, ValueError) as error:
        row.update(ok=False, error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
    else:
        stats = percentiles([s * MS_PER_S for s in times.seconds])
        row.update({f"chunk_ms_{key}": value for key, value in stats.items()})
        row.update(timed_chunks=len(times.seconds), stopped_early=times.stopped, setup_s=times.setup_s)
        row.update(ok=not times.stopped and stats["p99"] < duration_ms, **_cost_fields(times))
        elsewhere = times.peak_bytes_elsewhere
    finally:
        if cuda:
            row["peak_bytes"] = torch.cuda.max_memory_allocated(device) + elsewhere
        _release_memory(device)
    row["wall_s"] = time.perf_counter() - began
    return row


def _predicted_peak(probes: list[dict], streams: int) -> int | None:
    """Peak device bytes of a probe of ``streams``, extrapolated linearly from the largest probe that ran cleanly."""
    measured = [row for row in probes if "peak_bytes" in row and "error" not in row]
    if not measured:
        return None
    largest = max(measured, key=lambda row: row["streams"])
    per_stream = (largest["peak_bytes"] - largest["baseline_bytes"]) / largest["streams"]
    return int(largest["baseline_bytes"] + per_stream * streams)


def _out_of_memory(row: dict) -> bool:
    """Whether a probe failed for device memory: not run for its predicted peak, or out of memory while running."""
    error = row.get("error", "")
    return "predicted_peak_bytes" in row or "OutOfMemoryError" in error or "out of memory" in error.lower()


def _deciding_probe(probes: Sequence[dict]) -> dict:
    """The probe that settles a search: the smallest failing one, or else the largest."""
    failed = [row for row in probes if not row["ok"]]
    return min(failed, key=lambda row: row["streams"]) if failed else max(probes, key=lambda row: row["streams"])


def judged_costs(probes: Sequence[dict]) -> dict | None:
    """The per-cycle costs :func:`limiting_resource` judges: the deciding probe's (:func:`search`'s), or where it
    raised without them, the largest probe's that has them; ``None`` where no probe measured costs."""
    costed = [row for row in probes if "gpu_ms_per_cycle" in row]
    if not costed:
        return None
    deciding = _deciding_probe(probes)
    judged = deciding if "gpu_ms_per_cycle" in deciding else max(costed, key=lambda row: row["streams"])
    return {key: judged[key] for key in ("streams", *COST_FIELDS, "gpu_busy", "host_cpu_ms_per_cycle") if key in judged}


def limiting_resource(probes: Sequence[dict], limited_by: str, device_bytes: int | None) -> str | None:
    """What stops a throughput row: one of :data:`RESOURCES`, :data:`TIME_BUDGET`, or ``None``.

    ``probes``: the search's probe rows; ``limited_by``: what ended the search
    (:func:`search`); ``device_bytes``: the device's memory (``None`` on the CPU).
    The rule, in order:

    1. the search stopped for time: :data:`TIME_BUDGET`;
    2. the deciding probe is the smallest failing one, or else the largest:
       ``"gpu memory"`` where it failed for memory (out of memory, or not run
       for its predicted peak) or peaked at :data:`MEMORY_FRACTION` of ``device_bytes`` or more;
    3. otherwise the largest per-cycle cost of :func:`judged_costs`: device
       busy time ``"gpu compute"``, front-end compute ``"host front end"``, the
       main thread's own work ``"host driver loop"``; ``None`` where no probe measured costs.

    >>> probes = [{"streams": 1, "ok": True, "gpu_ms_per_cycle": 5.0, "frontend_ms_per_cycle": 1.0,
    ...            "host_ms_per_cycle": 2.0, "gpu_busy": 0.6}, {"streams": 2, "ok": False, "gpu_ms_per_cycle": 9.0,
    ...            "frontend_ms_per_cycle": 12.0, "host_ms_per_cycle": 3.0, "gpu_busy": 0.4}]
    >>> limiting_resource(probes, "latency", None), limiting_resource(probes, "budget", None)
    ('host front end', 'time budget')
    """
    if limited_by == "budget":
        return TIME_BUDGET
    if not probes:
        return None
    deciding = _deciding_probe(probes)
    peak = deciding.get("peak_bytes", deciding.get("predicted_peak_bytes", 0))
    if _out_of_memory(deciding) or (device_bytes is not None and peak >= MEMORY_FRACTION * device_bytes):
        return GPU_MEMORY
    costs = judged_costs(probes)
    if costs is None:
        return None
    return max(zip(COST_FIELDS, (GPU_COMPUTE, HOST_FRONTEND, HOST_LOOP)), key=lambda pair: costs[pair[0]])[1]


def memory_per_stream(probes: Sequence[dict]) -> float | None:
    """Device bytes per stream: the least-squares slope of peak memory over streams (clean probes; CUDA only).

    ``None`` with fewer than two stream counts measured.

    >>> round(memory_per_stream([{"streams": 1, "peak_bytes": 300}, {"streams": 4, "peak_bytes": 900}]))
    200
    """
    measured = [row for row in probes if "peak_bytes" in row and "error" not in row]
    if len({row["streams"] for row in measured}) < 2:
        return None
    slope, _ = np.polyfit([row["streams"] for row in measured], [row["peak_bytes"] for row in measured], 1)
    return float(slope)


def host_cores(probes: Sequence[dict]) -> dict:
    """The host's share of a row: cores this process may run on, and the most torch threads and front-end processes
    a probe used.

    >>> host_cores([{"torch_threads": 1, "frontend_processes": 1}, {"torch_threads": 2, "frontend_processes": 0}])[
    ...     "frontend_processes"]
    1
    """
    return {
        "allowed": available_cores(),
        **{key: max((row.get(key, 0) for row in probes), default=0) for key in ("torch_threads", "frontend_processes")},
    }


def search(
    probe: Callable[[int], ProbeTimes],
    settings: dict,
    device: torch.device,
    budget: Budget,
    max_streams: int,
    start: int = 1,
    counts: Sequence[int] | None = None,
) -> dict:
    """The largest ``N <= max_streams`` whose probe passes: doubling from ``start``, then bisection; JSON-ready.

    ``start``: the first ``N`` tried (a row known to pass it spends its budget
    near its limit); when it fails, the bisection runs between 0 and it.
    ``counts``: probe these stream counts instead, smallest first, up to the
    first that fails (no doubling, no bisection; ``start`` and ``max_streams``
    are not used): ``max_streams`` is then the largest count that passed.

    ``limited_by`` says what ended the search: ``"latency"`` (a probe's p99
    reached the chunk's duration), ``"memory"`` (on CUDA, a probe's peak
    memory, extrapolated from the largest clean probe, would exceed
    :data:`MEMORY_FRACTION` of the device's: it is not run, so that no
    out-of-memory error hits a CUDA graph capture), ``"error"`` (a probe
    raised), ``"budget"`` (time ran out: the bracket is then wider than the
    tolerance) or ``"max_streams"``. ``limiting_resource`` says what stops the
    row (:func:`limiting_resource`), ``bytes_per_stream`` what a stream costs on
    the device (:func:`memory_per_stream`), ``host_cores`` what the host lent (:func:`host_cores`).
    With ``counts``, ``limited_by`` is ``"counts"`` where every count passed.
    """
    duration_ms = float(settings["chunk_ms"])
    probes: list[dict] = []
    passed, failed = 0, None  # the largest passing N, the smallest failing N
    device_bytes = device_memory_bytes(device)
    memory_bound = MEMORY_FRACTION * device_bytes if device_bytes is not None else None

    def run(streams: int) -> bool:
        predicted = _predicted_peak(probes, streams) if memory_bound is not None else None
        if predicted is not None and predicted > memory_bound:
            row = {
                "streams": streams,
                "ok": False,
                "predicted_peak_bytes": predicted,
                "wall_s": 0.0,
                "error": f"not run: predicted peak {predicted / 2**30:.1f} GiB > {memory_bound / 2**30:.1f} GiB",
            }
        else:
            row = _run_probe(probe, streams, duration_ms, device)
        probes.append(row)
        shown = f"p99 {row['chunk_ms_p99']:.1f} ms" if "chunk_ms_p99" in row else row.get("error", "")
        log(f"  {settings['model']}/{settings['path']} N={streams}: {'pass' if row['ok'] else 'fail'} ({shown})")
        return row["ok"]

    def affordable(streams: int) -> bool:
        """Whether a probe of ``streams`` fits the budget, extrapolated from the last one that ran.

        Its set-up (a driver's front-end processes started) is taken as fixed, the rest as growing with ``N``.
        """
        ran = [row for row in probes if row["wall_s"] > 0]
        if not ran:
            return not budget.expired()
        last = ran[-1]
        fixed = min(last.get("setup_s", 0.0), last["wall_s"])
        return budget.left() > fixed + (last["wall_s"] - fixed) * max(streams / last["streams"], 1.0)

    limited_by = "max_streams"
    if counts is not None:
        limited_by = "counts"
        for streams in sorted(counts):
            if not run(streams):
                failed = streams
                break
            passed = streams
    streams = min(max(start, 1), max_streams)
    while counts is None:  # doubling
        if not affordable(streams):
            limited_by = "budget"
            break
        if not run(streams):
            failed = streams
            break
        passed = streams
        if streams >= max_streams:
            break
        streams = min(2 * streams, max_streams)
    while counts is None and failed is not None and failed - passed > max(1, TOLERANCE * passed):  # bisection
        middle = (passed + failed) // 2
        if not affordable(middle):
            limited_by = "budget"
            break
        if run(middle):
            passed = middle
        else:
            failed = middle
    if failed is not None and limited_by != "budget":
        failure = next(row for row in probes if row["streams"] == failed)
        limited_by = "memory" if _out_of_memory(failure) else "error" if "error" in failure else "latency"
    best = next((row for row in probes if row["streams"] == passed and row["ok"]), None)
    return {
        **settings,
        "criterion": f"p99 chunk latency < chunk duration ({duration_ms:g} ms)",
        "max_streams": passed,
        "first_failing": failed,
        "limited_by": limited_by,
        "limiting_resource": limiting_resource(probes, limited_by, device_bytes),
        "cycle_costs": judged_costs(probes),
        "bytes_per_stream": memory_per_stream(probes),
        "device_bytes": device_bytes,
        "host_cores": host_cores(probes),
        "max_streams_chunk_ms_p99": best["chunk_ms_p99"] if best else None,
        "audio_s_per_s": passed * duration_ms / best["chunk_ms_p50"] if best else 0.0,
        "probes": probes,
    }
