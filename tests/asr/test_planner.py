"""audiomask.asr.planner: the blocks a driver's plans name in the slots' rings are each stream's samples, in order.

Streams fed in odd pieces (some far more than a ring holds), joining and
leaving slots; a cycle runs only when every occupied slot has its next block.
"""

from __future__ import annotations

import numpy as np

from audiomask.asr.planner import CyclePlanner, DriverStream, ring_capacity
from audiomask.features.slots import SlotSamples

FIRST, BLOCK = 7, 5  # samples of a stream's first block and of the later ones


def planner_of(batch_size: int) -> CyclePlanner:
    rings = SlotSamples(np.zeros((batch_size, ring_capacity(FIRST, BLOCK)), np.float32))
    return CyclePlanner(batch_size, FIRST, BLOCK, rings)


def test_planned_blocks_are_each_stream_samples_in_order_whatever_the_feeding():
    rng = np.random.default_rng(0)
    planner = planner_of(3)
    signals = [np.arange(1, n + 1, dtype=np.float32) + 1000 * index for index, n in enumerate((40, 3, 120, 18, 0, 61))]
    streams = [DriverStream(f"s{index}") for index in range(len(signals))]
    sent = [0] * len(signals)
    received = [[] for _ in signals]
    joined, finished = [None] * len(signals), [None] * len(signals)
    for stream in streams:
        planner.open(stream)
    for index in range(200):
        for number, (stream, samples) in enumerate(zip(streams, signals)):
            if stream.ended:
                continue
            piece = int(rng.choice([0, 1, 4, 9, 60]))  # 60: more than a ring holds
            planner.feed(stream, samples[sent[number] : sent[number] + piece])
            sent[number] += piece
            if sent[number] >= len(samples):
                planner.end(stream)
        cycle = planner.plan(index)
        if cycle is None:
            continue
        assert cycle.slots.tolist() == np.flatnonzero(cycle.blocks.active).tolist()
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
    assert min(joined[3:]) > min(finished[:3])  # three slots: the later streams took the slots of finished ones


def test_a_slot_without_its_next_block_holds_the_cycle_and_admissions():
    planner = planner_of(2)
    first, second, third = (DriverStream(name) for name in "abc")
    for stream in (first, second, third):
        planner.open(stream)
    planner.feed(first, np.ones(FIRST, np.float32))
    cycle = planner.plan(0)
    assert cycle.slots.tolist() == [0] and cycle.joins.tolist() == [0]  # the second has no first block yet
    planner.release(cycle)
    planner.feed(second, np.ones(FIRST, np.float32))
    assert planner.plan(1) is None  # the first's next block is missing: nobody is admitted either
    assert second._slot is None and list(planner.waiting) == [second, third]
    planner.feed(first, np.ones(BLOCK - 1, np.float32))
    planner.end(first)
    cycle = planner.plan(1)
    assert cycle.slots.tolist() == [0, 1] and cycle.joins.tolist() == [1]
    assert cycle.blocks.final.tolist() == [True, False] and cycle.blocks.length.tolist() == [BLOCK - 1, FIRST]
    assert first._slot == 0 and first._fed == FIRST + BLOCK - 1  # it keeps naming the slot it held
