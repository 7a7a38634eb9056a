"""The streaming driver: CPU features of cycle N+1 overlap the encoder step of cycle N, for many streams.

:class:`StreamingDriver` owns an encoder's ``B`` slots (any
:class:`~audiomask.streaming.EncoderSlots`: preallocated caches, static
shapes) and advances every utterance that occupies a slot by one encoder
chunk per *cycle*:

1. **plan** (main thread, :class:`~audiomask.asr.planner.CyclePlanner`):
   admit waiting streams into free slots; name each occupied slot's next
   block of samples in its ring, so that every block but the last yields
   exactly one encoder chunk of frames, whatever sizes the samples arrived
   in; a few ``(B,)`` array operations, no per-stream Python in the steady state.
2. **features** (worker thread or processes): the frames of every slot's
   block in one batched front-end call per process, laid out as the
   slots' ``chunk_shape`` host batch.
3. **encode** (main thread): the batch moved by :mod:`audiomask.transfer` (the only host->device path):
   staged with :func:`~audiomask.transfer.to_device`, or, from front-end processes on CUDA, copied
   straight from their shared batch, page-locked once (:class:`~audiomask.transfer.PinnedRegion`,
   :func:`~audiomask.transfer.copy_pinned`: no staging memcpy on this thread); new
   slots reset, one chunk step, the CTC head and the per-frame argmax; on
   CUDA on its compute stream between two events, the argmax copied back
   without blocking.
4. **collect** (main thread, one cycle later, when the copy has long
   landed): greedy-CTC decoding of each active slot's real frames
   (:class:`~audiomask.asr.decoding.GreedyCTCDecoder`), and each stream that
   asked for its encoder outputs gets its
   :class:`~audiomask.asr.outputs.EncoderChunk`.

The features of cycle N+1 need only samples, never results of cycle N, so
the main thread hands them to a worker and encodes cycle N meanwhile. One
worker thread, or one process per fixed piece of the slots, touches each
slot's front-end state (:class:`~audiomask.features.slots.SlotFeatures`) in
cycle order, and every stage applies slot resets in cycle order, so a slot
freed in cycle N can be reused in cycle N+1. A thread shares the interpreter
lock with the main thread at every torch call; ``frontend_process=True``
moves the front end into ``frontend_workers`` processes of their own (default one per four cores;
:class:`~audiomask.features.process.FeatureProcess`, bit for bit the same): it scales with the host.

Batching: a stream's row sees only its own caches, masks and token
positions, so its outputs do not depend on which streams share the batch, up
to float rounding of batched GEMMs. Which slots a cycle advances is the
caller's policy (:meth:`StreamingDriver.advance`): by default a barrier (a
cycle when every occupied slot has its next block or has ended: every step
carries every stream); with ``max_wait_s`` a ready block waits at most that
long for the stragglers, then a cycle runs over the ready slots alone, and a
stream that has ended never waits. A slot left out is passed as inactive
(:meth:`~audiomask.streaming.EncoderSlots.step`'s ``active``): its caches,
ring position and front-end state stay as they were (the step still
computes its row: static shapes, CUDA graphs). Waiting streams take free
slots in the order their first block (or their end) arrived.

Lanes: given several batches of slots of one encoder, the driver's slots are theirs, lane after lane, and a
cycle plans and steps one lane (lanes take turns), so a cycle costs the device one lane's step. Every
front-end process owns a piece of every lane: when all streams have a chunk at once, the first lane's
features are ready after about ``1 / lanes`` of the front end's time and its step runs while the next
lanes' features are computed. A joining stream takes the lane of its phase (see :mod:`~.planner`).

Locking: a caller that shares the driver between threads holds its own lock around every call and
passes ``advance(unlocked=...)``, a context manager that releases it while the driver touches no
bookkeeping (waiting for features, the step, waiting for results). One thread advances at a time.

Encoder outputs (:mod:`audiomask.asr.outputs`): a stream opened with ``outputs=True`` (or every
stream, with ``keep_outputs``) gets its output tokens in :attr:`DriverStream.chunks`, a bounded
queue, and one opened with ``on_output`` has them handed to that callable, in order, exactly once,
the last flagged ``final``: what an LLM decoder over the audio embeddings consumes while the audio
still arrives. Their copy to the host is enqueued behind the step and never waited for; cycles skip
it while nobody asks.

Instrumentation (:mod:`audiomask.asr.stats`): a :class:`CycleTiming` per cycle, :meth:`RunStats.overlap`
and :meth:`RunStats.cpu_per_audio_s` (each stage's host cost per stream-second of audio).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch

from audiomask.asr.decoding import GreedyCTCDecoder
from audiomask.asr.outputs import DEFAULT_MAX_PENDING, ChunkQueue, EncoderChunk, OutputError, TokenClock
from audiomask.asr.planner import CyclePlanner, DriverStream, PlannedCycle, block_samples, ring_capacity
from audiomask.asr.stats import RECENT_CYCLES, CycleTiming, RunStats
from audiomask.checks import check_int
from audiomask.constants import SAMPLE_RATE
from audiomask.features.frontend import Frontend
from audiomask.features.process import MAX_IN_FLIGHT, FeatureProcess
from audiomask.features.slots import SlotFeatures, SlotSamples
from audiomask.models.ctc import CTCHead
from audiomask.samples import as_samples
from audiomask.streaming import EncoderSlots, as_lanes, share_graph_memory
from audiomask.transfer import PinnedRegion, copy_pinned, pinned_empty, to_host

__all__ = ["OUTPUT_PLACES", "RECENT_CYCLES", "CycleTiming", "DriverStream", "RunStats", "StreamingDriver"]

OUTPUT_PLACES = ("host", "device")  # where delivered embeddings live: pinned host memory, or the encoder's device


@dataclass
class _InFlight:
    cycle: PlannedCycle
    # Rows: the slots of the cycle's lane (all B without lanes), from its first slot on.
    best: torch.Tensor  # (rows, n) argmax ids (host tensor once the copy has landed)
    embeddings: torch.Tensor | None  # (rows, n, D) copy of the step's outputs, while some stream asks for them
    valid: np.ndarray  # (rows,) real tokens per slot
    done: object  # CUDA event after the copy back, or None
    events: tuple[object, object] | None  # CUDA events around the step
    enqueue_s: float
    enqueue_cpu_s: float
    step_cpu_s: float  # of enqueue_cpu_s: the slots' step call
    encode_s: float


class StreamingDriver:
    """Advance many streams through front end, encoder step, CTC head and greedy decoding, pipelined.

    Args:
        slots: the encoder's slots that the utterances take (any
            :class:`~audiomask.streaming.EncoderSlots`, e.g. from
            :func:`~audiomask.streaming.open_slots`; its encoder in eval mode).
            Its ``batch_size`` is the number of concurrent utterances. Or
            several batches of slots of one encoder and chunking, the driver's *lanes*:
            their slots are the driver's, lane after lane, and a cycle steps
            one lane (see "Lanes" in the module docstring).
        head: the :class:`~audiomask.models.ctc.CTCHead` over the encoder outputs (on the slots' device).
        frontend: the front end (default: the slots' ``default_frontend()``); its mel bins and layout
            must be the slots'.
        keep_outputs: open every stream with ``outputs=True`` and no bound on its queue (its chunks are
            kept until taken: ``DriverStream.outputs``), for tests and analysis.
        outputs_on: where delivered embeddings live, one of :data:`OUTPUT_PLACES`: ``"host"`` (pinned
            memory, copied without blocking) or ``"device"`` (the encoder's, for a consumer there).
        overlap: compute the next cycle's features on a worker thread while the device encodes (``False``:
            serial, for comparison: features, encode, wait for the results, cycle after cycle).
        frontend_process: with ``overlap``, compute the features in processes of their own
            (:class:`~audiomask.features.process.FeatureProcess`) rather than on a thread: the front end
            then shares no interpreter lock with the main thread, which a thread does at every torch
            call; each process costs an interpreter (seconds to start, once, and its memory). Call
            :meth:`close` when done. A script that makes such a driver guards its entry point with
            ``if __name__ == "__main__":`` (the processes are spawned, which imports the script again).
        frontend_workers: with ``frontend_process``, how many processes share the slots (each owns a
            fixed contiguous slice; the features are the same bit for bit whatever the count); default
            :func:`~audiomask.features.process.default_workers`: one per four cores this process may run
            on, at most ``batch_size``; the attribute ``frontend_workers`` holds it (0 without processes).
        wait_clock: seconds, monotonic: times how long ready blocks wait (``advance(max_wait_s=...)``).

    >>> import numpy as np
    >>> from audiomask.asr.checkpoint import load_model
    >>> from audiomask.streaming import open_slots
    >>> model = load_model()  # the shipped model: 40 ms tokens, 320 ms chunks
    >>> driver = StreamingDriver(open_slots(model.encoder, batch_size=2), model.head)
    >>> streams = driver.run([np.zeros(8000, np.float32), np.zeros(3000, np.float32)])
    >>> [s.tokens for s in streams]  # ceil(frames / 4): 48 and 17 frames
    [12, 5]
    >>> driver.close()

    A stream's encoder outputs as they come (:class:`~audiomask.asr.outputs.EncoderChunk`):

    >>> driver = StreamingDriver(open_slots(model.encoder), model.head)
    >>> stream = driver.open("caller-1", outputs=True)
    >>> driver.feed(stream, np.zeros(8000, np.float32)); driver.end(stream); driver.advance()
    2
    >>> [(chunk.start, tuple(chunk.embeddings.shape), chunk.final) for chunk in stream.chunks]
    [(0, (8, 192), False), (8, (4, 192), True)]
    >>> driver.close()
    """

    def __init__(
        self,
        slots: EncoderSlots | Sequence[EncoderSlots],
        head: CTCHead,
        frontend: Frontend | None = None,
        *,
        keep_outputs: bool = False,
        outputs_on: str = "host",
        overlap: bool = True,
        frontend_process: bool = False,
        frontend_workers: int | None = None,
        wait_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        lanes = share_graph_memory(as_lanes(slots))  # stepped one at a time on self._compute
        first = lanes[0]  # every lane's attributes are its
        if not isinstance(head, CTCHead):
            raise ValueError(f"head must be a CTCHead, got {type(head).__name__}")
        if head.proj.in_features != first.output_size:
            raise ValueError(
                f"head input_size ({head.proj.in_features}) must equal the slots' output_size ({first.output_size})"
            )
        self.frontend = first.default_frontend() if frontend is None else frontend
        if self.frontend.n_mels != first.feature_size or self.frontend.time_axis + 1 != first.time_dim:
            layout = "(T, n_mels)" if first.time_dim == 1 else "(n_mels, T)"
            raise ValueError(
                f"frontend must give {layout} features of {first.feature_size} mels (the slots'), got a "
                f"{type(self.frontend).__name__} of {self.frontend.n_mels} mels, time axis {self.frontend.time_axis}"
            )
        if outputs_on not in OUTPUT_PLACES:
            raise ValueError(f"outputs_on must be one of {OUTPUT_PLACES}, got {outputs_on!r}")
        if frontend_process and not overlap:
            raise ValueError("frontend_process=True needs overlap=True (a serial driver computes features in line)")
        if frontend_workers is not None:
            if not frontend_process:
                raise ValueError("frontend_workers needs frontend_process=True (it counts the front end's processes)")
            frontend_workers = check_int("frontend_workers", frontend_workers, minimum=1)
            narrowest = min(lane.batch_size for lane in lanes)
            if frontend_workers > narrowest:
                raise ValueError(
                    f"frontend_workers must be at most the batch_size of the slots (of the narrowest lane) "
                    f"({narrowest}): each process owns slots of every lane, got {frontend_workers}"
                )
        self.lanes, self.head = lanes, head
        ends = np.cumsum([0, *(lane.batch_size for lane in lanes)]).tolist()
        self.lane_bounds = list(zip(ends[:-1], ends[1:]))  # each lane's slots, [lo, hi)
        self._lane_at = dict(zip(self.lane_bounds, lanes))  # a planned cycle's lane, by its bounds
        self._next_lane = 0  # the lane the next plan tries first: lanes take turns
        self.batch_size, self.device, self.chunk_frames = ends[-1], first.device, first.chunk_frames
        # Samples of a stream's first cycle, and of each later one.
        self.first_block_samples, self.block_samples = block_samples(self.frontend, self.chunk_frames)
        self.keep_outputs = bool(keep_outputs)
        self.outputs_on = outputs_on
        self.clock = TokenClock(first)  # each output token's time
        self._listening: set[DriverStream] = set()  # streams whose final chunk is still to come
        self.overlap = bool(overlap)
        self.stats = RunStats()
        self._decoder = GreedyCTCDecoder(self.batch_size)
        self._cycles = 0
        self._names = itertools.count()
        capacity = ring_capacity(self.first_block_samples, self.block_samples)
        self._worker: ThreadPoolExecutor | None = None  # the front end on a thread ...
        self._process: FeatureProcess | None = None  # ... or in processes ...
        self._slot_features: SlotFeatures | None = None  # ... or here (on the thread, or serial)
        if frontend_process:
            self._process = FeatureProcess(
                self.frontend,
                self.batch_size,
                self.chunk_frames,
                capacity,
                workers=frontend_workers,
                lanes=[hi - lo for lo, hi in self.lane_bounds],
            )
            rings = self._process.samples
        else:
            self._slot_features = SlotFeatures(self.frontend, self.batch_size, self.chunk_frames)
            rings = np.zeros((self.batch_size, capacity), np.float32)
            if overlap:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audiomask-features")
        self.frontend_workers = self._process.workers if self._process is not None else 0
        # The processes' feature batches page-locked where they lie: a step's chunk crosses to the device
        # straight from them, with no staging memcpy on this thread.
        self._features_region: PinnedRegion | None = None
        self._copied = None  # the event after the last such copy
        if self._process is not None and self.device.type == "cuda":
            self._features_region = PinnedRegion(self._process.feature_memory)
        self._samples = SlotSamples(rings)
        phases = self.lane_bounds if len(lanes) > 1 else None
        self._planner = CyclePlanner(
            self.batch_size, self.first_block_samples, self.block_samples, self._samples, wait_clock, phases
        )
        cuda = self.device.type == "cuda"
        self._compute = torch.cuda.Stream(self.device) if cuda else None
        # Two of each, alternating by cycle: cycle N's are read at its collection, before cycle N + 2 reuses them.
        # Flat: a step's (B, n) argmax, n <= tokens_per_chunk, lands in the first B * n entries.
        widest = self.batch_size * first.tokens_per_chunk
        self._best_host = [pinned_empty((widest,), torch.int64) for _ in range(2 * cuda)]
        self._step_events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2 * cuda)
        ]

    # -- streams -------------------------------------------------------------------------------

    def open(
        self,
        name: str | None = None,
        *,
        outputs: bool = False,
        on_output: Callable[[EncoderChunk], object] | None = None,
        max_pending: int | None = DEFAULT_MAX_PENDING,
    ) -> DriverStream:
        """A new stream; it takes a slot once its first block of samples (or its end) has arrived.

        Args:
            name: its name (default ``stream-N``).
            outputs: queue its encoder outputs in ``stream.chunks`` (:class:`~audiomask.asr.outputs.ChunkQueue`),
                at most ``max_pending`` chunks untaken (``None``: no bound); forced by ``keep_outputs``.
            on_output: called with each :class:`~audiomask.asr.outputs.EncoderChunk` on the driver's thread.
            max_pending: see ``outputs``; the module docstring of :mod:`audiomask.asr.outputs` says what
                happens when a chunk finds the queue full.
        """
        name = f"stream-{next(self._names)}" if name is None else str(name)
        chunks = None
        if outputs or on_output is not None or self.keep_outputs:
            queued = outputs or self.keep_outputs
            limit = None if self.keep_outputs else (max_pending if queued else 0)
            chunks = ChunkQueue(name, limit, on_output)
        stream = DriverStream(name, chunks)
        if chunks is not None:
            self._listening.add(stream)
        self._planner.open(stream)
        return stream

    def feed(self, stream: DriverStream, samples: object, *, checked: bool = False) -> None:
        """Queue 16 kHz float samples for ``stream`` (any number, empty allowed); nothing is computed here.

        ``checked``: ``samples`` came from :func:`~audiomask.samples.as_samples` (not checked again).
        """
        started = time.thread_time()
        if stream.ended:
            raise ValueError(f"accept after finish: stream {stream.name!r} has ended")
        if stream.chunks is not None and stream.chunks.error is not None:
            raise stream.chunks.error
        samples = samples if checked else as_samples("samples", samples)
        if len(samples):
            self._planner.feed(stream, samples)
        self.stats.feed_cpu_s += time.thread_time() - started

    def end(self, stream: DriverStream) -> None:
        """No more samples for ``stream``: its last block is processed by the next cycles."""
        self._planner.end(stream)

    def drop(self, stream: DriverStream) -> None:
        """End ``stream`` whose text nobody will read; one still waiting for a slot leaves at once.

        A stream whose encoder outputs are queued or handed on is ended as by
        :meth:`end`, so that its consumer still gets every chunk and the final one.
        """
        if stream.chunks is None:
            self._planner.drop(stream)
        else:
            self._planner.end(stream)

    def occupants(self) -> list[DriverStream]:
        """The streams holding a slot now, by slot."""
        return self._planner.occupants()

    def has_block(self, stream: DriverStream) -> bool:
        """Whether a cycle now would advance ``stream``: its next block (or, ended, its rest) has arrived."""
        return self._planner.has_block(stream)

    def waited_s(self) -> float | None:
        """Seconds the longest-waiting ready block has waited for a cycle; ``None``: no block is ready."""
        return self._planner.waited_s()

    def run(self, signals: Sequence[object], starts: Sequence[int] | None = None) -> list[DriverStream]:
        """Stream whole signals; ``starts[i]``: the cycle at which signal ``i`` opens (default all at 0).

        Returns the finished streams in the order of ``signals``.
        """
        starts = [0] * len(signals) if starts is None else [check_int("starts", s, minimum=0) for s in starts]
        if len(starts) != len(signals):
            raise ValueError(f"starts must have {len(signals)} entries (one per signal), got {len(starts)}")
        checked = [as_samples(f"signals[{i}]", s) for i, s in enumerate(signals)]
        streams: list[DriverStream | None] = [None] * len(checked)
        order = sorted(range(len(checked)), key=lambda i: starts[i])
        pending = deque(order)

        def admit(cycle: int) -> None:
            while pending and starts[pending[0]] <= cycle:
                index = pending.popleft()
                stream = self.open(f"signal-{index}")
                self.feed(stream, checked[index])
                self.end(stream)
                streams[index] = stream

        admit(self._cycles)
        while pending or any(s is not None and not s.done for s in streams):
            before = self._cycles
            self.advance(before_plan=admit)
            if self._cycles == before and not pending:
                break
            if self._cycles == before:  # nothing to run until the next start: skip ahead
                admit(starts[pending[0]])
        return [s for s in streams if s is not None]

    # -- the pipelined loop --------------------------------------------------------------------

    def advance(
        self,
        before_plan: Callable[[int], None] | None = None,
        *,
        max_wait_s: float | None = None,
        unlocked: Callable[[], AbstractContextManager[object]] | None = None,
        until: Callable[[], bool] | None = None,
    ) -> int:
        """Run every cycle that is due now (or until ``until()``); returns the number of cycles run.

        Args:
            before_plan: called with the cycle's index before each cycle is
                planned (to admit streams that start then).
            max_wait_s: ``None`` (default): full cycles only, each when every
                occupied slot has its next block or has ended. Seconds: also a
                cycle over the ready slots alone once a ready block has waited
                this long for the others, or once a ready slot's stream has
                ended; ``0``: every ready slot at once.
            unlocked: a context manager (made anew each time) under which the
                driver waits for features, runs the encoder step and waits for
                the device, touching no bookkeeping there: it releases the
                caller's lock (see the module docstring).
            until: checked before each cycle is planned: once it holds, no
                more are planned, and the cycles planned already finish (a
                caller that needs its own stream moved does not carry cycles
                that samples fed meanwhile make due).
        """
        start_wall = time.perf_counter()
        unlocked = contextlib.nullcontext if unlocked is None else unlocked
        ran = 0
        # Cycles planned and handed to the front end ahead of the one being encoded: one for a worker
        # thread; processes get the next one queued too, so they never wait for this thread to plan.
        depth = MAX_IN_FLIGHT if self._process is not None else 1
        serial = self._worker is None and self._process is None
        ahead: deque[PlannedCycle] = deque()
        cpu_mark = time.thread_time()
        self._plan_ahead(ahead, depth, before_plan, max_wait_s, until)
        in_flight: _InFlight | None = None
        while ahead:
            plan = ahead.popleft()
            waited = time.perf_counter()
            with unlocked():
                self._features_result(plan)
            self._planner.release(plan)
            wait_s = 0.0 if serial else time.perf_counter() - waited  # serial: that was the work
            spun_s = 0.0  # CPU seconds of this thread inside the device waits: waiting, not host work
            self._plan_ahead(ahead, depth, before_plan, max_wait_s, until)  # the front end: N+1 (and N+2) ...
            with unlocked():
                record = self._encode(plan)  # ... while cycle N is encoded
                if in_flight is not None:
                    waited_s, spun = self._await(in_flight)
                    wait_s, spun_s = wait_s + waited_s, spun_s + spun
            if in_flight is not None:
                self._collect(in_flight)
            in_flight = record
            if not self.overlap or not ahead:  # serial, or the last cycle that can run now: results in
                with unlocked():
                    waited_s, spun = self._await(record)
                    wait_s, spun_s = wait_s + waited_s, spun_s + spun
                self._collect(record)
                in_flight = None
            cpu_now = time.thread_time()
            own_cpu_s = cpu_now - cpu_mark - record.enqueue_cpu_s - (plan.frontend_cpu_s if serial else 0.0) - spun_s
            cpu_mark = cpu_now
            self.stats.record(
                CycleTiming(
                    plan.index,
                    len(plan.slots),
                    plan.frontend_s,
                    record.enqueue_s,
                    record.encode_s,
                    wait_s,
                    audio_s=plan.audio_samples / SAMPLE_RATE,
                    frontend_cpu_s=plan.frontend_cpu_s,
                    host_cpu_s=own_cpu_s,
                    enqueue_cpu_s=record.enqueue_cpu_s,
                    step_cpu_s=record.step_cpu_s,
                    skipped=plan.skipped,
                )
            )
            ran += 1
        self.stats.wall_s += time.perf_counter() - start_wall
        return ran

    def _plan_ahead(
        self,
        ahead: deque[PlannedCycle],
        depth: int,
        before_plan,
        max_wait_s: float | None = None,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Plan cycles and hand them to the front end until ``depth`` are ahead, none is due yet, or ``until()``.

        With lanes, each plan tries the lanes in turn from the one after the last planned.
        """
        while len(ahead) < depth and not (until is not None and until()):
            if before_plan is not None:
                before_plan(self._cycles)
            plan = None
            for turn in range(len(self.lanes)):
                lane = (self._next_lane + turn) % len(self.lanes)
                bounds = self.lane_bounds[lane] if len(self.lanes) > 1 else None
                plan = self._planner.plan(self._cycles, max_wait_s, bounds)
                if plan is not None:
                    self._next_lane = lane + 1
                    break
            if plan is None:
                return
            self._cycles += 1
            self._submit(plan)
            ahead.append(plan)

    def fail_outputs(self, reason: str) -> None:
        """Fail the output queue of every stream whose final chunk is still to come (the driver cannot go on)."""
        for stream in self._listening:
            stream.chunks.fail(OutputError(f"stream {stream.name!r} will get no more chunks: {reason}"))  # type: ignore[union-attr]
        self._listening.clear()

    def close(self) -> None:
        """Stop the worker thread or processes."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if self._process is not None:
            self._process.close()
            self._process = None
        if self._features_region is not None:
            if self._copied is not None:
                self._copied.synchronize()  # no copy reads the memory once it is pageable again
            self._features_region.close()
            self._features_region = None

    def _submit(self, plan: PlannedCycle) -> None:
        """Start ``plan``'s features beside the main thread (a serial driver computes them when it needs them)."""
        if self._process is not None:
            self._process.submit(plan.blocks)  # its features are the processes' next result
        elif self._worker is not None:
            plan.pending = self._worker.submit(self._features, plan)

    def _features_result(self, plan: PlannedCycle) -> None:
        """``plan``'s features, computed (the caller then releases their room in the rings)."""
        if self._process is not None:
            result = self._process.result()
            plan.features, plan.counts = result.features, result.counts
            plan.frontend_s, plan.frontend_cpu_s = result.seconds, result.cpu_s
        elif isinstance(plan.pending, Future):
            plan.pending.result()
        else:
            self._features(plan)

    def _features(self, plan: PlannedCycle) -> None:
        """Worker (or serial): the frames of every slot's block in one batched front-end call, as one chunk batch."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        plan.features, plan.counts = self._slot_features.compute_cycle(self._samples, plan.blocks)  # type: ignore[union-attr]
        plan.frontend_s, plan.frontend_cpu_s = time.perf_counter() - started, time.thread_time() - cpu_started

    @torch.no_grad()
    def _encode(self, plan: PlannedCycle) -> _InFlight:
        """Stage the batch, reset starting slots, one chunk step, head and argmax; nothing waits for the device."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        events = None
        lo, hi = plan.lane or (0, self.batch_size)
        lane = self._lane_at[lo, hi]
        context = torch.cuda.stream(self._compute) if self._compute is not None else contextlib.nullcontext()
        with context:
            if plan.joins.size:
                lane.reset_slots(plan.joins - lo)
            if self._compute is not None:
                events = self._step_events[plan.index % 2]
                events[0].record()
            step_started = time.perf_counter()
            # A full cycle passes no mask: every slot steps (the free ones with no frames).
            active = plan.blocks.active[lo:hi] if plan.skipped else None
            final = plan.blocks.final[lo:hi]
            chunk = plan.features[lo:hi]
            if self._features_region is not None and self._features_region.pinned:
                chunk, self._copied = copy_pinned(torch.from_numpy(chunk), self.device, dtype=lane.dtype)
                self._process.read_until(self._copied)  # type: ignore[union-attr]
            step_cpu_started = time.thread_time()
            outputs, valid = lane.step(chunk, plan.counts[lo:hi], final, active)
            step_cpu_s = time.thread_time() - step_cpu_started
            embeddings = None
            if self._listening:  # enqueued before the argmax copy, so that its event covers both
                embeddings = to_host(outputs)[0] if self.outputs_on == "host" else outputs.clone()
            best = self.head(outputs).argmax(dim=-1)
            encode_s = time.perf_counter() - step_started
            done = None
            if self._compute is not None:
                events[1].record()
                # Read at collection, after `done`; the buffer is reused two cycles later.
                host = self._best_host[plan.index % 2][: best.numel()].view(best.shape)
                best, done = to_host(best, out=host)
                encode_s = 0.0  # read from the events at collection
        return _InFlight(
            plan,
            best,
            embeddings,
            valid.copy(),
            done,
            events,
            time.perf_counter() - started,
            time.thread_time() - cpu_started,
            step_cpu_s,
            encode_s,
        )

    def _await(self, record: _InFlight) -> tuple[float, float]:
        """Wait for a cycle's results on the device (CUDA); returns the seconds spent waiting, wall and this
        thread's CPU (the CUDA runtime spins on the event: a wait the device makes long costs CPU time too)."""
        if record.done is None:
            return 0.0, 0.0
        started, cpu_started = time.perf_counter(), time.thread_time()
        record.done.synchronize()
        waited, spun = time.perf_counter() - started, time.thread_time() - cpu_started
        record.encode_s = record.events[0].elapsed_time(record.events[1]) / 1000.0
        return waited, spun

    def _collect(self, record: _InFlight) -> None:
        """Decode a cycle's argmax into each active stream's ids (one cycle later), its results in (:meth:`_await`)."""
        if record.done is not None:
            self.stats.set_encode(record.cycle.index, record.encode_s)
        plan = record.cycle
        self._decoder.reset(plan.joins)  # new utterances in these rows
        streams, final = plan.streams, plan.blocks.final
        rows = plan.slots - (plan.lane[0] if plan.lane else 0)
        # Only slots with tokens this cycle, or whose stream ends, have anything to decode or deliver (a
        # Qwen3-ASR slot has tokens one cycle in eight, when its window closes).
        speaking = (record.valid[rows] > 0) | final[plan.slots]
        slots, rows = plan.slots[speaking], rows[speaking]
        counts = record.valid[rows]
        new_ids, new_at = self._decoder.push_best_at(record.best.cpu().numpy()[rows], counts, slots)
        for slot, row, ids, at, count in zip(slots.tolist(), rows.tolist(), new_ids, new_at, counts.tolist()):
            stream = streams[slot]
            if stream.chunks is not None and record.embeddings is not None:
                self._deliver(stream, record.embeddings[row, :count], bool(final[slot]))
            stream.ids.extend(ids)
            stream.id_tokens.extend(stream.tokens + frame for frame in at)
            stream.tokens += count
        for slot in np.flatnonzero(final).tolist():
            streams[slot].done = True

    def _deliver(self, stream: DriverStream, embeddings: torch.Tensor, final: bool) -> None:
        """Hand ``stream`` its chunk of this cycle; after its final one the driver keeps no reference to them."""
        count = len(embeddings)
        chunk = EncoderChunk(stream.name, stream.tokens, embeddings, self.clock.times_ms(stream.tokens, count), final)
        stream.chunks.deliver(chunk)  # type: ignore[union-attr]
        if final:
            self._listening.discard(stream)
