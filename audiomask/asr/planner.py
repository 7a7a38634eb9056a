"""The driver's per-cycle host bookkeeping: samples in, and which slot gives which block to the next cycle.

:class:`CyclePlanner` keeps each slot's state in ``(B,)`` numpy arrays and
its samples in a ring per slot (:class:`~audiomask.features.slots.SlotSamples`,
which the front end reads from directly), so that planning a cycle is a few array
operations whatever the number of slots:

- :meth:`~CyclePlanner.feed` writes a stream's samples straight into its
  slot's ring (the one copy of them the driver makes); samples of a stream
  still waiting for a slot, or beyond what its ring has room for, wait in the
  stream's own queue until there is room.
- :meth:`~CyclePlanner.plan` admits waiting streams into free slots (a
  stream joins once its first block is there or it has ended, in the order
  those arrived: a stream without audio never holds back the others), then names the
  next block in its ring of every slot that advances: a stream's first block
  is ``first_block`` samples (its first chunk of frames), later ones
  ``block``. A slot is *ready* when its next block is there or its stream has
  ended. A *full* cycle advances every occupied slot and runs only when all
  of them are ready (the throughput policy: every step carries every stream);
  with ``max_wait_s`` a cycle also runs over the ready slots alone once one
  of them has waited that long for the others, or once one of them has ended
  (nothing more will come for it to wait with). A slot left out keeps its
  ring positions, and the front end its framer and state: it goes on where
  it stopped. A stream whose last block goes into a cycle leaves its slot at
  once; the slot's ring keeps that block until the cycle's features are
  computed.
- :meth:`~CyclePlanner.release` frees a cycle's blocks once its features are.

With lanes (the driver's slots split into groups that step apart), a stream
joins the lane of its *phase*: the moment its first block arrived, within
the period of one block of audio, picks one of the lanes evenly (the nearest
lane with a free slot when that one is full). Live streams keep their phase,
as their blocks come once a period, so each lane's streams are ready at
about the same time and a lane's cycle carries them all.

Per-stream Python runs only where a stream joins or leaves a slot, and for
streams fed more than their ring holds (a whole file at once): the steady
state of live streams takes none.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from audiomask.asr.outputs import ChunkQueue
from audiomask.constants import SAMPLE_RATE
from audiomask.features.frontend import Frontend
from audiomask.features.process import MAX_IN_FLIGHT
from audiomask.features.slots import SlotCycle, SlotSamples
from audiomask.streaming.plan import block_samples

if TYPE_CHECKING:
    import torch

__all__ = [
    "RING_BLOCKS",
    "CyclePlanner",
    "DriverStream",
    "PlannedCycle",
    "block_samples",
    "ring_capacity",
    "slot_host_bytes",
]

# Blocks a slot's ring holds beyond a stream's first one: the cycles in flight between planning and the
# front end's result (at most MAX_IN_FLIGHT - 1 while one is planned), the one planned, and samples fed ahead.
RING_BLOCKS = MAX_IN_FLIGHT + 1


def ring_capacity(first_block: int, block: int) -> int:
    """Samples of each slot's ring: a first block and :data:`RING_BLOCKS` blocks.

    >>> ring_capacity(20720, 20480)
    82160
    """
    return first_block + RING_BLOCKS * block


# Feature batches alive at once: the processes' buffers (one read, MAX_IN_FLIGHT in flight), or a thread's cycles.
_FEATURE_BATCHES = MAX_IN_FLIGHT + 1
_FLOAT32_BYTES = 4


def slot_host_bytes(frontend: Frontend, chunk_frames: int) -> int:
    """Host bytes a driver keeps per slot: its samples' ring and its rows of the feature batches (float32).

    >>> from audiomask.features import Phi4MMFrontend
    >>> slot_host_bytes(Phi4MMFrontend(), 32)  # a ring of 20,720 samples, 3 rows of 32 x 80
    113600
    """
    ring = ring_capacity(*block_samples(frontend, chunk_frames))
    return _FLOAT32_BYTES * (ring + _FEATURE_BATCHES * chunk_frames * frontend.n_mels)


class DriverStream:
    """One utterance inside a :class:`~audiomask.asr.driver.StreamingDriver`: samples in, token ids (and outputs) out.

    ``chunks``: where its encoder outputs go as they are produced (a
    :class:`~audiomask.asr.outputs.ChunkQueue`), or ``None`` when nobody asked for them.
    """

    def __init__(self, name: str, chunks: ChunkQueue | None = None) -> None:
        self.name = name
        self.ids: list[int] = []  # greedy CTC token ids so far
        self.id_tokens: list[int] = []  # the encoder output token at which each of ids was emitted
        self.tokens = 0  # encoder output tokens so far
        self.chunks = chunks
        self.ended = False  # no more samples will come
        self.done = False  # every output has been collected
        self._queue: deque[np.ndarray] = deque()  # samples not in a slot's ring yet, oldest first
        self._queued = 0  # samples in _queue
        self._slot: int | None = None  # the slot it holds, or last held
        self._planner: CyclePlanner | None = None  # while it holds a slot
        self._joinable = False  # its first block (or its end) has arrived: it may take a slot
        self._joinable_at = 0.0  # when it did (the planner's clock): its phase
        self._fed_before = 0  # samples handed to the front end, counted when it left its slot

    def __repr__(self) -> str:
        return f"DriverStream({self.name!r}, tokens={self.tokens}, done={self.done})"

    @property
    def outputs(self) -> list[torch.Tensor]:
        """The ``(n, D)`` embeddings of the chunks delivered to :attr:`chunks` and not yet taken, in order.

        With the driver's ``keep_outputs`` (nobody takes them) that is every output so far.
        """
        return [] if self.chunks is None else [chunk.embeddings for chunk in self.chunks.peek()]

    @property
    def _fed(self) -> int:
        """Samples handed to the front end so far."""
        if self._planner is None:
            return self._fed_before
        return self._planner.fed(self._slot)  # type: ignore[arg-type]


@dataclass
class PlannedCycle:
    """One cycle as planned: each slot's block, the streams, and what the driver fills in as it goes."""

    index: int
    blocks: SlotCycle  # (B,) each: the front end's input; blocks.active: the slots that advance
    streams: list[DriverStream | None]  # (B,): each slot's stream in this cycle
    ends: np.ndarray  # (B,) int64: ring positions after each active slot's block
    slots: np.ndarray  # (S,) int64: the active slots, ascending
    joins: np.ndarray  # int64: the slots whose stream starts in this cycle
    audio_samples: int  # samples in the cycle's blocks
    skipped: int = 0  # occupied slots left out (not ready): 0 in a full cycle
    lane: tuple[int, int] | None = None  # [lo, hi): the slots the cycle was planned over (None: all)
    pending: object = None  # the front end's Future, on a worker thread
    features: np.ndarray | None = None  # the slots' chunk_shape host batch
    counts: np.ndarray | None = None  # (B,) int64: frames per slot
    frontend_s: float = 0.0  # the front end's wall time
    frontend_cpu_s: float = 0.0


