"""audiomask.asr.planner: the blocks a driver's plans name in the slots' rings are each stream's samples, in order.

Streams fed in odd pieces (some far more than a ring holds), joining and
leaving slots, in full cycles (every occupied slot has its next block) and in
cycles over the ready slots alone; streams without audio hold back nobody.
"""

from __future__ import annotations

import numpy as np
import pytest

from audiomask.asr.planner import CyclePlanner, DriverStream, ring_capacity
from audiomask.constants import SAMPLE_RATE
from audiomask.features.slots import SlotSamples

FIRST, BLOCK = 7, 5  # samples of a stream's first block and of the later ones


def planner_of(batch_size: int, clock=lambda: 0.0) -> CyclePlanner:
    rings = SlotSamples(np.zeros((batch_size, ring_capacity(FIRST, BLOCK)), np.float32))
    return CyclePlanner(batch_size, FIRST, BLOCK, rings, clock)


@pytest.mark.parametrize("max_wait_s", [None, 0.0], ids=["full-cycles", "ready-only"])
def test_planned_blocks_are_each_stream_samples_in_order_whatever_the_feeding(max_wait_s):
    rng = np.random.default_rng(0)
    planner = planner_of(3)
    signals = [
        np.arange(1, n + 1, dtype=np.float32) + 1000 * index for index, n in enumerate((400, 3, 1200, 180, 0, 610))
    ]
    streams = [DriverStream(f"s{index}") for index in range(len(signals))]
    sent = [0] * len(signals)
    received = [[] for _ in signals]
    joined, finished = [None] * len(signals), [None] * len(signals)
    partial_cycles = 0
    for stream in streams:
        planner.open(stream)
    for index in range(2000):
        for number, (stream, samples) in enumerate(zip(streams, signals)):
            if stream.ended:
                continue
            piece = int(rng.choice([0, 1, 4, 9, 60], p=[0.55, 0.15, 0.15, 0.1, 0.05]))  # 60: more than a ring holds
            planner.feed(stream, samples[sent[number] : sent[number] + piece])
            sent[number] += piece
            if sent[number] >= len(samples):
                planner.end(stream)
        ready = {stream for stream in planner.occupants() if planner.has_block(stream)}
        occupants = set(planner.occupants())
        cycle = planner.plan(index, max_wait_s)
        if max_wait_s == 0.0:  # a ready-only cycle runs exactly the occupants has_block calls ready
            ran = set() if cycle is None else {cycle.streams[slot] for slot in cycle.slots.tolist()}
            assert ran & occupants == ready
        if cycle is None:
            continue
        assert cycle.slots.tolist() == np.flatnonzero(cycle.blocks.active).tolist()
        assert cycle.skipped == sum(stream is not None for stream in cycle.streams) - len(cycle.slots)
        assert cycle.skipped == 0 or max_wait_s is not None
        partial_cycles += cycle.skipped > 0
        for slot in cycle.slots.tolist():
            number = streams.index(cycle.streams[slot])
            block = planner.samples.read(slot, cycle.blocks.start[slot], cycle.blocks.length[slot])
            if cycle.blocks.join[slot]:
                joined[number] = index
            assert len(block) == (FIRST if not received[number] else BLOCK) or cycle.blocks.final[slot]
            received[number].append(block)
            if cycle.blocks.final[slot]:
                finished[number] = index
        assert cycle.audio_samples == int(cycle.blocks.length.sum())
        planner.release(cycle)
        if all(finished_at is not None for finished_at in finished):
            break
    for number, samples in enumerate(signals):
        np.testing.assert_array_equal(np.concatenate(received[number]), samples)
        assert streams[number]._fed == len(samples)
    assert max(joined) > min(finished)  # three slots for six streams: slots were freed and taken again
    assert (partial_cycles > 0) == (max_wait_s is not None)


def test_a_full_cycle_waits_for_every_occupied_slot_and_a_ready_only_one_leaves_the_others_where_they_were():
    planner = planner_of(2)
    first, second = DriverStream("first"), DriverStream("second")
    for stream in (first, second):
        planner.open(stream)
        planner.feed(stream, np.arange(FIRST, dtype=np.float32))
    cycle = planner.plan(0)
    assert cycle.slots.tolist() == [0, 1] and cycle.joins.tolist() == [0, 1] and cycle.skipped == 0
    planner.release(cycle)
    planner.feed(first, np.full(2 * BLOCK, 7, np.float32))
    assert planner.plan(1) is None  # the second's next block is missing: a full cycle waits for it
    cycle = planner.plan(1, max_wait_s=0.0)
    assert cycle.slots.tolist() == [0] and cycle.skipped == 1 and cycle.joins.size == 0
    assert not cycle.blocks.active[1] and cycle.blocks.length[1] == 0
    planner.release(cycle)
    assert second._fed == FIRST  # left where it stopped
    planner.feed(second, np.full(BLOCK, 9, np.float32))
    cycle = planner.plan(2)  # both ready again: a full cycle
    assert cycle.slots.tolist() == [0, 1] and cycle.skipped == 0
    np.testing.assert_array_equal(planner.samples.read(1, cycle.blocks.start[1], BLOCK), np.full(BLOCK, 9))
    assert (first._fed, second._fed) == (FIRST + 2 * BLOCK, FIRST + BLOCK)


