"""The streaming driver: CPU features of cycle N+1 overlap the encoder step of cycle N, for many streams.

:class:`StreamingDriver` owns the ``B`` slots of an encoder stream (any
:class:`~audiomask.streaming.EncoderStream`: preallocated caches, static
shapes) and advances every utterance that occupies a slot by one encoder
chunk per *cycle*:

1. **plan** (main thread, host bookkeeping only): admit waiting streams into
   free slots; take each occupied slot's next block of samples (a stream's
   first block is ``hop * (chunk_frames - 1) + win - pad`` samples, later
   blocks ``chunk_frames * hop``, so every block but the last yields exactly
   one encoder chunk of frames, whatever sizes the samples arrived in).
2. **features** (worker thread): the frames of every slot's block in ONE
   batched front-end call (by default the stream family's,
   :meth:`~audiomask.streaming.EncoderStream.default_frontend`), laid out as
   the stream's ``chunk_shape`` host batch.
3. **encode** (main thread): the batch is staged to the device with
   :func:`audiomask.transfer.to_device` (the only host->device path); slots
   whose stream starts this cycle are reset
   (:meth:`~audiomask.streaming.EncoderStream.reset_slots`); one
   chunk step runs for all ``B`` slots, then the CTC head and the per-frame
   argmax. On CUDA the step runs on a compute stream between two CUDA events
   and the small argmax result is copied back non-blocking.
4. **collect** (main thread, one cycle later): read cycle N-1's argmax (its
   event has long completed when cycle N has been enqueued), greedy-CTC decode
   each slot's real frames (:class:`~audiomask.asr.decoding.GreedyCTCDecoder`),
   append text (and, with ``keep_outputs``, the encoder outputs).

Why a worker thread: the front end is the CPU's share (log-mel of every
stream's block, one batched torch computation) and the encoder step is the
device's share. They depend on each other only through the per-cycle batch:
the features of cycle N+1 need only samples (host), never results of cycle N.
So the main thread plans cycle N+1 and hands its features to a single worker
thread, then encodes cycle N, and the host work of N+1 hides behind the GPU
work of N. One worker (not a pool) keeps the front-end state of each slot
(:class:`~audiomask.features.slots.SlotFeatures`) touched in cycle order; all
slot resets are applied in cycle order by the stage that owns the state
(framers: features; caches: encode; decoder rows: collect), so a slot freed
in cycle N can be reused in cycle N+1.

A thread shares the interpreter lock with the main thread, and the front end
hands it over and takes it back at every torch call: with cycles of a few
milliseconds the two threads slow each other down (on the H200 the front end
ran 1.7-2.3x slower overlapped than alone). ``frontend_process=True`` moves
the worker into a process of its own
(:class:`~audiomask.features.process.FeatureProcess`: shared-memory buffers,
the same computation bit for bit), for servers that keep a driver running:
on the H200 that driver ran 2.7x faster than serial, within 3 % of
max(front end, encoder step), where a thread gave 1.16x.

Batching: a stream's row of the batch sees only its own caches, masks and
token positions (its start step is recorded per slot), so its outputs do not
depend on which streams share the batch, up to float rounding of batched
GEMMs. The cycle is a barrier: it runs only when every occupied slot has its
next block (or has ended). Streams are admitted only once their first block
is there, so a slow live stream holds back its batch only mid-utterance;
per-slot ring phases (so that a slot can skip a step) are future work.

Instrumentation: one :class:`CycleTiming` per cycle (CPU feature time,
host enqueue time, encode time — CUDA events on CUDA, ``perf_counter`` on the
CPU, wait time) and :meth:`RunStats.overlap`,
``(T_cpu + T_gpu - T_wall) / min(T_cpu, T_gpu)``.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from audiomask.asr.decoding import GreedyCTCDecoder
from audiomask.checks import check_int
from audiomask.features.frontend import Frontend, as_samples
from audiomask.features.process import MAX_IN_FLIGHT, FeatureProcess
from audiomask.features.slots import SlotFeatures
from audiomask.models.ctc import CTCHead
from audiomask.streaming import EncoderStream
from audiomask.transfer import pinned_empty, to_host

__all__ = ["RECENT_CYCLES", "CycleTiming", "DriverStream", "RunStats", "StreamingDriver"]


@dataclass
class CycleTiming:
    """Seconds spent on one cycle (one encoder chunk step for all its streams)."""

    cycle: int
    streams: int  # occupied slots
    cpu_s: float  # front end (worker thread)
    enqueue_s: float  # host time to stage, reset, launch the step, head and argmax
    encode_s: float  # the step on the device (CUDA events) or on the CPU (perf_counter)
    wait_s: float  # main thread blocked on the worker's features or on results


RECENT_CYCLES = 4096  # per-cycle timings kept: a server running for days keeps totals, not every cycle


@dataclass
class RunStats:
    """Timings of the recent cycles, totals over every cycle, and the wall time of the driver's loops.

    ``cycles`` holds the last :data:`RECENT_CYCLES` :class:`CycleTiming` (older
    ones are dropped, so memory stays flat however long a driver runs);
    ``count``, ``chunks`` (stream-chunks encoded), ``cpu_s`` and ``gpu_s`` count
    every cycle. Given ``cycles`` and no totals, the totals are computed from them.

    >>> stats = RunStats([CycleTiming(0, 2, cpu_s=2.0, enqueue_s=0.1, encode_s=3.0, wait_s=0.0)], wall_s=3.5)
    >>> stats.count, stats.chunks, stats.overlap()
    (1, 2, 0.75)
    """

    cycles: deque[CycleTiming] = field(default_factory=deque)
    wall_s: float = 0.0
    count: int = 0  # cycles run
    chunks: int = 0  # stream-chunks encoded: the sum of the cycles' streams
    cpu_s: float = 0.0  # front end, all cycles
    gpu_s: float = 0.0  # encoder step, all cycles

    def __post_init__(self) -> None:
        given = list(self.cycles)
        self.cycles = deque(given, maxlen=RECENT_CYCLES)
        if given and not self.count:
            self.count, self.chunks = len(given), sum(c.streams for c in given)
            self.cpu_s, self.gpu_s = sum(c.cpu_s for c in given), sum(c.encode_s for c in given)

    def record(self, timing: CycleTiming) -> None:
        """Add one cycle's timing."""
        self.cycles.append(timing)
        self.count += 1
        self.chunks += timing.streams
        self.cpu_s += timing.cpu_s
        self.gpu_s += timing.encode_s

    def set_encode(self, cycle: int, encode_s: float) -> None:
        """Set the encode time of cycle ``cycle`` once it is known (CUDA events are read one cycle later)."""
        for timing in reversed(self.cycles):
            if timing.cycle == cycle:
                self.gpu_s += encode_s - timing.encode_s
                timing.encode_s = encode_s
                return

    def since(self, cycle: int) -> list[CycleTiming]:
        """The kept timings of cycle ``cycle`` and later."""
        return [timing for timing in self.cycles if timing.cycle >= cycle]

    def overlap(self) -> float:
        """``(T_cpu + T_gpu - T_wall) / min(T_cpu, T_gpu)``: 1 = the shorter side fully hidden, 0 = serial."""
        shorter = min(self.cpu_s, self.gpu_s)
        return (self.cpu_s + self.gpu_s - self.wall_s) / shorter if shorter > 0 else 0.0


