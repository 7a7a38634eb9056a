"""Which of a pinned ring's slots are free, asking the driver as little as possible.

Every slot is in exactly one place: leased (staged), idle (its last copy known
complete; kept by capacity), in flight in the queue of the CUDA stream its copy's
event was recorded on (in record order: events on one CUDA stream complete in
order), or guarded by a caller's event.

An acquire takes the smallest idle slot that fits, the most recently released
of those: its memory is the likeliest to be in the CPU's caches still. Only
when none fits does it ask the driver, per stream: about the newest copy
(complete: the whole queue is free at once), else about the oldest (running:
so is the rest), and, when the oldest is complete but too small, bisects for
the first copy still running. A submit that finds its CUDA stream idle frees that
stream's queue without asking (:meth:`SlotPool.stream_idle`). When nothing
fits, the pool grows through the ring's ``new_slots`` (which pins), within
``max_pinned_bytes``, dropping idle blocks to make room; only at that bound
does it wait for the oldest copy in flight.

Copies that ride the consumer's CUDA stream hold their slot until the consumer's
queue reaches them, so a busy queue needs hundreds of slots, and pinning costs
milliseconds a call whatever the size (docs/defaults.md). Those slots are grown in segments: one
pinned block carved into as many slots as the pool holds of that size already
(their number doubles), up to ``SEGMENT_BYTES`` a block.

The pool knows nothing of devices or copies: :class:`~audiomask.transfer.ring.PinnedRing`
makes the slots and the copies, and tells the pool what guards each slot.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["SEGMENT_BYTES", "SMALL_SLOT_BYTES", "Completion", "Segment", "Slot", "SlotPool", "StreamKey"]

SMALL_SLOT_BYTES = 64 * 1024  # the smallest slot the pool grows for a copy that rides the consumer
SEGMENT_BYTES = 4 * 1024 * 1024  # the largest block pinned at once for such slots: 64 slots of 64 KiB

StreamKey = tuple[int, int, int]  # (stream id, device index, device type): names a CUDA stream


class Completion(Protocol):
    """What guards a slot's reuse: ``torch.cuda.Event`` or anything with the same two methods."""

    def query(self) -> bool:
        """Whether the work recorded before it has completed (never blocks)."""
        ...

    def synchronize(self) -> None:
        """Block the host until the work recorded before it has completed."""
        ...


@dataclass(eq=False)
class Segment:
    """One pinned block carved into several slots; its memory is freed once none of them is held."""

    nbytes: int
    held: int = 0  # its slots the pool holds now


@dataclass(eq=False)
class Slot:
    """A pinned host buffer the ring stages payloads in, and what guards its reuse."""

    buffer: torch.Tensor  # (capacity,) uint8
    array: np.ndarray  # the numpy view of buffer
    capacity: int  # bytes
    pinned: bool = False  # page-locked (False where CUDA is unavailable or pinning failed)
    leased: bool = False
    pending: Completion | None = None  # the last copy from this slot, until it is known complete
    released: int = 0  # release sequence number: lower = released earlier
    # The slot's own CUDA event and its device, recorded after every copy from the slot: it is
    # recorded again only by the next submit, which holds the slot only once the event has completed.
    event: Any = None
    event_device: torch.device | None = None
    # Torch and numpy views of the slot that the ring copies through (never handed out, so never changed).
    views: dict[Any, tuple[torch.Tensor, np.ndarray | None]] = field(default_factory=dict)
    segment: Segment | None = None  # the block it was carved from with others (None: a block of its own)


