"""Concurrent real-time streams: the most streams whose p99 chunk latency stays below the chunk's duration.

All ``N`` streams of a probe are in phase: at every chunk boundary each has
one new chunk of audio, and the chunk's *latency* runs from that moment to
the result: a real-time system keeps up while it is below the chunk's
duration (then no overlap across chunks is possible, so a chunk's features
and its encoder step run one after the other). Two ways to run a probe:

- ``driver``: :class:`~audiomask.asr.driver.StreamingDriver`, the whole
  recognizer: every stream's samples fed, then its cycles (front end for all
  ``N`` streams in a process of its own, sharded over ``frontend_workers``
  processes where the driver takes that argument; masks, transfer, encoder
  step, CTC head, argmax back on the host, greedy decoding), its slots in
  ``lanes`` lanes (a cycle a lane, each lane's chunk fed just before its
  cycle; the chunk's latency runs until the last lane's text). Either family: a
  Qwen3-ASR driver conv-encodes each 1 s chunk and attends (and decodes) a
  window with its 8th chunk. The benchmark's process keeps torch threads for
  the cores the front-end processes leave it (at least one). With
  ``driver_processes`` the streams are shared out over that many drivers on
  the device, each in a process of its own with its own front end (as
  ``audiomask serve --replicas`` runs them).
- ``encoder_step``: the encoder's streaming step alone, from host features
  (the front end's output, random here) to the encoder outputs complete on
  the device, where their consumer (a CTC head, an LLM decoder) would read
  them: ``Phi4MMSlots.step`` (one cache-aware chunk step), or
  ``Qwen3ASRSlots.step`` (one 1 s conv chunk of every stream, and the 8 s
  attention windows that it completes). Beside the driver's row it separates
  the GPU's capacity from the host's.

Qwen3-ASR streams start in 8 groups, one a step (:func:`_start_groups`), as
a server's streams start at different times: each step then attends about
one window in eight, the steady state. Started all at once, every 8th step
would attend every window (a burst that a server sees only when all its
streams start in the same second).

Each probe runs ``warmup`` untimed chunks (at least one per ring phase of the
key/value cache: every phase is a CUDA graph of its own, captured on first
use; a whole attention window for Qwen3-ASR, whose timed chunks are whole
windows too), then up to ``chunks`` timed ones; it stops early once two timed
chunks have exceeded the chunk's duration (with at most 101 chunks, their p99
then does too). :mod:`audiomask.bench.search` finds the most streams a
probe passes, or probes fixed counts.

Every timed chunk also records where its time went (:class:`ChunkCost`): the
device's busy time (CUDA events around the step; on a CPU run the "GPU" is
the CPU computing the step), the front end's compute time, and the main
thread's own host work (wall time less its waits).
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from audiomask.bench.models import BenchModel, build_model
from audiomask.bench.signals import shared_noise
from audiomask.bench.timing import MS_PER_S
from audiomask.checks import check_int
from audiomask.constants import FRAME_MS, SAMPLE_RATE
from audiomask.features.process import available_cores
from audiomask.streaming import Phi4MMSlots, Qwen3ASRSlots

__all__ = ["PATHS", "ChunkCost", "ProbePlan", "ProbeTimes", "encoder_steps", "make_probe", "timed_chunks"]

PATHS = ("driver", "encoder_step")
EXCEEDED_TO_FAIL = 2  # timed chunks over the duration that settle a probe (p99 over at most 101 chunks)
# Seconds drivers in several processes wait for each other: to build their model, slots and front end, and
# for the others' timed chunks to end.
DRIVERS_MEET_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ProbePlan:
    """How many chunks a probe runs: ``warmup`` untimed (added to one per ring phase), then ``chunks`` timed."""

    warmup: int
    chunks: int


class ChunkCost(NamedTuple):
    """Where the seconds of one timed chunk went (the ``*_cpu_s`` fields: driver probes only, else ``None``)."""

    gpu_s: float  # the device busy on the step (CUDA events; on the CPU the step's own compute)
    frontend_s: float  # the front end's compute (0 where the probe starts from host features)
    waited_s: float  # the main thread not doing host work: blocked on features or results, or computing the step
    # The main thread's CPU seconds by stage (the driver's own accounts, audiomask.asr.stats): the feed
    # calls (checking and queuing samples), the enqueue (features to the device, launching the step, head and
    # argmax) and the rest of the loop (planning, handing cycles to the front end, collecting, decoding);
    # step_cpu_s: of the enqueue, the encoder step's call.
    feed_cpu_s: float | None = None
    enqueue_cpu_s: float | None = None
    loop_cpu_s: float | None = None
    step_cpu_s: float | None = None


@dataclass
class ProbeTimes:
    """What a probe measured: wall ``seconds`` per timed chunk, whether it ``stopped`` early, and the costs."""

    seconds: list[float]
    stopped: bool  # two timed chunks reached the duration before all ran: the probe failed
    costs: list[ChunkCost] = field(default_factory=list)  # one per timed chunk, where the step reports them
    frontend_processes: int = 0  # processes the driver's front end ran in
    torch_threads: int = field(default_factory=torch.get_num_threads)  # this process's intra-op threads
    setup_s: float = 0.0  # building the slots or driver (its front-end processes started), before the first chunk
    driver_processes: int = 1  # drivers on the device, one a process (the streams shared out)
    peak_bytes_elsewhere: int = 0  # the other driver processes' peak device memory, together


def timed_chunks(
    step: Callable[[int], ChunkCost | None],
    warmup: int,
    plan: ProbePlan,
    duration_s: float,
    before_timed: Callable[[], object] | None = None,
) -> ProbeTimes:
    """Run ``step(index)`` for ``warmup`` untimed then up to ``plan.chunks`` timed indices (``before_timed()``
    between them).

    ``seconds``: wall seconds of each timed step; ``costs``: what ``step`` returned for each (where it
    returns a :class:`ChunkCost`). ``stopped`` is ``True`` when two timed steps reached ``duration_s``
    (seconds) before all ran, which settles the probe as failed.
    """
    times = ProbeTimes([], False)
    exceeded = 0
    for index in range(warmup + plan.chunks):
        if index == warmup and before_timed is not None:
            before_timed()
        began = time.perf_counter()
        cost = step(index)
        elapsed = time.perf_counter() - began
        if index < warmup:
            continue
        times.seconds.append(elapsed)
        if cost is not None:
            times.costs.append(cost)
        exceeded += elapsed >= duration_s
        if exceeded >= EXCEEDED_TO_FAIL and len(times.seconds) < plan.chunks:
            times.stopped = True
            return times
    return times


def _device_cost(device: torch.device, work: Callable[[], object]) -> ChunkCost:
    """Run ``work`` (it enqueues device work) and wait for the device: its busy time and the wait."""
    if device.type != "cuda":
        began = time.perf_counter()
        work()
        spent = time.perf_counter() - began
        return ChunkCost(spent, 0.0, spent)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    began = time.perf_counter()
    end.synchronize()
    waited = time.perf_counter() - began
    return ChunkCost(start.elapsed_time(end) / MS_PER_S, 0.0, waited)


def _schedule(model: BenchModel, plan: ProbePlan, left_chunk: int) -> tuple[int, ProbePlan]:
    """``(untimed warm-up chunks, timed plan)``: every ring phase warmed (Phi-4MM), or every stream
    started and whole windows timed (Qwen3-ASR)."""
    if model.is_phi4mm:
        return plan.warmup + left_chunk + 1, plan
    window = model.encoder.config.chunks_per_window
    return plan.warmup + _start_groups(model) + window, ProbePlan(0, -(-plan.chunks // window) * window)


def _start_groups(model: BenchModel) -> int:
    """Chunk steps over which a probe's streams start, one group a step: a steady state where it matters.

    A Qwen3-ASR stream attends its window with every 8th chunk: streams that
    start at different times (as a server's do) spread that work over the
    steps, so its streams start in 8 groups, one a step, and each step closes
    about one window in eight. A Phi-4MM chunk step costs the same at every
    step, so its streams start together.
    """
    return 1 if model.is_phi4mm else model.encoder.config.chunks_per_window


def _start_step(streams: int, groups: int) -> np.ndarray:
    """``(streams,)`` int64: the step at which each stream starts, ``groups`` groups of (nearly) equal size."""
    return np.arange(streams) * groups // max(streams, 1)


@dataclass(frozen=True)
class _DriverSpec:
    """What a driver probe is, in a form a process of its own can rebuild it from (the model by name)."""

    model: str
    device: str
    quick: bool
    chunking: dict
    plan: ProbePlan
    cuda_graph: bool | None
    options: dict
    cores: int  # the cores this driver's process and its front end may take


def _driver_probe(model: BenchModel, spec: _DriverSpec) -> Callable[[int, Callable[[], object] | None], ProbeTimes]:
    """``probe(streams, before_timed)`` through one whole driver (front end in processes of its own).

    ``before_timed``: called once between the warm-up and the timed chunks (drivers in several processes
    meet there, so that their timed chunks share the device).
    """
    cuda = model.device.type == "cuda"
    chunking, plan, options = spec.chunking, spec.plan, spec.options

    def probe(streams: int, before_timed: Callable[[], object] | None = None) -> ProbeTimes:
        children = len(multiprocessing.active_children())
        began = time.perf_counter()
        lanes = min(options.get("lanes", 1), streams)
        workers = options.get("frontend_workers")
        shards = {} if workers is None else {"frontend_workers": min(workers, streams // lanes)}  # slots of each lane
        # The driver seats a joining stream in the lane of its phase: when, within a block's period, its first
        # block arrived. The probe feeds as fast as the host can, so on the wall clock one lane's streams would
        # straddle phases and split over lanes; on the probe's clock lane k's blocks arrive in its k-th phase.
        now = [0.0]  # the probe's clock, seconds
        driver = model.driver(
            streams,
            **chunking,
            cuda_graph=spec.cuda_graph,
            overlap=True,
            wait_clock=lambda: now[0],
            **{**options, **shards, "lanes": lanes},
        )
        setup_s = time.perf_counter() - began
        frontend_processes = len(multiprocessing.active_children()) - children
        threads = torch.get_num_threads()
        # The cores left to this process: intra-op threads beyond them only preempt the front end's processes.
        torch.set_num_threads(max(1, spec.cores - frontend_processes))
        try:
            warmup, timed = _schedule(model, plan, chunking.get("left_chunk", 0))
            first, later = driver.first_block_samples, driver.block_samples
            source, starts = shared_noise(streams, first + (warmup + timed.chunks) * later)
            opening = _start_step(streams, _start_groups(model))
            handles: list = []
            fed = np.zeros(streams, np.int64)  # samples fed to each stream so far
            period_s = later / SAMPLE_RATE  # a live stream's blocks come once a period

            def feed_lane(chunk: int, lane: int | None) -> None:
                if lane is None:  # every occupied lane is fed
                    return
                lo, hi = driver.lane_bounds[lane]
                now[0] = (chunk + (lane + 0.5) / len(driver.lanes)) * period_s  # the middle of the lane's phase
                for stream in range(lo, min(hi, len(handles))):  # slots are taken lowest first, in opening order
                    size = first if fed[stream] == 0 else later
                    begin = starts[stream] + fed[stream]
                    driver.feed(handles[stream], source[begin : begin + size])
                    fed[stream] += size

            def step(index: int) -> ChunkCost:
                handles.extend(driver.open() for _ in range(int((opening == index).sum())))
                # Each lane's chunk is fed just before its cycle is planned (the first lane's before any).
                fed_cpu_s = driver.stats.feed_cpu_s
                occupied = sum(lo < len(handles) for lo, _ in driver.lane_bounds)
                unfed = iter(range(occupied))
                first_cycle = driver.stats.count
                ran = driver.advance(before_plan=lambda _: feed_lane(index, next(unfed, None)))
                if ran != occupied:
                    raise RuntimeError(
                        f"chunk {index}: the driver ran {ran} cycles, not one a lane ({occupied}): a bug"
                    )
                cycles = driver.stats.since(first_cycle)
                gpu_s = sum(cycle.encode_s for cycle in cycles)
                waited_s = sum(cycle.wait_s for cycle in cycles)
                feed_cpu_s = driver.stats.feed_cpu_s - fed_cpu_s
                # Without CUDA the step is computed on the main thread: that time is the "device's", not host work.
                return ChunkCost(
                    gpu_s,
                    sum(cycle.cpu_s for cycle in cycles),
                    waited_s + (0.0 if cuda else gpu_s),
                    feed_cpu_s,
                    sum(cycle.enqueue_cpu_s for cycle in cycles),
                    # The lanes are fed inside the cycles (before each is planned): their host CPU holds the feed.
                    max(sum(cycle.host_cpu_s for cycle in cycles) - feed_cpu_s, 0.0),
                    sum(cycle.step_cpu_s for cycle in cycles),
                )

            times = timed_chunks(step, warmup, timed, later / SAMPLE_RATE, before_timed)
            times.frontend_processes, times.setup_s = frontend_processes, setup_s
            return times
        finally:
            driver.close()
            torch.set_num_threads(threads)

    return probe


def _driver_share(spec: _DriverSpec, streams: int, barrier: object, results: object) -> None:
    """A driver process's share of a probe: its own model, driver and front end; its times (or its error) and
    its peak device memory put on ``results``."""
    try:
        model = build_model(spec.model, torch.device(spec.device), quick=spec.quick)
        cuda = model.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(model.device)
        times = _driver_probe(model, spec)(streams, lambda: barrier.wait(DRIVERS_MEET_TIMEOUT_S))  # type: ignore[attr-defined]
        times.peak_bytes_elsewhere = torch.cuda.max_memory_allocated(model.device) if cuda else 0
        results.put((times, None))  # type: ignore[attr-defined]
    except Exception as error:  # noqa: BLE001 - whatever it is, the parent reports it and the others stop waiting
        barrier.abort()  # type: ignore[attr-defined]
        message = str(error).splitlines()[0][:300] if str(error) else ""
        results.put((None, f"{type(error).__name__}: {message}"))  # type: ignore[attr-defined]


def _gather(results: object, processes: list) -> list[tuple[ProbeTimes | None, str | None]]:
    """What ``processes`` put on ``results`` (each puts one item, then ends): every item, or those there once
    they have all ended (one that died put nothing) or :data:`DRIVERS_MEET_TIMEOUT_S` has passed."""
    gathered: list[tuple[ProbeTimes | None, str | None]] = []
    deadline = time.monotonic() + DRIVERS_MEET_TIMEOUT_S
    last_look = False  # the processes have ended: what they put is readable now
    while len(gathered) < len(processes):
        try:
            gathered.append(results.get(timeout=1.0))  # type: ignore[attr-defined]
        except queue.Empty:
            if last_look or time.monotonic() > deadline:
                break
            last_look = not any(process.is_alive() for process in processes)
    return gathered


def _drivers_probe(model: BenchModel, spec: _DriverSpec, processes: int) -> Callable[[int], ProbeTimes]:
    """``probe(streams)`` through ``processes`` drivers on one device, one a process, the streams shared out.

    This process runs the first share; each other share runs in a process spawned for the probe, which
    builds the model again by its name. Their timed chunks start together; the times are every driver's
    chunks (each a chunk of its own streams), and the costs each driver's own: on CUDA a driver's
    device time spans the other drivers' work that the device interleaves with its own.
    """
    single = _driver_probe(model, spec)

    def probe(streams: int) -> ProbeTimes:
        if streams < processes:
            raise ValueError(f"streams ({streams}) must be at least the driver processes ({processes})")
        shares = [streams * (k + 1) // processes - streams * k // processes for k in range(processes)]
        context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        barrier, results = context.Barrier(processes), context.Queue()
        others = [
            context.Process(target=_driver_share, args=(spec, share, barrier, results), name=f"audiomask-driver-{k}")
            for k, share in enumerate(shares[1:], 1)
        ]
        for process in others:
            process.start()
        gathered: list[tuple[ProbeTimes | None, str | None]] = []
        try:
            own = single(shares[0], lambda: barrier.wait(DRIVERS_MEET_TIMEOUT_S))
            gathered = _gather(results, others)
        except threading.BrokenBarrierError:  # a driver could not start (or the others timed out): it says why
            errors = [error for _, error in _gather(results, others) if error]
            raise RuntimeError(f"the driver processes did not all start: {errors or 'timed out'}") from None
        except BaseException:
            barrier.abort()
            raise
        finally:
            for process in others:
                if len(gathered) < len(others):  # failed: they would run on for nothing
                    process.kill()
                process.join(DRIVERS_MEET_TIMEOUT_S)
        errors = [error for _, error in gathered if error]
        if errors:
            raise RuntimeError(f"a driver process failed: {errors[0]}")
        if len(gathered) < len(others):
            raise RuntimeError(f"{len(others) - len(gathered)} driver process(es) ended without a result")
        for times, _ in gathered:
            own.seconds += times.seconds  # type: ignore[union-attr]
            own.costs += times.costs  # type: ignore[union-attr]
            own.stopped |= times.stopped  # type: ignore[union-attr]
            own.frontend_processes += times.frontend_processes  # type: ignore[union-attr]
            own.setup_s = max(own.setup_s, times.setup_s)  # type: ignore[union-attr]
            own.peak_bytes_elsewhere += times.peak_bytes_elsewhere  # type: ignore[union-attr]
        own.driver_processes = processes
        return own

    return probe


def encoder_steps(
    model: BenchModel, streams: int, *, chunk_size: int = 0, left_chunk: int = 0, cuda_graph: bool = False
) -> tuple[int, Callable[[int], None]]:
    """``(warm-up steps, step)``: ``step(index)`` enqueues the encoder's streaming step ``index`` of ``streams``
    streams from host features (random, as the front end gives them) on the model's device, without waiting.

    Phi-4MM: ``Phi4MMSlots.step``, one cache-aware chunk of ``chunk_size`` tokens with ``left_chunk`` chunks of
    left context (``cuda_graph``: replayed from CUDA graphs); the warm-up fills every ring phase. Qwen3-ASR:
    ``Qwen3ASRSlots.step``, one 1 s conv chunk of every started stream and the windows it completes, the
    streams starting in groups (:func:`_start_groups`); the warm-up starts them all.
    """
    encoder = model.encoder
    if model.is_phi4mm:
        frames = chunk_size * encoder.config.time_reduction
        block = np.random.default_rng(0).standard_normal((frames, encoder.config.input_size)).astype(np.float32)
        slots = Phi4MMSlots(encoder, streams, chunk_size, left_chunk, cuda_graph=cuda_graph)
        features = np.tile(block, (streams, 1, 1))  # (N, frames, 80) host float32, as the front end gives
        valid = np.full(streams, frames)

        def chunk_step(index: int) -> None:
            slots.step(features, valid)

        return left_chunk + 1, chunk_step
    config = encoder.config
    block = np.random.default_rng(0).standard_normal((config.num_mel_bins, config.chunk_frames)).astype(np.float32)
    qwen_slots = Qwen3ASRSlots(encoder, streams)
    chunks = np.tile(block, (streams, 1, 1))  # (N, 128, 100) host float32, as the front end gives
    groups = _start_groups(model)
    opening = _start_step(streams, groups)

    def step(index: int) -> None:
        started = opening <= index  # a stream not started yet sits the step out
        qwen_slots.step(chunks, np.where(started, config.chunk_frames, 0), active=started)

    return groups, step


def _step_probe(
    model: BenchModel, chunk_size: int, left_chunk: int, plan: ProbePlan, cuda_graph: bool
) -> Callable[[int], ProbeTimes]:
    warmup, timed = _schedule(model, plan, left_chunk)
    if model.is_phi4mm:
        duration_s = chunk_size * model.encoder.config.time_reduction * FRAME_MS / MS_PER_S
    else:
        duration_s = model.encoder.config.chunk_frames * FRAME_MS / MS_PER_S

    def probe(streams: int) -> ProbeTimes:
        _, step = encoder_steps(model, streams, chunk_size=chunk_size, left_chunk=left_chunk, cuda_graph=cuda_graph)
        return timed_chunks(lambda index: _device_cost(model.device, lambda: step(index)), warmup, timed, duration_s)

    return probe


def make_probe(
    model: BenchModel,
    path: str,
    plan: ProbePlan,
    *,
    chunk_size: int = 0,
    left_chunk: int = 0,
    cuda_graph: bool | None = None,
    frontend_workers: int | None = None,
    lanes: int = 1,
    driver_processes: int = 1,
) -> tuple[Callable[[int], ProbeTimes], dict]:
    """``(probe, settings)``: ``probe(streams)`` times chunks of ``streams`` concurrent streams.

    ``chunk_size`` (tokens) and ``left_chunk`` (chunks) apply to Phi-4MM
    models; Qwen3-ASR streams its fixed 1 s conv chunks in 8 s windows.
    ``cuda_graph``: replay the Phi-4MM chunk step as CUDA graphs (``None``: the driver's default).
    ``frontend_workers``: the driver's front-end processes (``None``: the driver chooses from the
    cores), passed where the driver takes it; the settings record it.
    ``lanes``: the driver's slots in that many lanes (at most the streams), one cycle a lane: the first
    lane's step starts after about ``1 / lanes`` of the front end's time.
    ``driver_processes``: that many drivers on the device, one a process with its own front end (the
    streams and this process's cores shared out), as ``audiomask serve --replicas`` runs them: the
    host's work per stream no longer goes through one interpreter.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    settings: dict = {"model": model.name, "path": path, "dtype": str(model.dtype).removeprefix("torch.")}
    if model.is_phi4mm:
        cuda = model.device.type == "cuda"
        chunking = {"chunk_size": chunk_size, "left_chunk": left_chunk}
        settings.update(
            chunk_ms=chunk_size * model.encoder.config.time_reduction * FRAME_MS,
            **chunking,
            cuda_graph=(cuda if cuda_graph is None else cuda_graph),
        )
    else:
        config = model.encoder.config
        chunking, cuda_graph = {}, None
        settings.update(chunk_ms=config.chunk_frames * FRAME_MS, window_ms=config.n_window_infer * FRAME_MS)
    if path == "driver":
        lanes = check_int("lanes", lanes, minimum=1)
        processes = check_int("driver_processes", driver_processes, minimum=1)
        options = {"frontend_process": True, "frontend_workers": frontend_workers, "lanes": lanes}
        settings.update(
            frontend_process=True,
            frontend_sharded=True,
            frontend_workers=frontend_workers,
            lanes=lanes,
            driver_processes=processes,
        )
        settings["latency_until"] = "CTC argmax of the chunk on the host, decoded (features included)"
        cores = max(1, available_cores() // processes)
        spec = _DriverSpec(model.name, str(model.device), model.quick, chunking, plan, cuda_graph, options, cores)
        if processes == 1:
            return _driver_probe(model, spec), settings
        return _drivers_probe(model, spec, processes), settings
    if model.is_phi4mm:
        settings["latency_until"] = "encoder outputs complete on the device (host features in; front end excluded)"
        return _step_probe(model, chunk_size, left_chunk, plan, settings["cuda_graph"]), settings
    settings["latency_until"] = "encoder outputs of the current window (partial) complete on the device"
    return _step_probe(model, 0, 0, plan, False), settings
