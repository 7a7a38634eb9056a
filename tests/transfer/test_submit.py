"""The ring's CUDA submit, simulated: torch.cuda's streams and events are logging stand-ins (fakes.FakeCuda).

The ``meta`` device plays the GPU. What each copy runs on and waits for,
which events the ring asks about before reusing a slot, and that no slot is
handed out before its last copy has run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.transfer import VIEW_ALIGN_BYTES, KiB, PinnedRing, to_device
from audiomask.transfer import staging as staging_module
from audiomask.transfer.ring import DEFAULT_CONSUMER_COPY_BYTES, SMALL_SLOT_BYTES
from tests.transfer.fakes import META, FakeCuda, FakeCudaEvent, FakeStream, small_ring, stage_pointer


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda(monkeypatch)


def test_submit_copies_on_the_copy_stream_and_guards_everything(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=1)
    with ring.stage((2, 3), np.float32) as staged:
        result = staged._to(META, None, None)
    assert (result.device, tuple(result.shape), result.dtype) == (META, (2, 3), torch.float32)
    assert fake_cuda.log == [
        "current stream copy",
        "allocate on copy",  # the copy stream's pool: never a block the consumer's queued work still reads
        "copy on copy non_blocking",
        "current stream consumer",
        "event 0 recorded on copy",  # as the slot joins the copy stream's queue, under the ring's lock
        "consumer waits for event 0",
        "used on consumer",  # not reused before the consumer's work queued so far has run
    ]
    stage_pointer(ring)  # one slot, its copy in flight: the ring waits for exactly that copy's event
    assert fake_cuda.events[0].waited == 1 and ring.stats().slot_waits == 1


def test_a_slot_records_its_own_event_again_only_once_the_last_copy_completed(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=2)
    for _ in range(6):
        with ring.stage(3, np.int64) as staged:
            staged._to(META, None, None)
        for event in fake_cuda.events:
            event.done = True  # the copies complete
    assert [event.name for event in fake_cuda.events] == ["event 0", "event 1"]  # one event per slot, made once
    assert fake_cuda.log.count("event 0 recorded on copy") == fake_cuda.log.count("event 1 recorded on copy") == 3
    # FakeCudaEvent.record asserts that no event is recorded again before it completed


def queries(fake_cuda: FakeCuda) -> list[str]:
    """The event queries logged since the log was last cleared, then clear it."""
    asked = [line for line in fake_cuda.log if "queried" in line]
    fake_cuda.log.clear()
    return asked


def stage_and_release(ring: PinnedRing) -> None:
    with ring.stage(3, np.int64):
        pass


def submit_four(fake_cuda: FakeCuda, ring: PinnedRing) -> None:
    for _ in range(4):
        with ring.stage(3, np.int64) as staged:
            staged._to(META, None, None)
    fake_cuda.log.clear()


def test_acquire_asks_about_the_newest_copy_first_and_then_knows_the_older_ones_completed(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=4)
    submit_four(fake_cuda, ring)  # on the copy stream: the consumer is busy
    for event in fake_cuda.events:
        event.done = True
    stage_and_release(ring)
    assert queries(fake_cuda) == ["event 3 queried"]  # the newest copy on the slot's stream has completed ...
    for _ in range(3):
        stage_and_release(ring)  # ... so every older slot is free: no driver call at all
        assert queries(fake_cuda) == []
    assert ring.stats().slot_waits == 0


def test_acquire_asks_about_the_slots_own_copy_when_the_newest_is_still_running(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=4)
    submit_four(fake_cuda, ring)
    fake_cuda.events[0].done = fake_cuda.events[1].done = True  # the two oldest copies completed
    stage_and_release(ring)
    assert queries(fake_cuda) == ["event 3 queried", "event 0 queried"]  # in reuse order, stopping at the first idle
    stage_and_release(ring)  # that slot was released unused: known idle, the most recently released, and hot
    assert queries(fake_cuda) == []
    fake_cuda.events[1].done = True
    with ring.stage(3, np.int64):  # leased: the next acquire knows of no idle slot, and asks
        stage_and_release(ring)
    assert queries(fake_cuda) == ["event 3 queried", "event 1 queried"]


def test_an_idle_consumer_tells_the_ring_its_earlier_copies_completed(fake_cuda: FakeCuda) -> None:
    fake_cuda.consumer.idle = True  # the copies run on the consumer, and each submit finds it idle
    ring = small_ring(num_slots=2)
    for _ in range(5):
        with ring.stage(3, np.int64) as staged:
            staged._to(META, None, None)
    # No event ever reported completion: the submit's own query of the consumer said so.
    assert queries(fake_cuda) == [] and not any(event.done for event in fake_cuda.events)
    assert ring.stats().slot_waits == 0


def test_acquire_prefers_the_most_recently_released_slot_known_idle(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=4)
    submit_four(fake_cuda, ring)
    for event in fake_cuda.events:
        event.done = True
    stage_and_release(ring)  # asks once (the newest), then knows every slot idle
    pointers = [stage_pointer(ring) for _ in range(3)]  # each released unused: the same (hot) slot again
    assert len(set(pointers)) == 1 and queries(fake_cuda) == ["event 3 queried"]


def test_acquire_asks_about_two_copies_at_most_when_a_stream_is_still_running(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=8, max_slots=9, consumer_copy_bytes=KiB)  # copies ride the busy consumer
    submit_four(fake_cuda, ring)
    submit_four(fake_cuda, ring)
    stage_and_release(ring)  # all 8 in flight: the newest and the oldest are asked, the rest inferred; it grows
    assert queries(fake_cuda) == ["event 7 queried", "event 0 queried"] and ring.stats().grows == 1


def test_a_small_copy_takes_an_idle_large_slot_without_asking_where_none_of_its_size_exists(
    fake_cuda: FakeCuda,
) -> None:
    ring = small_ring(num_slots=2, slot_bytes=2 * SMALL_SLOT_BYTES, consumer_copy_bytes=KiB)
    for _ in range(2):  # the first copy holds one large slot; the second takes the other at once
        with ring.stage(16, np.uint8) as staged:
            staged._to(META, None, None)
    assert queries(fake_cuda) == [] and ring.stats().grows == 0


def test_a_large_request_frees_every_completed_small_copy_with_few_questions(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=1, max_slots=200, consumer_copy_bytes=KiB)
    for _ in range(100):  # small copies riding the busy consumer: each holds a slot of its own
        with ring.stage(16, np.uint8) as staged:
            staged._to(META, None, None)
    assert (ring.stats().slots, ring.stats().grows) == (128, 7)  # the first, then segments of 1, 2, 4, ... 64
    for event in fake_cuda.events[:60]:
        event.done = True  # the queue has reached the 60 oldest copies
    fake_cuda.log.clear()
    with ring.stage(2 * KiB, np.uint8):  # fits no small slot: frees the completed ones, then grows
        pass
    asked = queries(fake_cuda)
    assert len(asked) <= 2 + 2 * 7, asked  # the newest, the oldest, then doubling and bisecting: not 60
    assert asked[:2] == ["event 99 queried", "event 0 queried"]
    idle = {capacity: len(slots) for capacity, slots in ring._pool._idle.items() if slots}
    assert idle == {KiB: 28 + 60, 2 * KiB: 1}  # never used, the 60 completed, not one more; and the new one
    held = [ring.stage(16, np.uint8) for _ in range(88)]  # every completed slot is free now: no more questions
    assert queries(fake_cuda) == [] and ring.stats().grows == 8  # 7 blocks of small slots and the 2 KiB one
    for staged in held:
        staged.release()


def test_what_the_ring_knows_about_one_stream_frees_no_slot_of_another(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=2)
    with ring.stage(3, np.int64) as staged:
        staged._to(META, None, None)  # busy consumer: on the copy stream, event 0, number 1
    fake_cuda.consumer.idle = True
    with ring.stage(3, np.int64) as staged:
        staged._to(META, None, None)  # idle consumer: every event numbered <= 1 on the consumer completed
    fake_cuda.log.clear()
    stage_and_release(ring)  # event 0 (the copy stream) may still be running: ask, then wait for it
    assert queries(fake_cuda) == ["event 0 queried", "event 1 queried"]
    assert fake_cuda.events[0].waited == 1 and ring.stats().slot_waits == 1


@pytest.mark.parametrize("nbytes", [16, 2 * KiB])  # on the consumer (the small path) and on the copy stream
def test_a_copy_is_recorded_under_the_ring_lock_as_it_joins_its_streams_queue(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch, nbytes: int
) -> None:
    """Two threads copying on one stream must queue their slots in the order of their records.

    The ring infers from the newest record's completion that every slot in the
    stream's queue is free: a record made outside the lock could land in the
    queue before an older one and free a slot whose copy is still running.
    """
    ring = small_ring(num_slots=1, slot_bytes=4 * KiB, consumer_copy_bytes=KiB)
    held = []
    real_record = FakeCudaEvent.record

    def record(event: FakeCudaEvent, stream: FakeStream) -> None:
        held.append(ring._pool.lock.locked())
        real_record(event, stream)

    monkeypatch.setattr(FakeCudaEvent, "record", record)
    with ring.stage(nbytes, np.uint8) as staged:
        staged._to(META, None, None)
    assert held == [True]


class SimulatedGpu:
    """Runs the fake streams' recorded events in record order, as a GPU does, and never otherwise."""

    def __init__(self, fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queues: dict[str, list[FakeCudaEvent]] = {}
        self.stream_of: dict[int, str] = {}
        self.consumer = fake_cuda.consumer
        real_record, real_synchronize = FakeCudaEvent.record, FakeCudaEvent.synchronize
        gpu = self

        def record(event: FakeCudaEvent, stream: FakeStream) -> None:
            real_record(event, stream)
            gpu.queues.setdefault(stream.name, []).append(event)
            gpu.stream_of[id(event)] = stream.name
            if stream is gpu.consumer and gpu.consumer.idle:
                gpu.consumer.idle = False  # the copy just queued there has not run yet

        def synchronize(event: FakeCudaEvent) -> None:  # waiting for a record runs every record before it
            queue = gpu.queues[gpu.stream_of[id(event)]]
            gpu.advance(gpu.stream_of[id(event)], queue.index(event) + 1)
            real_synchronize(event)

        monkeypatch.setattr(FakeCudaEvent, "record", record)
        monkeypatch.setattr(FakeCudaEvent, "synchronize", synchronize)

    def advance(self, stream: str, count: int) -> None:
        queue = self.queues.get(stream, [])
        for event in queue[:count]:
            event.done = True
        del queue[:count]
        if stream == "consumer" and not queue:
            self.consumer.idle = True


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["small", "large", "unused"])),
            st.tuples(st.just("advance"), st.sampled_from(["consumer", "copy"]), st.integers(1, 6)),
        ),
        max_size=60,
    )
)
def test_no_slot_is_handed_out_before_its_last_copy_has_run(operations: list[tuple]) -> None:
    """Random interleavings of small copies (on the consumer), large ones (on the copy stream while the
    consumer is busy), unused stages and GPU progress: every slot staged must have no copy still queued."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        fake_cuda = FakeCuda(monkeypatch)
        gpu = SimulatedGpu(fake_cuda, monkeypatch)
        # Small copies grow SMALL_SLOT_BYTES slots, large ones slot_bytes slots: a large request
        # behind completed small copies frees them all (_free_completed).
        ring = small_ring(num_slots=2, slot_bytes=2 * SMALL_SLOT_BYTES, max_slots=6, consumer_copy_bytes=64)
        for operation in operations:
            if operation[0] == "advance":
                gpu.advance(operation[1], operation[2])
                continue
            nbytes = {"small": 16, "large": 2 * SMALL_SLOT_BYTES, "unused": 16}[operation[0]]
            with ring.stage(nbytes, np.uint8) as staged:
                slot = staged._slot
                assert slot is not None and (slot.event is None or slot.event.done), "a slot in flight was reused"
                if operation[0] != "unused":
                    staged._to(META, None, None)
        assert ring.stats().leased == 0 and ring.stats().pinned_bytes <= 6 * 2 * SMALL_SLOT_BYTES


def test_submit_on_another_device_puts_the_callers_device_back(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 7)  # the caller works on another device
    ring = small_ring(num_slots=1)
    with ring.stage(3, np.int64) as staged:
        staged._to(META, None, None)
    assert fake_cuda.log[fake_cuda.log.index("current stream consumer") + 1] == "set device 7"


def test_submit_on_an_idle_consumer_copies_there_without_cross_stream_sync(fake_cuda: FakeCuda) -> None:
    fake_cuda.consumer.idle = True  # nothing queued: the copy may start at once on the consumer itself
    ring = small_ring(num_slots=1)
    with ring.stage((2, 3), np.float32) as staged:
        staged._to(META, None, None)
    assert fake_cuda.log == [
        "allocate on consumer",  # stream-ordered with the consumer's own work: no record_stream needed
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]


def test_a_small_copy_rides_the_busy_consumer_and_a_large_one_the_copy_stream(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=2, slot_bytes=4 * KiB, consumer_copy_bytes=2 * KiB)
    assert not fake_cuda.consumer.query()  # work queued on it
    with ring.stage(2 * KiB, np.uint8) as staged:
        staged._to(META, None, None)
    assert fake_cuda.log == [  # no query of the consumer, no stream switch, no cross-stream wait
        "allocate on consumer",
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]
    fake_cuda.log.clear()
    with ring.stage(2 * KiB + 1, np.uint8) as staged:
        staged._to(META, None, None)
    assert fake_cuda.log[:3] == ["current stream copy", "allocate on copy", "copy on copy non_blocking"]
    assert PinnedRing().consumer_copy_bytes == DEFAULT_CONSUMER_COPY_BYTES == 64 * KiB


def test_to_device_copies_a_small_array_on_the_consumer_in_three_calls(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staging_module, "resolve_device", lambda device: META)  # the meta "GPU"
    ring = small_ring(num_slots=1, slot_bytes=2 * KiB, max_slots=3, consumer_copy_bytes=KiB)
    source = np.arange(6, dtype=np.int32).reshape(2, 3)[:, ::-1]  # strided, converted on the way
    result = to_device(source, "cuda", dtype=torch.int64, ring=ring)
    assert (result.device, tuple(result.shape), result.dtype) == (META, (2, 3), torch.int64)
    assert fake_cuda.log == [  # no query, no stream switch, no cross-stream wait
        "allocate on consumer",
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]
    staged_bytes = ring._pool.slots[0].array[: source.size * 8].view(np.int64).reshape(2, 3)
    assert staged_bytes.tolist() == source.tolist()
    stats = ring.stats()
    assert (stats.copies, stats.bytes_copied, stats.leased) == (1, 48, 0)
    fake_cuda.log.clear()
    to_device(source, "cuda", ring=ring)  # that copy is still queued: its slot is not reused
    assert fake_cuda.log[-1] == "event 1 recorded on consumer" and ring.stats().grows == 1
    with pytest.raises(ValueError, match="data has dtype <U1, which torch cannot hold"):
        to_device(np.array(["1"]), "cuda", dtype=torch.float32, ring=ring)  # refused as on the general path
    fake_cuda.log.clear()
    to_device(np.zeros(KiB // 4 + 1, dtype=np.float32), "cuda", ring=ring)  # over consumer_copy_bytes
    assert "copy on copy non_blocking" in fake_cuda.log  # the general path: the copy stream, the consumer busy


def test_submit_into_out_runs_on_the_busy_consumer_after_its_queued_work(fake_cuda: FakeCuda) -> None:
    ring = small_ring()
    out = torch.empty(3, device="meta")
    fake_cuda.log.clear()
    assert not fake_cuda.consumer.query()  # work queued on it
    with ring.stage(3, np.float32) as staged:
        assert staged._to(META, out, None) is out
    assert fake_cuda.log == [  # after the work that may still read out, with no cross-stream handoff
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]


def test_submit_into_out_on_a_given_stream_waits_for_the_consumer_first(fake_cuda: FakeCuda) -> None:
    ring = small_ring()
    out = torch.empty(3, device="meta")
    fake_cuda.log.clear()
    with ring.stage(3, np.float32) as staged:
        assert staged._to(META, out, ring.copy_stream(META)) is out
    assert fake_cuda.log == [
        "copy waits for consumer",  # work queued before may still read out
        "current stream copy",
        "copy on copy non_blocking",
        "current stream consumer",
        "event 0 recorded on copy",
        "consumer waits for event 0",
    ]


def test_submit_on_the_consumer_stream_needs_no_cross_stream_wait(fake_cuda: FakeCuda) -> None:
    ring = small_ring()
    with ring.stage(3, np.int64) as staged:
        staged._to(META, None, fake_cuda.consumer)
    assert fake_cuda.log == [  # no stream switch, no cross-stream wait, no record_stream
        "allocate on consumer",
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]


def test_packed_submit_is_one_copy_with_views(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=1, slot_bytes=4 * KiB)
    with ring.stage_many([((2, 2), np.bool_), ((3,), np.int64)]) as staged:
        mask, lengths = staged._submit(META, None, None)
    assert (tuple(mask.shape), mask.dtype, tuple(lengths.shape), lengths.dtype) == (
        (2, 2),
        torch.bool,
        (3,),
        torch.int64,
    )
    assert mask.untyped_storage().nbytes() == VIEW_ALIGN_BYTES + 24  # both in one allocation
    assert fake_cuda.log.count("copy on copy non_blocking") == 1
    assert fake_cuda.log[-2:] == ["consumer waits for event 0", "used on consumer"]


def test_the_copy_stream_is_made_once_per_device(fake_cuda: FakeCuda) -> None:
    ring = small_ring()
    assert ring.copy_stream(META) is ring.copy_stream(META)