def test_a_waiting_stream_without_audio_holds_back_nobody():
    planner = planner_of(2)
    idle, busy, late = DriverStream("idle"), DriverStream("busy"), DriverStream("late")
    for stream in (idle, busy, late):
        planner.open(stream)
    planner.feed(late, np.ones(FIRST - 1, np.float32))  # not a first block yet
    planner.feed(busy, np.ones(FIRST, np.float32))
    cycle = planner.plan(0)
    assert cycle.streams[0] is busy and cycle.slots.tolist() == [0]
    assert list(planner.waiting) == [idle, late]
    planner.release(cycle)
    planner.end(late)  # its end arrives: it takes the free slot, before the idle one opened earlier
    cycle = planner.plan(1, max_wait_s=0.0)
    assert cycle.streams[1] is late and cycle.blocks.final[1] and cycle.blocks.length[1] == FIRST - 1
    assert list(planner.waiting) == [idle] and planner.occupants() == [busy]


def test_a_ready_block_waits_for_the_others_at_most_max_wait_s_and_an_ended_stream_not_at_all(fake_clock):
    clock = fake_clock
    planner = planner_of(2, clock)
    talking, silent = DriverStream("talking"), DriverStream("silent")
    for stream in (talking, silent):
        planner.open(stream)
        planner.feed(stream, np.ones(FIRST, np.float32))
    planner.release(planner.plan(0))
    planner.feed(talking, np.ones(3 * BLOCK, np.float32))
    assert planner.plan(1, max_wait_s=0.5) is None and planner.waited_s() == 0.0  # noted ready now
    clock.now += 0.4
    assert planner.plan(1, max_wait_s=0.5) is None and planner.waited_s() == pytest.approx(0.4)
    clock.now += 0.1
    for index in (1, 2, 3):  # every block that was there when it became due runs: it kept waiting
        cycle = planner.plan(index, max_wait_s=0.5)
        assert cycle.slots.tolist() == [0], index
        planner.release(cycle)
    assert planner.plan(4, max_wait_s=0.5) is None and planner.waited_s() is None  # nothing ready
    planner.feed(talking, np.ones(BLOCK, np.float32))
    planner.end(talking)
    cycle = planner.plan(4, max_wait_s=0.5)  # ended: no wait for the silent one
    assert cycle.slots.tolist() == [0] and cycle.blocks.final[0]
    assert planner.occupants() == [silent]


def test_a_dropped_stream_waiting_for_a_slot_leaves_at_once():
    planner = planner_of(1)
    holder, dropped, ended = DriverStream("holder"), DriverStream("dropped"), DriverStream("ended")
    for stream in (holder, dropped, ended):
        planner.open(stream)
        planner.feed(stream, np.ones(FIRST, np.float32))
    planner.release(planner.plan(0))
    planner.drop(dropped)
    assert dropped.ended and dropped.done and dropped._queued == 0 and list(planner.waiting) == [ended]
    planner.drop(holder)  # in a slot: ended, its samples still run, then it leaves
    cycle = planner.plan(1, max_wait_s=None)
    assert cycle.streams[0] is holder and cycle.blocks.final[0] and not holder.done


def test_with_lanes_a_stream_joins_the_lane_of_its_phase_or_the_nearest_with_room(fake_clock):
    period_s = BLOCK / SAMPLE_RATE  # a live stream's blocks come once a period
    rings = SlotSamples(np.zeros((6, ring_capacity(FIRST, BLOCK)), np.float32))
    lanes = [(0, 2), (2, 4), (4, 6)]  # phases [0, 1/3), [1/3, 2/3), [2/3, 1) of the period
    planner = CyclePlanner(6, FIRST, BLOCK, rings, fake_clock, lanes)
    arrivals = [("a", 0.5), ("b", 0.1), ("c", 0.55), ("d", 0.6), ("e", 0.9), ("f", 0.4)]
    slots = {}
    for name, phase in arrivals:
        fake_clock.now = 7 * period_s + phase * period_s  # whole periods later: the same phase
        stream = DriverStream(name)
        planner.open(stream)
        planner.feed(stream, np.ones(FIRST, np.float32))
        planner.plan(len(slots), max_wait_s=0.0, lane=lanes[0])  # any plan admits the streams that may join
        slots[name] = stream._slot
    lane_of = {name: next(i for i, (lo, hi) in enumerate(lanes) if lo <= slot < hi) for name, slot in slots.items()}
    # a and c take the middle lane; d finds it full and takes the nearest lane with room (the last, before
    # the first: both are one away, the later phase first); f, middle again, finds the first lane.
    assert lane_of == {"a": 1, "b": 0, "c": 1, "d": 2, "e": 2, "f": 0}
    assert sorted(slots.values()) == list(range(6))
