"""PinnedRing's bookkeeping on the CPU, with stand-in events (fakes.FakeEvent).

Slots handed out and reused, waits only at the bound, growth (large slots,
segments of small ones) and what is dropped to make room, counts, packed
arrays, a staged slot's life cycle, several producer threads.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from audiomask.transfer import VIEW_ALIGN_BYTES, KiB, MiB, PinnedRing
from audiomask.transfer.ring import SMALL_SLOT_BYTES
from tests.transfer.fakes import FakeEvent, small_ring, stage_pointer


def test_ring_starts_with_its_slots() -> None:
    stats = PinnedRing(slot_bytes=2 * KiB, num_slots=3, max_pinned_bytes=64 * KiB).stats()
    assert (stats.slots, stats.pinned_bytes, stats.leased, stats.copies, stats.grows) == (3, 6 * KiB, 0, 0, 0)
    assert stats.pinned == torch.cuda.is_available()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slot_bytes": 0}, "slot_bytes must be >= 1, got 0"),
        ({"slot_bytes": 1.5}, "slot_bytes must be an integer, got 1.5"),
        ({"num_slots": 0}, "num_slots must be >= 1, got 0"),
        ({"num_slots": True}, "num_slots must be an integer, got True"),
        ({"consumer_copy_bytes": -1}, "consumer_copy_bytes must be >= 0, got -1"),
        (
            {"slot_bytes": KiB, "num_slots": 4, "max_pinned_bytes": 3 * KiB},
            "max_pinned_bytes must be >= .* = 4096, got 3072",
        ),
    ],
)
def test_ring_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PinnedRing(**kwargs)


def test_ring_views_alias_the_slot_and_copies_do_not() -> None:
    ring = small_ring()
    with ring.stage((2, 3), np.int32) as staged:
        staged.array[:] = np.arange(6).reshape(2, 3)
        assert staged.array.flags.c_contiguous and staged.array.flags.writeable
        assert staged.array.ctypes.data == staged.tensor.data_ptr()
        assert staged.tensor.tolist() == [[0, 1, 2], [3, 4, 5]]  # written through numpy, seen by torch
        result = staged.to("cpu")
    assert result.data_ptr() != staged_pointer_of(ring)
    assert result.dtype == torch.int32 and result.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_ring_checks_every_stage_whose_layout_it_remembers() -> None:
    ring = small_ring()
    for _ in range(2):  # the second round stages the same (shape, dtype) again: from the remembered layout
        with ring.stage((2, 3), np.int16) as staged:
            assert staged.array.shape == (2, 3) and staged.array.dtype == np.int16
            staged.array.shape = (3, 2)  # reshaping the view handed out leaves the ring's own view as it was
            staged.array[:] = 7
            assert staged.to("cpu").tolist() == [[7, 7, 7], [7, 7, 7]]
    with ring.stage(1, np.uint8) as staged:
        staged.release()
    for shape in (True, (True, 3), (np.True_,)):  # equal and hash-equal to 1, (1, 3), (1,): still refused
        with pytest.raises(ValueError, match="must be an integer, got (np.)?True"):
            ring.stage(shape, np.uint8)
    with ring.stage([2, 3], np.int16) as staged:  # an unhashable shape: checked, not remembered
        assert staged.array.shape == (2, 3)


def staged_pointer_of(ring: PinnedRing) -> int:
    with ring.stage(1, np.uint8) as staged:
        return staged.tensor.data_ptr()


def test_ring_reuses_a_released_slot_and_never_hands_out_a_leased_one() -> None:
    ring = small_ring(num_slots=2)
    first = ring.stage(8, np.uint8)
    second = ring.stage(8, np.uint8)
    assert first.array.ctypes.data != second.array.ctypes.data
    pointer = first.array.ctypes.data
    first.release()
    with ring.stage(8, np.uint8) as third:
        assert third.array.ctypes.data == pointer
    second.release()
    assert ring.stats().leased == 0


def test_ring_waits_for_the_oldest_copy_only_at_the_bound() -> None:
    ring = small_ring(num_slots=2)
    events = [FakeEvent(), FakeEvent()]
    pointers = [stage_pointer(ring, event) for event in events]
    assert stage_pointer(ring) == pointers[0]  # both in flight, no room to grow: wait for the older one
    assert events[0].waited == 1 and events[1].waited == 0
    stats = ring.stats()
    assert (stats.slot_waits, stats.grows, stats.slots) == (1, 0, 2)


def test_ring_reuses_a_slot_without_waiting_once_its_copy_completed() -> None:
    ring = small_ring(num_slots=1)
    event = FakeEvent()
    pointer = stage_pointer(ring, event)
    event.done = True
    assert stage_pointer(ring) == pointer
    assert event.waited == 0 and ring.stats().slot_waits == 0


def test_ring_grows_rather_than_waits_below_the_bound() -> None:
    ring = small_ring(num_slots=2, max_slots=3)
    events = [FakeEvent(), FakeEvent()]
    pointers = [stage_pointer(ring, event) for event in events]
    grown = stage_pointer(ring, FakeEvent())
    assert grown not in pointers
    stats = ring.stats()
    assert (stats.grows, stats.slots, stats.slot_waits, stats.pinned_bytes) == (1, 3, 0, 3 * KiB)
    stage_pointer(ring)  # now at the bound: waits
    assert ring.stats().slot_waits == 1


def test_ring_grows_a_larger_slot_once_and_keeps_it() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=2, max_pinned_bytes=16 * KiB)
    with ring.stage(3 * KiB, np.uint8) as staged:  # rounds up to a 4 KiB slot
        big = staged.array.ctypes.data
    with ring.stage(3 * KiB + 1, np.uint8) as staged:
        assert staged.array.ctypes.data == big
    with ring.stage(10, np.uint8) as staged:  # small requests keep to small slots
        assert staged.array.ctypes.data != big
    stats = ring.stats()
    assert (stats.grows, stats.slots, stats.pinned_bytes, stats.evictions) == (1, 3, 6 * KiB, 0)


def test_ring_grows_small_slots_for_copies_that_ride_the_consumer() -> None:
    ring = PinnedRing(slot_bytes=MiB, num_slots=1, max_pinned_bytes=4 * MiB, consumer_copy_bytes=256 * KiB)
    sizes = []
    for nbytes in (16, 16, 200 * KiB, 300 * KiB):  # each in flight while the next is staged: the ring grows
        sizes.append(ring.stage(nbytes, np.uint8)._slot.capacity)  # type: ignore[union-attr]
    assert sizes == [MiB, SMALL_SLOT_BYTES, 256 * KiB, MiB]  # the first takes the idle slot; then per request


def test_a_small_copy_frees_a_slot_of_its_size_before_it_takes_a_large_idle_one() -> None:
    ring = PinnedRing(slot_bytes=MiB, num_slots=1, max_pinned_bytes=4 * MiB, consumer_copy_bytes=256 * KiB)
    large = ring.stage(16, np.uint8)  # the only slot: taken, since none of its size exists yet
    small = ring.stage(16, np.uint8)  # grows one of its size
    small_pointer = small.array.ctypes.data
    event = FakeEvent()
    small.release(event)  # its copy in flight
    large.release()  # idle
    event.done = True
    with ring.stage(16, np.uint8) as again:  # asks about its own size's copy rather than take the 1 MiB slot
        assert again.array.ctypes.data == small_pointer
    assert ring.stats().grows == 1


def test_small_slots_grow_in_segments_that_double_within_the_bound() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=1, max_pinned_bytes=40 * KiB, consumer_copy_bytes=KiB)
    held = [ring.stage(16, np.uint8) for _ in range(40)]  # all leased at once: none can be reused
    stats = ring.stats()
    # The first slot, then blocks of 1, 2, 4, 8, 16 slots (32 held) and, in the 8 KiB left, one of 8.
    assert (stats.slots, stats.grows, stats.pinned_bytes) == (40, 6, 40 * KiB)
    for i, staged in enumerate(held):
        staged.array[:] = i
    assert [int(staged.array[0]) for staged in held] == list(range(40))  # no two slots share memory
    for staged in held:
        staged.release()


def test_a_segment_is_dropped_whole_and_only_once_every_slot_of_it_is_idle() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=1, max_pinned_bytes=8 * KiB, consumer_copy_bytes=KiB)
    held = [ring.stage(16, np.uint8) for _ in range(4)]  # the first slot, then blocks of 1 and of 2 slots
    assert (ring.stats().grows, ring.stats().pinned_bytes) == (2, 4 * KiB)
    leased = held[3]  # in the 2-slot segment
    for staged in held[:3]:
        staged.release()
    with pytest.raises(RuntimeError, match="cannot stage 8192 bytes"):  # its segment frees nothing yet
        ring.stage(8 * KiB, np.uint8)
    assert (ring.stats().slots, ring.stats().evictions) == (4, 0)
    leased.release()
    with ring.stage(8 * KiB, np.uint8):
        pass
    stats = ring.stats()
    assert (stats.slots, stats.pinned_bytes, stats.evictions) == (1, 8 * KiB, 4)


def test_ring_drops_idle_small_slots_to_make_room() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=4, max_pinned_bytes=4 * KiB)
    with ring.stage(4 * KiB, np.uint8) as staged:
        staged.array[:] = 7
        assert staged.to("cpu").sum().item() == 7 * 4 * KiB
    stats = ring.stats()
    assert (stats.slots, stats.pinned_bytes, stats.evictions, stats.grows) == (1, 4 * KiB, 4, 1)


def test_ring_waits_for_an_in_flight_small_slot_to_make_room() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=2, max_pinned_bytes=2 * KiB)
    events = [FakeEvent(), FakeEvent()]
    for event in events:
        stage_pointer(ring, event)
    with ring.stage(2 * KiB, np.uint8):
        pass
    assert [event.waited for event in events] == [1, 1]
    stats = ring.stats()
    assert (stats.slots, stats.slot_waits, stats.evictions) == (1, 2, 2)


def test_ring_refuses_a_request_over_the_bound() -> None:
    ring = small_ring(num_slots=2)
    with pytest.raises(ValueError, match=r"a request of 2049 bytes exceeds max_pinned_bytes=2048"):
        ring.stage(2 * KiB + 1, np.uint8)
    assert ring.stats().leased == 0


def test_ring_says_so_when_every_slot_is_staged() -> None:
    ring = small_ring(num_slots=1)
    with ring.stage(8, np.uint8), pytest.raises(RuntimeError, match="all 1 slots .* are staged and not yet submitted"):
        ring.stage(8, np.uint8)


def test_ring_counts_copies_and_bytes() -> None:
    ring = small_ring()
    for n in (10, 20, 30):
        with ring.stage(n, np.uint8) as staged:
            staged.to("cpu")
    with ring.stage(5, np.uint8):  # released unused: not a copy
        pass
    stats = ring.stats()
    assert (stats.copies, stats.bytes_copied, stats.leased) == (3, 60, 0)


def test_ring_packs_arrays_at_aligned_offsets() -> None:
    ring = PinnedRing(slot_bytes=4 * KiB, num_slots=1, max_pinned_bytes=4 * KiB)
    specs = [((3,), np.bool_), ((2, 5), np.float32), ((), np.int64), ((0, 4), np.float16), ((7,), np.uint8)]
    with ring.stage_many(specs) as staged:
        base = staged.tensors[0].data_ptr()
        assert base % 64 == 0  # CPU allocations are 64-byte aligned, pinned ones page aligned
        for array, tensor, (shape, dtype) in zip(staged.arrays, staged.tensors, specs, strict=True):
            assert array.shape == shape and array.dtype == dtype
            assert (array.ctypes.data - base) % VIEW_ALIGN_BYTES == 0
            if array.size:  # torch reports address 0 for empty tensors
                assert tensor.data_ptr() == array.ctypes.data
        for i, array in enumerate(staged.arrays):
            array[...] = i + 1
        results = staged.to_many("cpu")
    assert [tuple(r.shape) for r in results] == [shape for shape, _ in specs]
    assert [r.dtype for r in results] == [torch.bool, torch.float32, torch.int64, torch.float16, torch.uint8]
    assert [r.float().mean().item() for r in results if r.numel()] == [1.0, 2.0, 3.0, 5.0]
    assert ring.stats().bytes_copied == 3 * VIEW_ALIGN_BYTES + 7  # the empty array takes no room


def test_staged_guards_its_life_cycle() -> None:
    ring = small_ring()
    staged = ring.stage_many([(2, np.uint8), (2, np.uint8)])
    with pytest.raises(ValueError, match="this slot holds 2 arrays; use .arrays"):
        staged.to("cpu")
    staged.to_many("cpu")
    for use in (lambda: staged.arrays, lambda: staged.to_many("cpu"), staged.release):
        with pytest.raises(RuntimeError, match="already submitted or released"):
            use()
    with (
        pytest.raises(ValueError, match="dtype torch.bfloat16 has no numpy equivalent"),
        ring.stage(2, torch.bfloat16) as bf16,
    ):
        bf16.array  # noqa: B018
    with pytest.raises(ValueError, match=r"shape of array 0\[1\] must be >= 0, got -1"):
        ring.stage((2, -1), np.uint8)
    with pytest.raises(ValueError, match="specs must name at least one"):
        ring.stage_many([])
    assert ring.stats().leased == 0


def test_staged_copies_into_out_and_checks_it() -> None:
    ring = small_ring()
    with ring.stage(3, np.int64) as staged:
        staged.array[:] = [4, 5, 6]
        with pytest.raises(ValueError, match="out has dtype torch.int32, expected torch.int64"):
            staged.to("cpu", out=torch.zeros(3, dtype=torch.int32))
        out = torch.zeros(3, dtype=torch.int64)
        assert staged.to("cpu", out=out) is out
    assert out.tolist() == [4, 5, 6]


def test_ring_is_safe_for_several_producer_threads() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=2, max_pinned_bytes=8 * KiB)
    errors: list[str] = []
    rounds = 200

    def produce(tag: int) -> None:
        for i in range(rounds):
            with ring.stage(64, np.uint8) as staged:
                staged.array[:] = tag
                threading.Event().wait(0.0001 * (i % 3))  # let the other threads interleave
                if not (staged.array == tag).all():
                    errors.append(f"thread {tag} saw its slot overwritten")
                if not (staged.to("cpu") == tag).all():
                    errors.append(f"thread {tag} copied another thread's data")

    threads = [threading.Thread(target=produce, args=(tag,)) for tag in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = ring.stats()
    assert stats.copies == 4 * rounds and stats.leased == 0 and stats.pinned_bytes <= 8 * KiB