class DriverStream:
    """One utterance inside a :class:`StreamingDriver`: samples in, token ids (and outputs) out."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ids: list[int] = []  # greedy CTC token ids so far
        self.tokens = 0  # encoder output tokens so far
        self.outputs: list[torch.Tensor] = []  # with keep_outputs: (n, D) pieces on the CPU
        self.ended = False  # no more samples will come
        self.done = False  # every output has been collected
        self._queue: deque[np.ndarray] = deque()
        self._queued = 0
        self._fed = 0  # samples handed to the front end
        self._slot: int | None = None

    def __repr__(self) -> str:
        return f"DriverStream({self.name!r}, tokens={self.tokens}, done={self.done})"

    def _take(self, count: int) -> np.ndarray:
        """The next ``count`` queued samples (all of them if fewer)."""
        pieces, need = [], count
        while need > 0 and self._queue:
            head = self._queue[0]
            if len(head) <= need:
                pieces.append(self._queue.popleft())
                need -= len(head)
            else:
                pieces.append(head[:need])
                self._queue[0] = head[need:]
                need = 0
        if not pieces:
            block = np.zeros(0, np.float32)
        else:
            block = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        self._queued -= len(block)
        self._fed += len(block)
        return block


@dataclass
class _Cycle:
    index: int
    slots: np.ndarray  # (S,) occupied slots, ascending
    streams: list[DriverStream]
    blocks: list[np.ndarray]
    final: np.ndarray  # (S,) bool: the stream's last block
    joins: np.ndarray  # slots whose stream starts in this cycle
    features: np.ndarray | None = None  # the stream's chunk_shape host batch, set by the worker
    counts: np.ndarray | None = None  # (B,) frames per slot
    cpu_s: float = 0.0


@dataclass
class _InFlight:
    cycle: _Cycle
    best: torch.Tensor  # (B, n) argmax ids (host tensor once the copy has landed)
    outputs: torch.Tensor | None  # (B, n, D), with keep_outputs
    valid: np.ndarray  # (B,) real tokens per slot
    done: object  # CUDA event after the copy back, or None
    events: tuple[object, object] | None  # CUDA events around the step
    enqueue_s: float
    encode_s: float


class StreamingDriver:
    """Advance many streams through front end, encoder step, CTC head and greedy decoding, pipelined.

    Args:
        stream: the encoder stream whose slots the utterances take (any
            :class:`~audiomask.streaming.EncoderStream`, e.g. from
            :func:`~audiomask.streaming.open_stream`; its encoder in eval mode).
            Its ``batch_size`` is the number of concurrent utterances.
        head: the :class:`~audiomask.models.ctc.CTCHead` over the encoder outputs (on the stream's device).
        frontend: the front end (default: the stream's ``default_frontend()``); its mel bins and layout
            must be the stream's.
        keep_outputs: keep every stream's encoder outputs (``DriverStream.outputs``), for tests and analysis.
        overlap: compute the next cycle's features on a worker thread while the device encodes (``False``:
            serial, for comparison: features, encode, wait for the results, cycle after cycle).
        frontend_process: with ``overlap``, compute the features in a process of their own
            (:class:`~audiomask.features.process.FeatureProcess`) rather than on a thread: the front end
            then shares no interpreter lock with the main thread, which a thread does at every torch
            call; it costs a second interpreter (seconds to start, once, and its memory). Call
            :meth:`close` when done. A script that makes such a driver guards its entry point with
            ``if __name__ == "__main__":`` (the process is spawned, which imports the script again).

    >>> import numpy as np
    >>> from audiomask.asr.checkpoint import load_model
    >>> from audiomask.streaming import open_stream
    >>> model = load_model()  # the shipped model: 40 ms tokens, 320 ms chunks
    >>> driver = StreamingDriver(open_stream(model.encoder, batch_size=2), model.head)
    >>> streams = driver.run([np.zeros(8000, np.float32), np.zeros(3000, np.float32)])
    >>> [s.tokens for s in streams]  # ceil(frames / 4): 48 and 17 frames
    [12, 5]
    >>> driver.close()
    """

    def __init__(
        self,
        stream: EncoderStream,
        head: CTCHead,
        frontend: Frontend | None = None,
        *,
        keep_outputs: bool = False,
        overlap: bool = True,
        frontend_process: bool = False,
    ) -> None:
        if not isinstance(stream, EncoderStream):
            raise ValueError(f"stream must be an EncoderStream (audiomask.streaming), got {type(stream).__name__}")
        if not isinstance(head, CTCHead):
            raise ValueError(f"head must be a CTCHead, got {type(head).__name__}")
        if head.proj.in_features != stream.output_size:
            raise ValueError(
                f"head input_size ({head.proj.in_features}) must equal the stream's output_size ({stream.output_size})"
            )
        self.frontend = stream.default_frontend() if frontend is None else frontend
        if self.frontend.n_mels != stream.feature_size or self.frontend.time_axis + 1 != stream.time_dim:
            layout = "(T, n_mels)" if stream.time_dim == 1 else "(n_mels, T)"
            raise ValueError(
                f"frontend must give {layout} features of {stream.feature_size} mels (the stream's), got a "
                f"{type(self.frontend).__name__} of {self.frontend.n_mels} mels, time axis {self.frontend.time_axis}"
            )
        if frontend_process and not overlap:
            raise ValueError("frontend_process=True needs overlap=True (a serial driver computes features in line)")
        self.stream, self.head = stream, head
        self.batch_size, self.device, self.chunk_frames = stream.batch_size, stream.device, stream.chunk_frames
        framing = self.frontend.framing
        self.block_samples = self.chunk_frames * framing.hop  # samples per cycle after the first
        # The first chunk's last frame ends at hop * (chunk_frames - 1) + win samples of the padded signal.
        self.first_block_samples = framing.hop * (self.chunk_frames - 1) + framing.win - framing.pad
        self.keep_outputs = bool(keep_outputs)
        self.stats = RunStats()
        self._decoder = GreedyCTCDecoder(self.batch_size)
        self._slots: list[DriverStream | None] = [None] * self.batch_size
        self._waiting: deque[DriverStream] = deque()
        self._cycles = 0
        self._names = itertools.count()
        self._slot_features = SlotFeatures(self.frontend, self.batch_size, self.chunk_frames)
        threaded = overlap and not frontend_process
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audiomask-features") if threaded else None
        self._process = (
            FeatureProcess(self.frontend, self.batch_size, self.chunk_frames, self.first_block_samples)
            if frontend_process
            else None
        )
        self.overlap = bool(overlap)
        cuda = self.device.type == "cuda"
        self._compute = torch.cuda.Stream(self.device) if cuda else None
        # Two of each, alternating by cycle: cycle N's are read at its collection, before cycle N + 2 reuses them.
        # Flat: a step's (B, n) argmax, n <= tokens_per_chunk, lands in the first B * n entries.
        widest = self.batch_size * stream.tokens_per_chunk
        self._best_host = [pinned_empty((widest,), torch.int64) for _ in range(2 * cuda)]
        self._step_events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2 * cuda)
        ]

    # -- streams -------------------------------------------------------------------------------

    def open(self, name: str | None = None) -> DriverStream:
        """A new stream; it takes a slot once its first block of samples (or its end) has arrived."""
        stream = DriverStream(f"stream-{next(self._names)}" if name is None else str(name))
        self._waiting.append(stream)
        return stream

    def feed(self, stream: DriverStream, samples: object) -> None:
        """Queue 16 kHz float samples for ``stream`` (any number, empty allowed); nothing is computed here."""
        if stream.ended:
            raise ValueError(f"accept after finish: stream {stream.name!r} has ended")
        samples = as_samples("samples", samples)
        if len(samples):
            stream._queue.append(samples.copy())
            stream._queued += len(samples)

    def end(self, stream: DriverStream) -> None:
        """No more samples for ``stream``: its last block is processed by the next cycles."""
        stream.ended = True

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

    def advance(self, before_plan=None) -> int:
        """Run every cycle that can run now (each occupied slot has its next block or has ended).

        ``before_plan(cycle)`` is called before each cycle is planned (to
        admit streams that start then). Returns the number of cycles run.
        """
        start_wall = time.perf_counter()
        ran = 0
        # Cycles planned and handed to the front end ahead of the one being encoded: one for a worker
        # thread; a process gets the next one queued too, so it never waits for this thread to plan.
        depth = MAX_IN_FLIGHT if self._process is not None else 1
        ahead: deque[tuple[_Cycle, Future | _Cycle | None]] = deque()
        self._plan_ahead(ahead, depth, before_plan)
        in_flight: _InFlight | None = None
        while ahead:
            plan, pending = ahead.popleft()
            waited = time.perf_counter()
            self._features_result(plan, pending)
            wait_s = time.perf_counter() - waited if pending is not None else 0.0  # serial: that was the work
            self._plan_ahead(ahead, depth, before_plan)  # the front end computes N+1 (and N+2) ...
            record = self._encode(plan)  # ... while cycle N is encoded
            if in_flight is not None:
                wait_s += self._collect(in_flight)
            in_flight = record
            if not self.overlap:  # serial: a cycle ends (results on the host) before the next one's features
                wait_s += self._collect(record)
                in_flight = None
            self.stats.record(
                CycleTiming(plan.index, len(plan.slots), plan.cpu_s, record.enqueue_s, record.encode_s, wait_s)
            )
            ran += 1
        if in_flight is not None:
            self.stats.cycles[-1].wait_s += self._collect(in_flight)
        self.stats.wall_s += time.perf_counter() - start_wall
        return ran

    def _plan_ahead(self, ahead: deque, depth: int, before_plan) -> None:
        """Plan cycles and hand them to the front end until ``depth`` are ahead or none can run yet."""
        while len(ahead) < depth:
            plan = self._plan(before_plan)
            if plan is None:
                return
            ahead.append((plan, self._submit(plan)))

    def close(self) -> None:
        """Stop the worker thread or process."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if self._process is not None:
            self._process.close()
            self._process = None

    def _submit(self, plan: _Cycle | None) -> Future | _Cycle | None:
        """Start ``plan``'s features beside the main thread: its Future (thread), ``plan`` (process), None (serial)."""
        if plan is None:
            return None
        if self._process is not None:
            self._process.submit(plan.slots, plan.blocks, plan.final, plan.joins)
            return plan  # its features are the process's next result
        if self._worker is None:
            return None
        return self._worker.submit(self._features, plan)

    def _features_result(self, plan: _Cycle, pending: Future | _Cycle | None) -> None:
        if pending is None:
            self._features(plan)
        elif self._process is not None:
            plan.features, plan.counts, plan.cpu_s = self._process.result()
        else:
            pending.result()  # type: ignore[union-attr]

    def _plan(self, before_plan) -> _Cycle | None:
        """Host bookkeeping of the next cycle: admissions, barrier, blocks. None when it cannot run yet."""
        if before_plan is not None:
            before_plan(self._cycles)
        joins = []
        for slot, occupant in enumerate(self._slots):
            if occupant is not None or not self._waiting:
                continue
            candidate = self._waiting[0]
            if not (candidate.ended or candidate._queued >= self.first_block_samples):
                break  # admitted in order of opening
            self._waiting.popleft()
            candidate._slot = slot
            self._slots[slot] = candidate
            joins.append(slot)
        occupied = [s for s in range(self.batch_size) if self._slots[s] is not None]
        if not occupied:
            return None
        needs = {s: self.first_block_samples if self._slots[s]._fed == 0 else self.block_samples for s in occupied}
        if not all(self._slots[s].ended or self._slots[s]._queued >= needs[s] for s in occupied):
            for slot in joins:  # not this cycle after all: back to waiting, slot free again
                stream = self._slots[slot]
                self._slots[slot], stream._slot = None, None
                self._waiting.appendleft(stream)
            return None
        streams = [self._slots[s] for s in occupied]
        blocks = [stream._take(needs[s]) for s, stream in zip(occupied, streams)]
        final = np.array([stream.ended and stream._queued == 0 for stream in streams])
        for slot, last in zip(occupied, final):
            if last:
                self._slots[slot] = None  # free for the next plan: every reset is applied in cycle order
        cycle = _Cycle(
            self._cycles,
            np.array(occupied),
            streams,
            blocks,
            final,
            np.array(joins, np.int64),
        )
        self._cycles += 1
        return cycle

    def _features(self, plan: _Cycle) -> None:
        """Worker (or serial): the frames of every slot's block in one batched front-end call, as one chunk batch."""
        started = time.perf_counter()
        plan.features, plan.counts = self._slot_features.compute(plan.slots, plan.blocks, plan.final, plan.joins)
        plan.cpu_s = time.perf_counter() - started

    @torch.no_grad()
    def _encode(self, plan: _Cycle) -> _InFlight:
        """Stage the batch, reset starting slots, one chunk step, head and argmax; nothing waits for the device."""
        started = time.perf_counter()
        events = None
        context = torch.cuda.stream(self._compute) if self._compute is not None else contextlib.nullcontext()
        final = np.zeros(self.batch_size, bool)
        final[plan.slots] = plan.final
        with context:
            if plan.joins.size:
                self.stream.reset_slots(plan.joins)
            if self._compute is not None:
                events = self._step_events[plan.index % 2]
                events[0].record()
            step_started = time.perf_counter()
            outputs, valid = self.stream.step(plan.features, plan.counts, final)
            best = self.head(outputs).argmax(dim=-1)
            encode_s = time.perf_counter() - step_started
            done = None
            if self._compute is not None:
                events[1].record()
                # Read at collection, after `done`; the buffer is reused two cycles later.
                host = self._best_host[plan.index % 2][: best.numel()].view(best.shape)
                best, done = to_host(best, out=host)
                encode_s = 0.0  # read from the events at collection
        kept = outputs if self.keep_outputs else None
        return _InFlight(
            plan,
            best,
            kept,
            valid.copy(),
            done,
            events,
            time.perf_counter() - started,
            encode_s,
        )

    def _collect(self, record: _InFlight) -> float:
        """Decode a cycle's argmax into each stream's ids (one cycle later); returns the time spent waiting."""
        waited = 0.0
        if record.done is not None:
            started = time.perf_counter()
            record.done.synchronize()
            waited = time.perf_counter() - started
            record.encode_s = record.events[0].elapsed_time(record.events[1]) / 1000.0
            self.stats.set_encode(record.cycle.index, record.encode_s)
        plan = record.cycle
        self._decoder.reset(plan.joins)  # new utterances in these rows
        counts = record.valid[plan.slots]
        new_ids = self._decoder.push_best(record.best.cpu().numpy()[plan.slots], counts, plan.slots)
        for slot, stream, ids, count, last in zip(plan.slots, plan.streams, new_ids, counts.tolist(), plan.final):
            stream.ids.extend(ids)
            stream.tokens += count
            if record.outputs is not None and count:
                stream.outputs.append(record.outputs[slot, :count].cpu())
            if last:
                stream.done = True
        return waited
