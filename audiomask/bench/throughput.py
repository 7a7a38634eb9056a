"""Concurrent real-time streams: the most streams whose p99 chunk latency stays below the chunk's duration.

All ``N`` streams of a probe are in phase: at every chunk boundary each has
one new chunk of audio, and the chunk's *latency* runs from that moment to
the result: a real-time system keeps up while it is below the chunk's
duration (then no overlap across chunks is possible, so a chunk's features
and its encoder step run one after the other). Two ways to run a probe:

- ``driver``: :class:`~audiomask.asr.driver.StreamingDriver`, the whole
  recognizer: every stream's samples fed, then one cycle (front end for all
  ``N`` streams in one batched call, masks, transfer, encoder step, CTC head,
  argmax back on the host, greedy decoding). Phi-4MM models only.
- ``encoder_step``: the encoder's streaming step alone, from host features
  (the front end's output, random here) to the encoder outputs complete on
  the device, where their consumer (a CTC head, an LLM decoder) would read
  them: ``Phi4MMStream.step`` (one cache-aware chunk step), or for
  Qwen3-ASR ``Qwen3ASRStream.push`` of one 1 s conv chunk plus ``partial()``
  (the provisional outputs of the current 8 s attention window, what a
  streaming decoder reads). The benchmark's Qwen3-ASR model is an encoder
  without a CTC head, so this is how it is measured; for Phi-4MM it
  separates the GPU's capacity from the host's.

Each probe runs ``warmup`` untimed chunks (at least one per ring phase of the
key/value cache: every phase is a CUDA graph of its own, captured on first
use), then up to ``chunks`` timed ones; it stops early once two timed chunks
have exceeded the chunk's duration (with at most 101 chunks, their p99 then
does too). :func:`search` doubles ``N`` from 1 until a probe fails, then
bisects between the last pass and the first failure to within
:data:`TOLERANCE`, within its time budget. A probe that raises (out of
device memory, a staging request above the pinned ring's bound) fails and
records why.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from audiomask.bench.models import BenchModel
from audiomask.bench.signals import shared_noise
from audiomask.bench.timing import MS_PER_S, Budget, log, percentiles
from audiomask.constants import FRAME_MS, SAMPLE_RATE
from audiomask.streaming import Phi4MMStream, Qwen3ASRStream

__all__ = ["PATHS", "TOLERANCE", "ProbePlan", "make_probe", "search", "timed_chunks"]

PATHS = ("driver", "encoder_step")
TOLERANCE = 0.05  # bisection stops when the bracket is within 5 % of the last passing N
MEMORY_FRACTION = 0.92  # of the device's memory: a probe predicted to peak above it is not run
EXCEEDED_TO_FAIL = 2  # timed chunks over the duration that settle a probe (p99 over at most 101 chunks)


@dataclass(frozen=True)
class ProbePlan:
    """How many chunks a probe runs: ``warmup`` untimed (added to one per ring phase), then ``chunks`` timed."""

    warmup: int
    chunks: int


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release_memory(device: torch.device) -> None:
    """Give the last probe's buffers back, so that the next one starts from the same free memory."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed_chunks(step: Callable[[int], None], warmup: int, plan: ProbePlan, duration_s: float) -> tuple[list, bool]:
    """Run ``step(index)`` for ``warmup`` untimed then up to ``plan.chunks`` timed indices; ``(seconds, stopped)``.

    ``seconds``: wall seconds of each timed step. ``stopped`` is ``True`` when the probe stopped early: two
    timed steps reached ``duration_s`` (seconds) before all ran, which settles it as failed.
    """
    seconds, exceeded = [], 0
    for index in range(warmup + plan.chunks):
        began = time.perf_counter()
        step(index)
        elapsed = time.perf_counter() - began
        if index < warmup:
            continue
        seconds.append(elapsed)
        exceeded += elapsed >= duration_s
        if exceeded >= EXCEEDED_TO_FAIL and len(seconds) < plan.chunks:
            return seconds, True
    return seconds, False


