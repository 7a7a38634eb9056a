"""Which of a pinned ring's slots are free, asking the driver as little as possible.

Every slot is in exactly one place: leased (staged, in no list), idle (its last
copy known complete; kept by capacity, the most recently released last), in
flight in the queue of the stream its copy's event was recorded on (in record
order: events on one stream complete in order), or guarded by a caller's event.
An acquire takes the smallest idle slot that fits, the most recently released of
those (cache-hot). Only when none fits does it ask, per stream, about the newest
copy (complete: the whole queue is free at once), else about the oldest ones
until one is still running. A submit that finds its stream idle frees that
stream's queue without asking (:meth:`SlotPool.stream_idle`), and a wait for a
slot frees every slot queued before it. When nothing fits the pool grows
(through the ring's ``new_slots``, which pins them), within ``max_pinned_bytes``,
and only at that bound waits for the oldest copy in flight.

Slots for copies that ride the consumer are grown in segments: one pinned block
carved into as many slots as the pool holds of that size already (so their
number doubles), up to ``SEGMENT_BYTES`` a block. Such copies hold their slot
until the consumer's queue reaches them, so a busy queue needs hundreds, and
pinning costs ~1.7 ms a call whatever the size (16 KiB copies behind a 40 ms
queue on the H200 grew 337 slots one by one, each a 1.7 ms stall:
bench/probes/to_device_phases_h200.json); in segments, ~log2 as many stalls.

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

__all__ = ["SEGMENT_BYTES", "SMALL_SLOT_BYTES", "Completion", "Segment", "Slot", "SlotPool"]

SMALL_SLOT_BYTES = 64 * 1024  # the smallest slot the pool grows for a copy that rides the consumer
SEGMENT_BYTES = 4 * 1024 * 1024  # the largest block pinned at once for such slots: 64 slots of 64 KiB


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
    # The slot's own CUDA event and its device: recorded after every copy from the slot. It is
    # re-recorded only by the next submit, which holds the slot only once the event has completed.
    event: Any = None
    event_device: torch.device | None = None
    # A pinned word a gated copy from the slot waits for (slots of >= GATED_COPY_BYTES): the tensor
    # owning it, its numpy view, and the value the last gated copy waited for.
    gate_word: torch.Tensor | None = None
    gate: np.ndarray | None = None
    gate_value: int = 0
    # Torch and numpy views of the slot that the ring copies through (never handed out, so never changed).
    views: dict[Any, tuple[torch.Tensor, np.ndarray | None]] = field(default_factory=dict)
    segment: Segment | None = None  # the block it was carved from with others (None: a block of its own)


class SlotPool:
    """The slots of one ring and their state; every public method takes :attr:`lock`.

    Args:
        new_slots: makes (pins) ``count`` slots of a given capacity in bytes, one block: ``new_slots(capacity, count)``.
        slots: the slots to start with, all idle.
        slot_bytes: the capacity a slot is grown with at least (copies of up
            to ``consumer_copy_bytes``: ``min(slot_bytes, SMALL_SLOT_BYTES)``).
        max_pinned_bytes: bound on the capacity of all slots held.
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
        self.slots = slots
        self.released = 0  # release sequence number of the last slot released
        self.counts = dict.fromkeys(("copies", "bytes_copied", "slot_waits", "grows", "evictions"), 0)
        self._idle: dict[int, list[Slot]] = {}  # by capacity
        self._capacities: list[int] = []  # the capacities the pool has held, ascending
        self._held: dict[int, int] = {}  # slots held now, by capacity
        self._pinned_bytes = 0  # of the blocks held now (a segment's until its last slot is dropped)
        # Slots held now of a size grown for copies that ride the consumer (none: no preference to apply).
        self._small_held = 0
        self._small_capacity = self._grow_size(consumer_copy_bytes) if consumer_copy_bytes else 0
        self._in_flight: dict[tuple[int, int, int], deque[Slot]] = {}  # by stream ids
        self._guarded: list[Slot] = []
        for slot in slots:
            self._count(slot, 1)
            self._make_idle(slot)

    def stream_idle(self, stream: tuple[int, int, int], released: int) -> None:
        """Every copy on ``stream`` (ids) from a slot released up to number ``released`` has completed."""
        with self.lock:
            queue = self._in_flight.get(stream)
            while queue and queue[0].released <= released:
                self._make_idle(queue.popleft())

    def _make_idle(self, slot: Slot) -> None:
        slot.pending = None
        self._idle[slot.capacity].append(slot)

    def _count(self, slot: Slot, change: int) -> None:
        """Count ``slot`` in (``change=1``) or out (``-1``) of the slots held."""
        if slot.capacity not in self._held:
            self._held[slot.capacity] = 0
            self._idle[slot.capacity] = []
            bisect.insort(self._capacities, slot.capacity)
        self._held[slot.capacity] += change
        if slot.capacity <= self._small_capacity:
            self._small_held += change
        segment = slot.segment
        if segment is None:
            self._pinned_bytes += change * slot.capacity
        else:
            segment.held += change
            if segment.held == (1 if change > 0 else 0):  # its first slot counted in, or its last out
                self._pinned_bytes += change * segment.nbytes

    def _held_bytes(self) -> int:
        return self._pinned_bytes

    def _holds(self, smallest: int, largest: int) -> bool:
        """Whether the pool holds a slot of ``smallest`` to ``largest`` bytes, idle or not."""
        capacities = self._capacities
        start, end = bisect.bisect_left(capacities, smallest), bisect.bisect_right(capacities, largest)
        return any(self._held[capacities[i]] for i in range(start, end))

    def snapshot(self) -> dict[str, object]:
        """The counters, and the slots held now: how many, their bytes, how many leased, whether all are pinned."""
        with self.lock:
            return {
                "pinned": bool(self.slots) and all(slot.pinned for slot in self.slots),
                "slots": len(self.slots),
                "pinned_bytes": self._held_bytes(),
                "leased": sum(slot.leased for slot in self.slots),
                **self.counts,
            }

    def acquire(self, nbytes: int) -> Slot:
        """A slot of at least ``nbytes`` bytes whose last copy has completed, leased to the caller.

        Grows a slot, or at ``max_pinned_bytes`` waits for the oldest copy in
        flight that frees one; raises :class:`ValueError` for a request over the
        bound and :class:`RuntimeError` when every slot is leased and none can grow.
        """
        if nbytes > self.max_pinned_bytes:
            raise ValueError(f"a request of {nbytes} bytes exceeds max_pinned_bytes={self.max_pinned_bytes}")
        # A copy that rides the consumer holds its slot until the queue reaches it: where slots of its
        # own size exist, it takes a larger one (which a large copy may need) only when none of those is free.
        small = nbytes <= self.consumer_copy_bytes
        while True:
            with self.lock:
                largest = self._grow_size(nbytes) if small and self._small_held else None
                slot = self._take_idle(nbytes, largest)
                if slot is None and largest is not None and not self._holds(nbytes, largest):
                    largest = None  # none of its size exists: any idle slot will do, without asking the driver
                    slot = self._take_idle(nbytes)
                if slot is None:
                    self._reclaim(nbytes)
                    slot = self._take_idle(nbytes, largest)
                    if slot is None and largest is not None:
                        slot = self._take_idle(nbytes)
                slot = slot or self._grow(nbytes)
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

    def _take_idle(self, nbytes: int, largest: int | None = None) -> Slot | None:
        """The smallest idle slot that fits (of <= ``largest`` bytes), leased; of those, the most recently released.

        The most recently released slot's memory is the likeliest to be in the
        CPU's caches still, where a pool walked round oldest-first makes every
        staging memcpy cold (bench/probes/ring_paths_h200.json: to_device of
        256 KiB 0.04 ms from 4 slots, 0.10 ms from 256). Idle slots are kept
        by capacity: copies riding a busy consumer leave hundreds of small
        slots, which a scan would visit on every acquire. Call with the lock held.
        """
        capacities = self._capacities
        end = len(capacities) if largest is None else bisect.bisect_right(capacities, largest)
        for i in range(bisect.bisect_left(capacities, nbytes), end):
            bucket = self._idle[capacities[i]]
            if bucket:
                slot = bucket.pop()
                slot.leased = True
                return slot
        return None  # none idle fits

    def _reclaim(self, nbytes: int) -> bool:
        """Move slots whose last copy has completed to the idle list; whether one fits ``nbytes`` now.

        Asks the driver as little as it can. On each stream it asks about the
        newest copy first: complete, every older copy there is too (one query
        frees them all); else about the oldest: running, so is the rest; complete
        and large enough, it is freed alone; else every completed copy is freed
        (:meth:`_free_completed`). ``False``: it has freed every slot it can.
        Copies riding a busy consumer hold many slots at once: one question
        each would cost ~1.5 us per slot. Call with the lock held.
        """
        for queue in self._in_flight.values():
            if not queue:
                continue
            if queue[-1].pending.query():  # type: ignore[union-attr]
                fits = False
                while queue:
                    slot = queue.popleft()
                    self._make_idle(slot)
                    fits = fits or slot.capacity >= nbytes
                if fits:
                    return True
                continue
            if len(queue) < 2 or not queue[0].pending.query():  # type: ignore[union-attr]
                continue  # the oldest is running: so is every later copy on this stream
            if queue[0].capacity >= nbytes:  # the common case: one copy completed since the last acquire
                self._make_idle(queue.popleft())
                return True
            if self._free_completed(queue, nbytes):
                return True
        for slot in list(self._guarded):
            if slot.pending.query():  # type: ignore[union-attr]
                self._guarded.remove(slot)
                self._make_idle(slot)
                if slot.capacity >= nbytes:
                    return True
        return False

    def _free_completed(self, queue: deque[Slot], nbytes: int) -> bool:
        """Free the completed copies at the front of ``queue`` (its oldest completed, its newest running).

        Completion is monotone in record order, so the first running copy is
        found by doubling the step, then bisecting: O(log k) questions for k
        completed copies, where asking each would cost ~1.5 us apiece (a large
        request behind hundreds of small completed copies). Whether a freed slot fits ``nbytes``.
        """
        done, running = 0, len(queue) - 1  # indices known complete and known running
        step = 1
        while done + step < running:
            if not queue[done + step].pending.query():  # type: ignore[union-attr]
                running = done + step
                break
            done += step
            step *= 2
        while running - done > 1:
            middle = (done + running) // 2
            if queue[middle].pending.query():  # type: ignore[union-attr]
                done = middle
            else:
                running = middle
        fits = False
        for _ in range(running):
            slot = queue.popleft()
            self._make_idle(slot)
            fits = fits or slot.capacity >= nbytes
        return fits

    def _grow_size(self, nbytes: int) -> int:
        """The capacity of the slot the ring grows for ``nbytes``.

        A copy on the consumer's stream holds its slot until the queue reaches
        it: many may be in flight, so they grow slots of their own size, not of ``slot_bytes``.
        """
        smallest = min(self.slot_bytes, SMALL_SLOT_BYTES) if nbytes <= self.consumer_copy_bytes else self.slot_bytes
        return min(max(smallest, _next_power_of_two(nbytes)), self.max_pinned_bytes)

    def _segment_slots(self, capacity: int) -> int:
        """How many slots of ``capacity`` bytes the next growth pins at once (see the module docstring)."""
        if capacity > self._small_capacity:
            return 1
        return max(1, min(self._held.get(capacity, 0), SEGMENT_BYTES // capacity))

    def _grow(self, nbytes: int) -> Slot | None:
        """Pin new slots for ``nbytes`` (a segment of them where it grows small ones): the first, leased; else None.

        Within ``max_pinned_bytes``: fewer slots where a segment would not
        fit, and for a single slot the idle blocks dropped that make room
        (acquire's reclaim has found every slot that has completed); None
        where even those are not enough.
        """
        size = self._grow_size(nbytes)
        count = min(self._segment_slots(size), max(1, (self.max_pinned_bytes - self._held_bytes()) // size))
        excess = self._held_bytes() + size * count - self.max_pinned_bytes
        if excess > 0 and not self._evict(excess):
            return None
        slots = self._new_slots(size, count)
        for slot in slots:
            self.slots.append(slot)
            self._count(slot, 1)
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
        blocks: list[list[Slot]] = []
        by_segment: dict[int, list[Slot]] = {}
        for capacity in self._capacities:
            for slot in self._idle[capacity]:
                if slot.segment is None:
                    blocks.append([slot])
                else:
                    by_segment.setdefault(id(slot.segment), []).append(slot)
        blocks += [idle for idle in by_segment.values() if len(idle) == idle[0].segment.held]  # type: ignore[union-attr]
        blocks.sort(key=lambda block: block[0].capacity)
        sizes = [block[0].capacity if block[0].segment is None else block[0].segment.nbytes for block in blocks]
        if sum(sizes) < excess:
            return False
        for block, freed in zip(blocks, sizes):
            if excess <= 0:
                break
            for slot in block:
                self.slots.remove(slot)
                self._count(slot, -1)
                self._idle[slot.capacity].remove(slot)
                self.counts["evictions"] += 1
            excess -= freed
        return True

    def _oldest_in_flight(self, nbytes: int) -> tuple[Slot, tuple[int, int, int] | None]:
        """The least recently released slot in flight that fits (else any), leased; and its stream's ids."""
        candidates = [(queue[0], stream) for stream, queue in self._in_flight.items() if queue]
        candidates += [(slot, None) for slot in self._guarded]
        fitting = [queue_slot for stream, queue in self._in_flight.items() for queue_slot in queue]
        fitting = [s for s in fitting + self._guarded if s.capacity >= nbytes]
        if not candidates:
            raise RuntimeError(
                f"cannot stage {nbytes} bytes: all {len(self.slots)} slots ({self._held_bytes()} bytes) are "
                f"staged and not yet submitted, and max_pinned_bytes={self.max_pinned_bytes} leaves no room; "
                "submit or release staged slots first, or raise max_pinned_bytes"
            )
        victim = min(fitting, key=lambda s: s.released) if fitting else min(candidates, key=lambda c: c[0].released)[0]
        stream = next((ids for ids, queue in self._in_flight.items() if victim in queue), None)
        if stream is None:
            self._guarded.remove(victim)
        else:
            self._in_flight[stream].remove(victim)
        victim.leased = True  # ours while we wait outside the lock
        return victim, stream

    def release(
        self,
        slot: Slot,
        pending: Completion | None,
        copied: int | None,
        stream: tuple[int, int, int] | None = None,
        record_on: Any = None,
    ) -> None:
        """Hand ``slot`` back, guarded by ``pending``; ``stream``: the ids of the stream a submit records it on.

        ``record_on``: the stream to record ``pending`` on first. The record is
        made under the lock, as the slot joins its stream's queue, so that the
        queue's order is the order of the records (two threads may copy on one
        stream): the ring infers from the newest record's completion that the
        whole queue has completed.
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
                queue = self._in_flight.get(stream)
                if queue is None:
                    queue = self._in_flight[stream] = deque()
                queue.append(slot)
            if copied is not None:
                self.counts["copies"] += 1
                self.counts["bytes_copied"] += copied


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