class SlotPool:
    """The slots of one ring and their state; every public method takes :attr:`lock`.

    Args:
        new_slots: makes (pins) ``count`` slots of ``capacity`` bytes in one block: ``new_slots(capacity, count)``.
        slots: the slots to start with, all idle.
        slot_bytes: the least capacity a slot is grown with (copies of up to
            ``consumer_copy_bytes``: ``min(slot_bytes, SMALL_SLOT_BYTES)``), in bytes.
        max_pinned_bytes: bound on the capacity of all blocks held, in bytes.
        consumer_copy_bytes: copies of up to this many bytes ride the consumer's
            stream: they hold their slot until its queue reaches them.
    """

    def __init__(
        self,
        new_slots: Callable[[int, int], list[Slot]],
        slots: list[Slot],
        *,
        slot_bytes: int,
        max_pinned_bytes: int,
        consumer_copy_bytes: int,
    ) -> None:
        self._new_slots = new_slots
        self.slot_bytes = slot_bytes
        self.max_pinned_bytes = max_pinned_bytes
        self.consumer_copy_bytes = consumer_copy_bytes
        self.lock = threading.Lock()
        self.slots: list[Slot] = []
        self.released = 0  # release sequence number of the last slot released
        self.counts = dict.fromkeys(("copies", "bytes_copied", "slot_waits", "grows", "evictions"), 0)
        self._idle: dict[int, list[Slot]] = {}  # by capacity, the most recently released last
        self._capacities: list[int] = []  # the capacities the pool has held, ascending
        self._held: dict[int, int] = {}  # slots held now, by capacity
        self._pinned_bytes = 0  # of the blocks held now (a segment's until its last slot is dropped)
        self._small_capacity = self._grow_size(consumer_copy_bytes) if consumer_copy_bytes else 0
        self._in_flight: dict[StreamKey, deque[Slot]] = {}
        self._guarded: list[Slot] = []
        for slot in slots:
            self._add(slot)
            self._make_idle(slot)

    def snapshot(self) -> dict[str, object]:
        """The counters, and the slots held now: how many, their bytes, how many leased, whether all are pinned."""
        with self.lock:
            return {
                "pinned": bool(self.slots) and all(slot.pinned for slot in self.slots),
                "slots": len(self.slots),
                "pinned_bytes": self._pinned_bytes,
                "leased": sum(slot.leased for slot in self.slots),
                **self.counts,
            }

    def stream_idle(self, stream: StreamKey, released: int) -> None:
        """Every copy on ``stream`` from a slot released up to number ``released`` has completed."""
        with self.lock:
            queue = self._in_flight.get(stream)
            while queue and queue[0].released <= released:
                self._make_idle(queue.popleft())

    def acquire(self, nbytes: int) -> Slot:
        """A slot of at least ``nbytes`` bytes whose last copy has completed, leased to the caller.

        Grows a slot, or at ``max_pinned_bytes`` waits for the oldest copy in
        flight that frees one; raises :class:`ValueError` for a request over the
        bound and :class:`RuntimeError` when every slot is leased and none can grow.
        """
        if nbytes > self.max_pinned_bytes:
            raise ValueError(f"a request of {nbytes} bytes exceeds max_pinned_bytes={self.max_pinned_bytes}")
        while True:
            with self.lock:
                slot = self._take(nbytes) or self._grow(nbytes)
                if slot is not None:
                    return slot
                victim, stream = self._oldest_in_flight(nbytes)
            victim.pending.synchronize()  # type: ignore[union-attr]
            with self.lock:
                self.counts["slot_waits"] += 1
                victim.pending = None
                if stream is not None:  # the copies recorded before it on its stream have completed too
                    queue = self._in_flight[stream]
                    while queue and queue[0].released < victim.released:
                        self._make_idle(queue.popleft())
                if victim.capacity >= nbytes:
                    return victim
                victim.leased = False  # too small: now idle, the next round drops it for a larger one
                self._make_idle(victim)

    def release(
        self,
        slot: Slot,
        pending: Completion | None,
        copied: int | None,
        stream: StreamKey | None = None,
        record_on: Any = None,
    ) -> None:
        """Hand ``slot`` back, guarded by ``pending``; ``stream``: the key of the CUDA stream a submit records it on.

        ``copied``: the bytes a submit copied (``None``: no copy). ``record_on``:
        the stream to record ``pending`` on first. The record is made under the
        lock, as the slot joins its stream's queue, so that the queue's order is
        the order of the records (two threads may copy on one stream): the pool
        infers from the newest record's completion that the whole queue has completed.
        """
        with self.lock:
            if record_on is not None:
                pending.record(record_on)  # type: ignore[union-attr]
            slot.leased = False
            slot.pending = pending
            self.released += 1
            slot.released = self.released
            if pending is None:
                self._make_idle(slot)
            elif stream is None:
                self._guarded.append(slot)
            else:
                self._in_flight.setdefault(stream, deque()).append(slot)
            if copied is not None:
                self.counts["copies"] += 1
                self.counts["bytes_copied"] += copied

    def _take(self, nbytes: int) -> Slot | None:
        """An idle slot for ``nbytes``, leased; the driver is asked only when none is known idle.

        A copy that rides the consumer holds its slot until the queue reaches
        it: where slots of its own size exist, it takes a larger one only when
        none of those is free, even after asking.
        """
        largest = None
        if nbytes <= self.consumer_copy_bytes:
            own_size = self._grow_size(nbytes)
            if self._holds(nbytes, own_size):
                largest = own_size
        slot = self._take_idle(nbytes, largest)
        if slot is None:
            self._reclaim(nbytes)
            slot = self._take_idle(nbytes, largest)
            if slot is None and largest is not None:
                slot = self._take_idle(nbytes)
        return slot

    def _take_idle(self, nbytes: int, largest: int | None = None) -> Slot | None:
        """The smallest idle slot that fits (of <= ``largest`` bytes), leased; of those, the most recently released."""
        capacities = self._capacities
        end = len(capacities) if largest is None else bisect.bisect_right(capacities, largest)
        for i in range(bisect.bisect_left(capacities, nbytes), end):
            bucket = self._idle[capacities[i]]
            if bucket:
                slot = bucket.pop()
                slot.leased = True
                return slot
        return None

    def _holds(self, smallest: int, largest: int) -> bool:
        """Whether the pool holds a slot of ``smallest`` to ``largest`` bytes, idle or not."""
        capacities = self._capacities
        start, end = bisect.bisect_left(capacities, smallest), bisect.bisect_right(capacities, largest)
        return any(self._held[capacities[i]] for i in range(start, end))

    def _reclaim(self, nbytes: int) -> None:
        """Make idle the slots whose last copy has completed, until one fits ``nbytes`` (or none is left to ask)."""
        for queue in self._in_flight.values():
            if not queue:
                continue
            if queue[-1].pending.query():  # type: ignore[union-attr]
                completed = len(queue)
            elif len(queue) < 2 or not queue[0].pending.query():  # type: ignore[union-attr]
                continue  # the oldest is running: so is every later copy on this stream
            elif queue[0].capacity >= nbytes:
                completed = 1  # the common case: one copy completed since the last acquire
            else:
                completed = self._count_completed(queue)
            fits = False
            for _ in range(completed):
                slot = queue.popleft()
                self._make_idle(slot)
                fits = fits or slot.capacity >= nbytes
            if fits:
                return
        for slot in list(self._guarded):
            if slot.pending.query():  # type: ignore[union-attr]
                self._guarded.remove(slot)
                self._make_idle(slot)
                if slot.capacity >= nbytes:
                    return

    @staticmethod
    def _count_completed(queue: deque[Slot]) -> int:
        """How many copies at the front of ``queue`` have completed, its oldest complete and its newest running.

        Completion follows record order, so a bisection finds the first copy
        still running: O(log k) questions, where asking each of k copies would
        cost a driver call apiece.
        """
        done, running = 0, len(queue) - 1  # indices known complete and known running
        while running - done > 1:
            middle = (done + running) // 2
            if queue[middle].pending.query():  # type: ignore[union-attr]
                done = middle
            else:
                running = middle
        return running

    def _grow_size(self, nbytes: int) -> int:
        """The capacity of the slot the pool grows for ``nbytes``: a power of two, at least ``slot_bytes``.

        A copy on the consumer's CUDA stream holds its slot until the queue reaches
        it: many may be in flight, so they grow slots of their own size.
        """
        smallest = min(self.slot_bytes, SMALL_SLOT_BYTES) if nbytes <= self.consumer_copy_bytes else self.slot_bytes
        return min(max(smallest, 1 << max(nbytes - 1, 0).bit_length()), self.max_pinned_bytes)

    def _grow(self, nbytes: int) -> Slot | None:
        """Pin new slots for ``nbytes`` (a segment of them where it grows small ones): the first, leased; else None.

        Within ``max_pinned_bytes``: fewer slots where a segment would not fit,
        and for a single slot the idle blocks dropped that make room; None
        where even those are not enough.
        """
        size = self._grow_size(nbytes)
        count = 1
        if size <= self._small_capacity:
            count = max(1, min(self._held.get(size, 0), SEGMENT_BYTES // size))
        count = min(count, max(1, (self.max_pinned_bytes - self._pinned_bytes) // size))
        excess = self._pinned_bytes + size * count - self.max_pinned_bytes
        if excess > 0 and not self._evict(excess):
            return None
        slots = self._new_slots(size, count)
        for slot in slots:
            self._add(slot)
        for slot in slots[1:]:
            self._make_idle(slot)
        slots[0].leased = True
        self.counts["grows"] += 1
        return slots[0]

    def _evict(self, excess: int) -> bool:
        """Drop idle blocks, smallest slots first, until ``excess`` bytes are freed; False (none dropped) if it can't.

        A segment frees its memory only with its last slot: its slots are
        dropped together, and only when every one held is idle.
        """
        blocks: dict[object, list[Slot]] = {}
        for capacity in self._capacities:
            for slot in self._idle[capacity]:
                blocks.setdefault(slot if slot.segment is None else slot.segment, []).append(slot)
        droppable = [
            (idle, idle[0].capacity if idle[0].segment is None else idle[0].segment.nbytes)
            for idle in blocks.values()
            if idle[0].segment is None or len(idle) == idle[0].segment.held
        ]
        if sum(nbytes for _, nbytes in droppable) < excess:
            return False
        for idle, nbytes in sorted(droppable, key=lambda block: block[0][0].capacity):
            if excess <= 0:
                break
            for slot in idle:
                self._idle[slot.capacity].remove(slot)
                self._remove(slot)
                self.counts["evictions"] += 1
            excess -= nbytes
        return True

    def _oldest_in_flight(self, nbytes: int) -> tuple[Slot, StreamKey | None]:
        """The least recently released slot in flight that fits (else of all), leased; and its stream's key."""
        in_flight = [(slot, key) for key, queue in self._in_flight.items() for slot in queue]
        in_flight += [(slot, None) for slot in self._guarded]
        if not in_flight:
            raise RuntimeError(
                f"cannot stage {nbytes} bytes: all {len(self.slots)} slots ({self._pinned_bytes} bytes) are "
                f"staged and not yet submitted, and max_pinned_bytes={self.max_pinned_bytes} leaves no room; "
                "submit or release staged slots first, or raise max_pinned_bytes"
            )
        fitting = [entry for entry in in_flight if entry[0].capacity >= nbytes]
        victim, key = min(fitting or in_flight, key=lambda entry: entry[0].released)
        (self._guarded if key is None else self._in_flight[key]).remove(victim)
        victim.leased = True  # ours while we wait outside the lock
        return victim, key

    def _make_idle(self, slot: Slot) -> None:
        slot.pending = None
        self._idle[slot.capacity].append(slot)

    def _add(self, slot: Slot) -> None:
        """Count ``slot`` in the slots held (not yet idle)."""
        if slot.capacity not in self._held:
            self._held[slot.capacity] = 0
            self._idle[slot.capacity] = []
            bisect.insort(self._capacities, slot.capacity)
        self.slots.append(slot)
        self._held[slot.capacity] += 1
        self._pinned_bytes += self._block_bytes(slot, 1)

    def _remove(self, slot: Slot) -> None:
        """Drop ``slot`` from the slots held."""
        self.slots.remove(slot)
        self._held[slot.capacity] -= 1
        self._pinned_bytes -= self._block_bytes(slot, -1)

    @staticmethod
    def _block_bytes(slot: Slot, change: int) -> int:
        """The bytes of pinned memory that counting ``slot`` in (``change=1``) or out (``-1``) adds or frees."""
        segment = slot.segment
        if segment is None:
            return slot.capacity
        segment.held += change
        first_in_or_last_out = segment.held == (1 if change > 0 else 0)
        return segment.nbytes if first_in_or_last_out else 0