def _driver_probe(model: BenchModel, chunk_size: int, left_chunk: int, plan: ProbePlan, cuda_graph: bool | None):
    """``probe(streams) -> (seconds per timed chunk, stopped early)`` through the whole driver."""

    def probe(streams: int) -> tuple[list, bool]:
        driver = model.driver(streams, chunk_size, left_chunk, cuda_graph=cuda_graph)
        try:
            warmup = plan.warmup + left_chunk + 1
            first, later = driver.first_block_samples, driver.block_samples
            source, starts = shared_noise(streams, first + (warmup + plan.chunks) * later)
            handles = [driver.open() for _ in range(streams)]
            position = [0]

            def step(index: int) -> None:
                size = first if index == 0 else later
                for handle, start in zip(handles, starts):
                    begin = start + position[0]
                    driver.feed(handle, source[begin : begin + size])
                position[0] += size
                if driver.advance() != 1:
                    raise RuntimeError(f"chunk {index}: the driver did not run exactly one cycle (a bug)")

            return timed_chunks(step, warmup, plan, later / SAMPLE_RATE)
        finally:
            driver.close()

    return probe


def _phi4mm_step_probe(model: BenchModel, chunk_size: int, left_chunk: int, plan: ProbePlan, cuda_graph: bool):
    encoder, device = model.asr.encoder, model.device
    frames = chunk_size * encoder.config.time_reduction
    block = np.random.default_rng(0).standard_normal((frames, encoder.config.input_size)).astype(np.float32)

    def probe(streams: int) -> tuple[list, bool]:
        stream = Phi4MMStream(encoder, streams, chunk_size, left_chunk, cuda_graph=cuda_graph)
        features = np.tile(block, (streams, 1, 1))  # (N, frames, 80) host float32, as the front end gives
        valid = np.full(streams, frames)

        def step(index: int) -> None:
            stream.step(features, valid)
            _synchronize(device)

        return timed_chunks(step, plan.warmup + left_chunk + 1, plan, frames * FRAME_MS / MS_PER_S)

    return probe