class CyclePlanner:
    """Slots, rings and waiting streams of a driver; plans each cycle (see the module docstring).

    Args:
        batch_size: slots, ``B``.
        first_block: samples of a stream's first block.
        block: samples of each later block (its last may be shorter).
        samples: the slots' rings, :func:`ring_capacity` samples each at least.
        clock: seconds, monotonic: how long a ready block has waited (:meth:`plan`'s ``max_wait_s``).
        lanes: the driver's lanes, ``[lo, hi)`` slots each, that a joining stream picks by its phase
            (see the module docstring); ``None``: the lowest free slot.
    """

    def __init__(
        self,
        batch_size: int,
        first_block: int,
        block: int,
        samples: SlotSamples,
        clock: Callable[[], float] = time.monotonic,
        lanes: list[tuple[int, int]] | None = None,
    ) -> None:
        if samples.capacity < ring_capacity(first_block, block) or len(samples.memory) != batch_size:
            raise ValueError(
                f"samples must hold ({batch_size}, >= {ring_capacity(first_block, block)}) (batch_size, "
                f"ring_capacity), got {samples.memory.shape}"
            )
        self.batch_size, self.first_block, self.block, self.samples = batch_size, first_block, block, samples
        self.clock = clock
        self.lanes = lanes
        self.period_s = block / SAMPLE_RATE  # a live stream's blocks come once a period
        self.waiting: dict[DriverStream, None] = {}  # opened, no slot yet, in order of opening
        self._joinable: deque[DriverStream] = deque()  # waiting ones that may take a slot, in order of arrival
        self._occupants: list[DriverStream | None] = [None] * batch_size
        self._occupied = np.zeros(batch_size, bool)
        self._ended = np.zeros(batch_size, bool)  # the occupant's stream has ended
        self._spilled = np.zeros(batch_size, bool)  # the occupant's queue holds samples its ring had no room for
        # Since when the occupant has had its next block (or its end) without a break; inf while it has not.
        self._ready_since = np.full(batch_size, np.inf)
        # Ring positions (SlotSamples): samples written, handed to cycles, and freed by their features; and
        # where the occupant's samples start.
        self._written = np.zeros(batch_size, np.int64)
        self._planned = np.zeros(batch_size, np.int64)
        self._released = np.zeros(batch_size, np.int64)
        self._begin = np.zeros(batch_size, np.int64)

    def open(self, stream: DriverStream) -> None:
        """Queue ``stream`` for a slot; it takes one once its first block (or its end) has arrived."""
        self.waiting[stream] = None

    def feed(self, stream: DriverStream, samples: np.ndarray) -> None:
        """Queue ``samples`` (checked float32, copied here) for ``stream``: into its ring where there is room."""
        slot = stream._slot if stream._planner is self else None
        if slot is not None and not self._spilled[slot]:
            room = self.samples.capacity - int(self._written[slot] - self._released[slot])
            fits = min(room, len(samples))
            if fits:
                self.samples.write(slot, int(self._written[slot]), samples[:fits])
                self._written[slot] += fits
                samples = samples[fits:]
        if len(samples):
            stream._queue.append(samples.copy())
            stream._queued += len(samples)
            if slot is not None:
                self._spilled[slot] = True
            elif stream._queued >= self.first_block:
                self._may_join(stream)

    def end(self, stream: DriverStream) -> None:
        """No more samples for ``stream``."""
        stream.ended = True
        if stream._planner is self:
            self._ended[stream._slot] = True
        elif stream in self.waiting:
            self._may_join(stream)

    def drop(self, stream: DriverStream) -> None:
        """End ``stream`` whose results nobody will read: one still waiting for a slot leaves at once, done.

        One in a slot is ended: its blocks already fed run through the next
        cycles (its slot's state must go on in cycle order) and it leaves.
        """
        if stream in self.waiting:
            del self.waiting[stream]
            if stream._joinable:
                self._joinable.remove(stream)
            stream._queue.clear()
            stream._queued = 0
            stream.ended = stream.done = True
            return
        self.end(stream)

    def fed(self, slot: int) -> int:
        """Samples the occupant of ``slot`` has handed to cycles."""
        return int(self._planned[slot] - self._begin[slot])

    def occupants(self) -> list[DriverStream]:
        """The streams holding a slot, by slot."""
        return [stream for stream in self._occupants if stream is not None]

    def has_block(self, stream: DriverStream) -> bool:
        """Whether ``stream`` has a block for a cycle now: its next block (or, ended, its rest) is in."""
        if stream.done:
            return False
        if stream._planner is not self:  # waiting for a slot, or its last block planned
            return stream in self.waiting and (stream.ended or stream._queued >= self.first_block)
        slot = stream._slot
        if self._ended[slot] or self._spilled[slot]:
            return True
        planned = self._planned[slot]  # one slot's next block: _need() would compute every slot's
        need = self.first_block if planned == self._begin[slot] else self.block
        return bool(self._written[slot] - planned >= need)

    def waited_s(self) -> float | None:
        """Seconds the longest-waiting ready slot has had its next block (or its end); ``None``: none is ready.

        Readiness is noted when :meth:`plan` first finds it.
        """
        since = float(self._ready_since.min())
        return None if since == np.inf else self.clock() - since

    def plan(
        self, index: int, max_wait_s: float | None = None, lane: tuple[int, int] | None = None
    ) -> PlannedCycle | None:
        """Cycle ``index``, or ``None`` when no cycle is due (see the module docstring).

        ``max_wait_s``: ``None``, full cycles only; else a cycle over the
        ready slots alone once one of them has waited ``max_wait_s`` seconds
        for the others or has ended (``0``: whenever some slot is ready).
        ``lane``: ``(lo, hi)``, plan over slots ``[lo, hi)`` only, as if
        they were all the slots (the others neither advance nor hold it back).
        """
        for slot in np.flatnonzero(self._spilled).tolist():
            self._refill(slot)
        self._admit()
        occupied = self._occupied
        if lane is not None:
            occupied = np.zeros_like(occupied)
            occupied[lane[0] : lane[1]] = self._occupied[lane[0] : lane[1]]
        if not occupied.any():
            return None
        available, need = self._written - self._planned, self._need()
        # A slot whose queue still holds samples after the refill has a full ring: its next block is there.
        ready = occupied & (self._ended | (available >= need))
        now = self.clock()
        self._ready_since[ready & (self._ready_since == np.inf)] = now
        skipped = int(np.count_nonzero(occupied & ~ready))
        if skipped:
            if max_wait_s is None or not ready.any():
                return None
            due_at = float(self._ready_since[ready].min()) + max_wait_s
            if due_at > now and not (ready & self._ended).any():
                return None
        take = np.where(ready, np.minimum(need, available), 0)
        final = ready & self._ended & (available == take)  # a spilled slot's ring holds more than a block
        join = ready & (self._planned == self._begin)  # the stream's first block (or its end without audio)
        start = self._planned.copy()
        self._planned += take
        cycle = PlannedCycle(
            index,
            SlotCycle(ready, final, join, start, take),
            list(self._occupants),
            self._planned.copy(),
            np.flatnonzero(ready),
            np.flatnonzero(join),
            int(take.sum()),
            skipped,
            lane,
        )
        # A slot whose next block is already there stays ready since when it was: it has not stopped waiting.
        still = ready & ~final & (self._written - self._planned >= self._need())
        self._ready_since[ready & ~still] = np.inf
        for slot in np.flatnonzero(final).tolist():
            self._vacate(slot)  # free for the next plan: every reset is applied in cycle order
        return cycle

    def release(self, cycle: PlannedCycle) -> None:
        """``cycle``'s features are computed: its blocks' room in the rings may be written again."""
        self._released[cycle.slots] = cycle.ends[cycle.slots]

    def _need(self) -> np.ndarray:
        """``(B,)`` samples of each slot's next block: a first block where its stream has handed none yet."""
        return np.where(self._planned == self._begin, self.first_block, self.block)

    def _may_join(self, stream: DriverStream) -> None:
        """``stream``, waiting, has its first block or has ended: queue it for the next free slot."""
        if not stream._joinable:
            stream._joinable, stream._joinable_at = True, self.clock()
            self._joinable.append(stream)

    def _admit(self) -> None:
        """Waiting streams that may join into free slots, in the order their first block (or end) arrived."""
        if not self._joinable:
            return
        if self.lanes is None:
            free = np.flatnonzero(~self._occupied)[: len(self._joinable)].tolist()
            self._seat([(slot, self._joinable.popleft()) for slot in free])
            return
        while self._joinable and not self._occupied.all():
            candidate = self._joinable.popleft()
            self._seat([(self.lane_slot(candidate._joinable_at), candidate)])

    def lane_slot(self, at: float) -> int:
        """A free slot of the lane of phase ``at`` (the planner's clock, seconds), else of the nearest lane with one.

        >>> planner = CyclePlanner(4, 1600, 1600, SlotSamples(np.zeros((4, 8000), np.float32)),
        ...                        lanes=[(0, 2), (2, 4)])  # blocks of 100 ms: phases 0-50 ms, 50-100 ms
        >>> planner.lane_slot(3.02), planner.lane_slot(3.07)
        (0, 2)
        """
        assert self.lanes is not None
        count = len(self.lanes)
        preferred = int(at % self.period_s / self.period_s * count) % count
        for distance in range(count):
            for lane in dict.fromkeys(((preferred + distance) % count, (preferred - distance) % count)):
                lo, hi = self.lanes[lane]
                free = np.flatnonzero(~self._occupied[lo:hi])
                if free.size:
                    return lo + int(free[0])
        raise ValueError("lane_slot: every slot is occupied")

    def _seat(self, seats: list[tuple[int, DriverStream]]) -> None:
        """Give each ``(slot, stream)``'s stream its slot."""
        for slot, candidate in seats:
            del self.waiting[candidate]
            self._occupants[slot], candidate._slot, candidate._planner = candidate, slot, self
            self._occupied[slot], self._ended[slot] = True, candidate.ended
            self._begin[slot] = self._written[slot]
            self._refill(slot)

    def _refill(self, slot: int) -> None:
        """Move the occupant's queued samples into its ring, as many as it has room for."""
        stream = self._occupants[slot]
        room = self.samples.capacity - int(self._written[slot] - self._released[slot])
        queue = stream._queue  # type: ignore[union-attr]
        while queue and room:
            piece = queue[0]
            moved = min(len(piece), room)
            self.samples.write(slot, int(self._written[slot]), piece[:moved])
            self._written[slot] += moved
            room -= moved
            stream._queued -= moved  # type: ignore[union-attr]
            if moved == len(piece):
                queue.popleft()
            else:
                queue[0] = piece[moved:]
        self._spilled[slot] = bool(queue)

    def _vacate(self, slot: int) -> None:
        """The occupant's last block is planned: it leaves the slot (its ring keeps the block until released)."""
        stream = self._occupants[slot]
        stream._fed_before, stream._planner = self.fed(slot), None  # type: ignore[union-attr]
        self._occupants[slot] = None
        self._occupied[slot] = self._ended[slot] = False
        self._ready_since[slot] = np.inf