def _qwen3_step_probe(model: BenchModel, plan: ProbePlan):
    encoder, device = model.encoder, model.device
    config = encoder.config
    block = np.random.default_rng(0).standard_normal((config.num_mel_bins, config.chunk_frames)).astype(np.float32)

    def probe(streams: int) -> tuple[list, bool]:
        stream = Qwen3ASRStream(encoder, streams)
        features = torch.from_numpy(np.tile(block, (streams, 1, 1)))  # (N, 128, 100) host float32

        def step(index: int) -> None:
            stream.push(features)
            stream.partial()
            _synchronize(device)

        # Every position in the 8-chunk attention window costs differently: warm up and time whole windows.
        windows = -(-plan.chunks // config.chunks_per_window) * config.chunks_per_window
        return timed_chunks(
            step, config.chunks_per_window, ProbePlan(0, windows), config.chunk_frames * FRAME_MS / MS_PER_S
        )

    return probe


def make_probe(
    model: BenchModel,
    path: str,
    plan: ProbePlan,
    *,
    chunk_size: int = 0,
    left_chunk: int = 0,
    cuda_graph: bool | None = None,
) -> tuple[Callable[[int], tuple[list, bool]], dict]:
    """``(probe, settings)``: ``probe(streams)`` times chunks of ``streams`` concurrent streams.

    ``chunk_size`` (tokens) and ``left_chunk`` (chunks) apply to Phi-4MM
    models; Qwen3-ASR streams its fixed 1 s conv chunks in 8 s windows.
    ``cuda_graph``: replay the Phi-4MM chunk step as CUDA graphs (``None``: the driver's default).
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    settings: dict = {"model": model.name, "path": path, "dtype": str(model.dtype).removeprefix("torch.")}
    if model.asr is None:
        if path == "driver":
            raise ValueError(f"the driver runs Phi-4MM models only, got {model.name!r}")
        config = model.encoder.config
        settings.update(
            chunk_ms=config.chunk_frames * FRAME_MS,
            window_ms=config.n_window_infer * FRAME_MS,
            latency_until="encoder outputs of the current window (partial) complete on the device",
            why_encoder_step="the streaming driver runs Phi-4MM encoders only",
        )
        return _qwen3_step_probe(model, plan), settings
    cuda = model.device.type == "cuda"
    settings.update(
        chunk_ms=chunk_size * model.asr.encoder.config.time_reduction * FRAME_MS,
        chunk_size=chunk_size,
        left_chunk=left_chunk,
        cuda_graph=(cuda if cuda_graph is None else cuda_graph),
    )
    if path == "driver":
        settings["latency_until"] = "CTC argmax of the chunk on the host, decoded (features included)"
        return _driver_probe(model, chunk_size, left_chunk, plan, cuda_graph), settings
    settings["latency_until"] = "encoder outputs complete on the device (host features in; front end excluded)"
    return _phi4mm_step_probe(model, chunk_size, left_chunk, plan, settings["cuda_graph"]), settings


def _run_probe(
    probe: Callable[[int], tuple[list, bool]], streams: int, duration_ms: float, device: torch.device
) -> dict:
    """One probe as a JSON-ready row: passed, chunk latency percentiles, or the error that failed it.

    On CUDA the row also holds the memory allocated before the probe (``baseline_bytes``: weights)
    and its peak (``peak_bytes``), from which :func:`search` predicts larger probes.
    """
    began = time.perf_counter()
    row: dict = {"streams": streams}
    cuda = device.type == "cuda"
    if cuda:
        row["baseline_bytes"] = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        with torch.no_grad():
            seconds, stopped = probe(streams)
    except (torch.OutOfMemoryError, RuntimeError, ValueError) as error:
        row.update(ok=False, error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
    else:
        stats = percentiles([s * MS_PER_S for s in seconds])
        row.update({f"chunk_ms_{key}": value for key, value in stats.items()})
        row.update(timed_chunks=len(seconds), stopped_early=stopped, ok=not stopped and stats["p99"] < duration_ms)
    finally:
        if cuda:
            row["peak_bytes"] = torch.cuda.max_memory_allocated(device)
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


def search(
    probe: Callable[[int], tuple[list, bool]],
    settings: dict,
    device: torch.device,
    budget: Budget,
    max_streams: int,
) -> dict:
    """The largest ``N <= max_streams`` whose probe passes: doubling from 1, then bisection; JSON-ready.

    ``limited_by`` says what ended the search: ``"latency"`` (a probe's p99
    reached the chunk's duration), ``"memory"`` (on CUDA, a probe's peak
    memory, extrapolated from the largest clean probe, would exceed
    :data:`MEMORY_FRACTION` of the device's: it is not run, so that no
    out-of-memory error hits a CUDA graph capture), ``"error"`` (a probe
    raised), ``"budget"`` (time ran out: the bracket is then wider than the
    tolerance) or ``"max_streams"``.
    """
    duration_ms = float(settings["chunk_ms"])
    probes: list[dict] = []
    passed, failed = 0, None  # the largest passing N, the smallest failing N
    memory_bound = MEMORY_FRACTION * torch.cuda.mem_get_info(device)[1] if device.type == "cuda" else None

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
        """Whether a probe of ``streams`` fits the budget, extrapolated from the last one that ran."""
        ran = [row for row in probes if row["wall_s"] > 0]
        if not ran:
            return not budget.expired()
        return budget.left() > ran[-1]["wall_s"] * max(streams / ran[-1]["streams"], 1.0)

    limited_by = "max_streams"
    streams = 1
    while True:  # doubling
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
    while failed is not None and failed - passed > max(1, TOLERANCE * passed):  # bisection
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
        limited_by = (
            "memory"
            if "predicted_peak_bytes" in failure or "OutOfMemoryError" in failure.get("error", "")
            else "error"
            if "error" in failure
            else "latency"
        )
    best = next((row for row in probes if row["streams"] == passed and row["ok"]), None)
    return {
        **settings,
        "criterion": f"p99 chunk latency < chunk duration ({duration_ms:g} ms)",
        "max_streams": passed,
        "first_failing": failed,
        "limited_by": limited_by,
        "max_streams_chunk_ms_p99": best["chunk_ms_p99"] if best else None,
        "audio_s_per_s": passed * duration_ms / best["chunk_ms_p50"] if best else 0.0,
        "probes": probes,
    }
