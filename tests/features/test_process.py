"""audiomask.features.slots and .process: a driver's front-end stage, on this thread and sharded over processes.

The processes must compute exactly what one :class:`SlotFeatures` computes
here, cycle after cycle (per-slot framer state, joins, final flushes),
whatever the number of processes sharing the slots, and must turn their
failures and their deaths into errors in the caller.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from audiomask.features import Phi4MMFrontend, WhisperFrontend
from audiomask.features.frontend import MEL_BLOCK_ROWS
from audiomask.features.process import MAX_IN_FLIGHT, FeatureProcess, default_threads, default_workers
from audiomask.features.slots import SlotCycle, SlotFeatures, SlotSamples

BATCH = 4
FEW_FRAMES = 12  # a product of at most this many frames (MKL on AMD Zen 4: 1-3 rows take another kernel)
CHUNK_FRAMES = 16
HOP, WIN = 160, 400
BLOCK = CHUNK_FRAMES * HOP  # samples per slot per cycle after the first
FIRST_BLOCK = BLOCK + WIN - HOP  # a stream's first block: its first chunk of frames (no centring)
# A ring holds the blocks of the cycles in flight and the next one; an odd size makes blocks wrap around.
CAPACITY = (MAX_IN_FLIGHT + 1) * FIRST_BLOCK + 7


def cycles(seed: int, count: int, first_block: int = FIRST_BLOCK, batch: int = BATCH):
    """``count`` cycles of (slots, blocks, final, joins): streams joining, ending and rejoining slots."""
    rng = np.random.default_rng(seed)
    started = np.zeros(batch, bool)
    for index in range(count):
        slots = np.sort(rng.choice(batch, size=int(rng.integers(1, batch + 1)), replace=False))
        joins = np.array([s for s in slots if not started[s] or rng.random() < 0.1], np.int64)
        started[joins] = True
        final = rng.random(len(slots)) < 0.2
        # A last block leaves room for the frames that a centred framing's end adds (Whisper: up to 2).
        sizes = [
            int(rng.integers(1, BLOCK + 1 - 2 * HOP))
            if last
            else first_block
            if s in joins
            else int(rng.integers(1, BLOCK + 1))
            for s, last in zip(slots, final)
        ]
        blocks = [rng.standard_normal(size).astype(np.float32) for size in sizes]
        started[slots[final]] = False  # an ended stream's slot takes a new stream next
        yield index, slots, blocks, final, joins


class Rings:
    """Writes each cycle's blocks into the slots' rings, one after the other as a driver does, and names them."""

    def __init__(self, memory: np.ndarray) -> None:
        self.samples = SlotSamples(memory)
        self.written = np.zeros(len(memory), np.int64)

    def cycle(self, slots, blocks, final, joins) -> SlotCycle:
        batch = len(self.written)
        described = SlotCycle(
            *(np.zeros(batch, bool) for _ in range(3)), *(np.zeros(batch, np.int64) for _ in range(2))
        )
        described.active[slots], described.final[slots], described.join[joins] = True, final, True
        for slot, block in zip(slots, blocks):
            self.samples.write(slot, self.written[slot], block)
            described.start[slot], described.length[slot] = self.written[slot], len(block)
            self.written[slot] += len(block)
        return described


def test_a_ring_reads_back_what_was_written_across_its_end():
    rings = Rings(np.zeros((2, 10), np.float32))
    pieces = [np.arange(start, start + size, dtype=np.float32) for start, size in ((0, 4), (4, 5), (9, 3), (12, 10))]
    for piece in pieces:
        position = int(rings.written[1])
        rings.cycle(np.array([1]), [piece], np.array([False]), np.array([], np.int64))
        read = rings.samples.read(1, position, len(piece))
        np.testing.assert_array_equal(read, piece)
        read[:] = -1  # a copy: the ring is untouched
        np.testing.assert_array_equal(rings.samples.read(1, position, len(piece)), piece)
    assert not rings.samples.memory[0].any()


def test_a_ring_takes_strided_and_other_dtype_samples_and_leaves_the_other_rings_alone():
    rings = SlotSamples(np.zeros((3, 6), np.float32))
    every_other = np.arange(10, dtype=np.float32)[::2]  # 0, 2, 4, 6, 8: not contiguous
    rings.write(1, 4, every_other)  # positions 4-8: ring indices 4, 5, 0, 1, 2
    np.testing.assert_array_equal(rings.memory[1], [4, 6, 8, 0, 0, 2])
    rings.write(1, 9, np.array([0.5, 1.5], np.float64))  # indices 3, 4
    np.testing.assert_array_equal(rings.read(1, 7, 4), [6, 8, 0.5, 1.5])
    assert not rings.memory[0].any() and not rings.memory[2].any()


def test_slot_features_frame_each_slot_as_its_own_stream():
    frontend = Phi4MMFrontend()
    stage = SlotFeatures(frontend, BATCH, CHUNK_FRAMES)
    rng = np.random.default_rng(0)
    signal_ = rng.standard_normal(FIRST_BLOCK + 2 * BLOCK).astype(np.float32)
    pieces = [signal_[:FIRST_BLOCK], signal_[FIRST_BLOCK : FIRST_BLOCK + BLOCK], signal_[FIRST_BLOCK + BLOCK :]]
    rows = []
    for i, piece in enumerate(pieces):
        features, counts = stage.compute(np.array([2]), [piece], np.array([False]), np.array([2] if i == 0 else []))
        assert counts.tolist() == [0, 0, CHUNK_FRAMES, 0] and not features[[0, 1, 3]].any()
        rows.append(features[2].copy())
    np.testing.assert_allclose(np.concatenate(rows), frontend(signal_), atol=1e-5)  # the offline features


def test_slot_features_carry_each_slot_state_for_a_centred_front_end_in_its_layout():
    """Whisper's centred frames and running floor per slot, in the (B, n_mels, T) layout: each slot's frames
    over the cycles of its stream (blocks as a driver cuts them, the last one final) equal the running-floor
    features of its whole signal, whichever cycle it starts at and whatever the other slots hold."""
    frontend = WhisperFrontend.qwen3_asr()
    chunk_frames = 100
    stage = SlotFeatures(frontend, 2, chunk_frames)
    assert stage.shape == (2, 128, chunk_frames)
    first = HOP * (chunk_frames - 1) + WIN - WIN // 2  # the first chunk's frames need the left reflection only
    rng = np.random.default_rng(2)
    # Loud, then 100 dB quieter: later cycles' frames sit on the floor that the loud ones set (carried from
    # cycle to cycle); and a short signal (zero-extended to 0.5 s) starting a cycle later.
    signals = [
        np.concatenate([rng.standard_normal(10000), 1e-5 * rng.standard_normal(35000)]),
        rng.standard_normal(3000),
    ]
    signals = [signal_.astype(np.float32) for signal_ in signals]
    starts = [0, 1]
    fed, rows = [0, 0], [[], []]
    for cycle in range(5):
        slots, blocks, final, joins = [], [], [], []
        for slot, signal_ in enumerate(signals):
            if cycle < starts[slot] or (fed[slot] >= len(signal_) and cycle > starts[slot]):
                continue
            size = first if cycle == starts[slot] else chunk_frames * HOP
            slots.append(slot)
            blocks.append(signal_[fed[slot] : fed[slot] + size])
            fed[slot] += size
            final.append(fed[slot] >= len(signal_))
            if cycle == starts[slot]:
                joins.append(slot)
        features, counts = stage.compute(np.array(slots), blocks, np.array(final), np.array(joins, np.int64))
        assert features.shape == (2, 128, chunk_frames)
        for slot in slots:
            rows[slot].append(features[slot, :, : counts[slot]].copy())
    for slot, signal_ in enumerate(signals):
        offline = WhisperFrontend.qwen3_asr(floor="running")(signal_)[:, : frontend.num_frames(len(signal_))]
        np.testing.assert_allclose(np.concatenate(rows[slot], axis=1), offline, atol=1e-5)


@pytest.mark.parametrize("frontend", [Phi4MMFrontend(), WhisperFrontend()], ids=["phi4mm", "whisper"])
def test_a_slot_left_out_of_cycles_goes_on_where_it_stopped_bit_for_bit(frontend):
    """A driver's cycle may leave out an occupied slot whose next block has not arrived (``active`` False):
    its framer and front-end state (Whisper's running floor) stay as they were, so its frames, and those of
    the slot beside it, are exactly what they are when no cycle leaves it out."""
    first_block = FIRST_BLOCK - frontend.framing.pad
    rng = np.random.default_rng(4)
    blocks = [  # (slot 0's, slot 1's) blocks, cycle by cycle; the last ones final and shorter
        [rng.standard_normal(size).astype(np.float32) for size in (first_block, *[BLOCK] * 4, BLOCK // 3)]
        for _ in range(2)
    ]
    count = len(blocks[0])
    skipped = {2, 3, 4}  # cycles without slot 1 (its blocks come later, in order)
    frames = []
    for leave_out in (set(), skipped):
        stage = SlotFeatures(frontend, 2, CHUNK_FRAMES)
        rings = Rings(np.zeros((2, CAPACITY), np.float32))
        taken, rows = [0, 0], [[], []]
        for cycle in range(count + len(leave_out)):
            slots = [slot for slot in (0, 1) if taken[slot] < count and not (slot == 1 and cycle in leave_out)]
            described = rings.cycle(
                np.array(slots),
                [blocks[slot][taken[slot]] for slot in slots],
                np.array([taken[slot] == count - 1 for slot in slots]),
                np.array([slot for slot in slots if taken[slot] == 0], np.int64),
            )
            features, counts = stage.compute_cycle(rings.samples, described)
            assert not counts[[slot for slot in (0, 1) if slot not in slots]].any()
            for slot in slots:
                rows[slot].append(np.take(features[slot], range(counts[slot]), axis=frontend.time_axis))
                taken[slot] += 1
        frames.append([np.concatenate(slot_rows, axis=frontend.time_axis) for slot_rows in rows])
    for without, with_skips in zip(*frames):
        np.testing.assert_array_equal(with_skips, without)


@pytest.mark.parametrize("frontend", [Phi4MMFrontend(), WhisperFrontend()], ids=["phi4mm", "whisper"])
def test_any_split_of_the_slots_computes_the_same_features_bit_for_bit(frontend):
    """What sharding rests on: slices of the slots, each with a stage of its own, give the whole stage's
    features exactly, also where a slice's frames (or the whole's) end in a product of a few frames."""
    batch = 7
    first_block = FIRST_BLOCK - frontend.framing.pad
    splits = ([0, 7], [0, 3, 7], [0, 1, 2, 3, 4, 5, 6, 7], [0, 5, 7], [0, 2, 6, 7])
    stages = [
        [SlotFeatures(frontend, hi - lo, CHUNK_FRAMES) for lo, hi in zip(bounds, bounds[1:])] for bounds in splits
    ]
    few_frame_slices = 0
    for _, slots, blocks, final, joins in cycles(3, 120, first_block, batch):
        results = []
        for bounds, shards in zip(splits, stages):
            features = np.zeros(shards[0].shape[1:], np.float32)[None].repeat(batch, axis=0)
            counts = np.zeros(batch, np.int64)
            for (lo, hi), shard in zip(zip(bounds, bounds[1:]), shards):
                mine = (slots >= lo) & (slots < hi)
                mine_blocks = [block for block, keep in zip(blocks, mine) if keep]
                joining = joins[(joins >= lo) & (joins < hi)] - lo
                _, counts[lo:hi] = shard.compute(slots[mine] - lo, mine_blocks, final[mine], joining, features[lo:hi])
                few_frame_slices += 0 < counts[lo:hi].sum() % MEL_BLOCK_ROWS <= FEW_FRAMES
            results.append((features, counts))
        for features, counts in results[1:]:
            np.testing.assert_array_equal(counts, results[0][1])
            np.testing.assert_array_equal(features, results[0][0])
    assert few_frame_slices > 0  # the case a BLAS's small-product kernel would round differently was met


def test_a_ring_reads_many_blocks_at_once_as_it_reads_each():
    """Blocks that lie whole in their ring and blocks that wrap around its end, into rows of any stride."""
    rng = np.random.default_rng(5)
    rings = SlotSamples(rng.standard_normal((5, 37)).astype(np.float32))
    slots = np.array([4, 0, 2, 3, 1, 0])
    for length in (1, 20, 37):
        positions = rng.integers(0, 200, len(slots))
        positions[0] = 37 - length  # the last block that lies whole
        rows = torch.full((len(slots), length + 3), np.nan)
        rings.read_into(slots, positions, rows[:, 2 : 2 + length])  # rows of stride length + 3
        for row, (slot, position) in enumerate(zip(slots.tolist(), positions.tolist())):
            np.testing.assert_array_equal(rows[row, 2 : 2 + length].numpy(), rings.read(slot, position, length))
        assert rows[:, :2].isnan().all() and rows[:, 2 + length :].isnan().all()  # nothing written beside them
    with pytest.raises(ValueError, match=r"memory must be a \(B, capacity\) float32 array with contiguous rows"):
        SlotSamples(np.zeros((2, 8), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="out's rows hold 38 samples, more than a ring's capacity=37"):
        rings.read_into(slots, np.zeros(len(slots), np.int64), torch.empty(len(slots), 38))


def driver_like_cycles(seed: int, count: int, first_block: int, batch: int):
    """Cycles as a driver plans them: mostly whole blocks; streams join (first block), sit cycles out, end
    (a short last block) and, now and then, take a block of another length (after which their blocks no
    longer end on a whole hop). Yields ``(slots, blocks, final, joins, whole)``, ``whole[i]``: slot
    ``slots[i]`` pushes a whole block after whole ones."""
    rng = np.random.default_rng(seed)
    left = np.full(batch, -1)  # samples left of the slot's stream (-1: no stream)
    aligned = np.zeros(batch, bool)  # every block of the stream so far was a whole one
    for _ in range(count):
        slots, blocks, final, joins, whole = [], [], [], [], []
        for slot in range(batch):
            if left[slot] < 0:
                if rng.random() < 0.25:
                    continue  # a free slot
                left[slot], aligned[slot] = int(rng.integers(0, 6 * BLOCK)), True
                joins.append(slot)
                size = first_block
            elif rng.random() < 0.15:
                continue  # its next block has not arrived
            elif rng.random() < 0.05:
                size, aligned[slot] = int(rng.integers(1, BLOCK)), False
            else:
                size = BLOCK
            # A last block leaves room for the frames that a centred framing's end adds (Whisper: up to 2).
            last = left[slot] <= size
            size = min(size, left[slot], BLOCK - 2 * HOP) if last else size
            slots.append(slot)
            blocks.append(rng.standard_normal(size).astype(np.float32))
            final.append(last)
            whole.append(aligned[slot] and size == BLOCK and slot not in joins and not last)
            left[slot] = -1 if last else left[slot] - size
        yield np.array(slots, np.int64), blocks, np.array(final, bool), np.array(joins, np.int64), np.array(whole)


@pytest.mark.parametrize("frontend", [Phi4MMFrontend(), WhisperFrontend(floor="running")], ids=["phi4mm", "whisper"])
def test_cycles_mixing_whole_blocks_with_joins_ends_skips_and_odd_blocks_equal_each_slot_alone(frontend):
    """The slots in the middle of their stream take the batched path, the others their own; a cycle mixing
    them computes each slot's frames exactly as a stage holding that slot alone does, leaves every other
    value of the batch it writes into zero, and each stream's frames over its cycles are the front end's
    features of its whole signal."""
    batch = 6
    first_block = FIRST_BLOCK - frontend.framing.pad
    stage = SlotFeatures(frontend, batch, CHUNK_FRAMES)
    alone = [SlotFeatures(frontend, 1, CHUNK_FRAMES) for _ in range(batch)]
    rings = Rings(np.zeros((batch, CAPACITY), np.float32))
    out = np.full(stage.shape, np.nan, np.float32)  # what an earlier cycle left there
    signals, frames = [[] for _ in range(batch)], [[] for _ in range(batch)]
    whole_blocks = full_cycles = 0
    for slots, blocks, final, joins, whole in driver_like_cycles(7, 60, first_block, batch):
        features, counts = stage.compute_cycle(rings.samples, rings.cycle(slots, blocks, final, joins), out)
        assert features is out
        whole_blocks += whole.sum()
        full_cycles += len(slots) == batch and counts.max() == CHUNK_FRAMES
        for slot in range(batch):
            mine = slots == slot
            if not mine.any():
                assert counts[slot] == 0 and not features[slot].any()
                continue
            block = blocks[int(np.flatnonzero(mine)[0])]
            expected, expected_counts = alone[slot].compute(
                np.array([0]), [block], final[mine], np.array([0] if slot in joins else [], np.int64)
            )
            assert counts[slot] == expected_counts[0]
            np.testing.assert_array_equal(features[slot], expected[0])
            if slot in joins:
                signals[slot], frames[slot] = [], []
            signals[slot].append(block)
            frames[slot].append(np.take(features[slot], range(counts[slot]), axis=frontend.time_axis))
            if final[mine][0]:
                whole_signal = np.concatenate(signals[slot])
                offline = np.take(
                    frontend(whole_signal), range(frontend.num_frames(len(whole_signal))), axis=frontend.time_axis
                )
                np.testing.assert_allclose(np.concatenate(frames[slot], axis=frontend.time_axis), offline, atol=1e-5)
    assert whole_blocks > 100 and full_cycles > 0  # the batched path, and the batch written in place, were taken


@pytest.mark.parametrize(
    ("frontend", "workers", "lanes"),
    [(Phi4MMFrontend(), 1, 1), (WhisperFrontend(), 3, 1), (WhisperFrontend(), 2, 2)],
    ids=["phi4mm-1", "whisper-3", "whisper-2-lanes-2"],
)
def test_the_processes_compute_what_the_stage_computes_here(frontend, workers, lanes):
    """Per-slot framers and front-end state (Whisper's running floor), in either layout, in one process,
    sharded over three (which do not divide the 4 slots), or two owning a piece of each of two lanes."""
    here = SlotFeatures(frontend, BATCH, CHUNK_FRAMES)
    first_block = FIRST_BLOCK - frontend.framing.pad  # a centred framing's first frame reads the reflection
    # As many torch threads there as here: the same reductions, so the same float32 rounding.
    with FeatureProcess(
        frontend, BATCH, CHUNK_FRAMES, CAPACITY, threads=torch.get_num_threads(), workers=workers, lanes=lanes
    ) as process:
        assert (
            process.ranges
            == {
                1: [[(0, 4)]],
                3: [[(0, 1)], [(1, 2)], [(2, 4)]],
                2: [[(0, 1), (2, 3)], [(1, 2), (3, 4)]],
            }[workers]
        )
        rings = Rings(process.samples)
        expected = []
        for index, slots, blocks, final, joins in cycles(1, 12, first_block):
            process.submit(rings.cycle(slots, blocks, final, joins))  # queued behind the one computing
            features, counts = here.compute(slots, blocks, final, joins)
            expected.append((features.copy(), counts))
            if index % 3 == 0:
                continue  # two in flight now and then: the processes compute them in order
            while expected:
                result = process.result()
                wanted_features, wanted_counts = expected.pop(0)
                assert result.counts.tolist() == wanted_counts.tolist()
                assert result.seconds > 0 and result.cpu_s >= 0
                # With lanes, a process's range without an advancing slot keeps its rows (nobody steps them).
                rows = slice(None) if lanes == 1 else wanted_counts > 0
                np.testing.assert_array_equal(result.features[rows], wanted_features[rows])


def test_the_processes_report_bad_input_and_their_own_failures():
    with FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, CAPACITY, threads=1, workers=2) as process:
        rings = Rings(process.samples)
        too_long = rings.cycle(np.array([0]), [np.zeros(FIRST_BLOCK, np.float32)], np.array([False]), np.array([0]))
        too_long.length[0] = CAPACITY + 1
        with pytest.raises(ValueError, match=f"more than capacity={CAPACITY}"):
            process.submit(too_long)
        with pytest.raises(ValueError, match=r"must describe 4 slots \(batch_size\), got 3"):
            process.submit(
                SlotCycle(
                    *(row[:3] for row in (too_long.active, too_long.final, too_long.join)),
                    too_long.start[:3],
                    too_long.length[:3],
                )
            )
        with pytest.raises(RuntimeError, match="no cycle is in flight"):
            process.result()
        first, later = np.zeros(FIRST_BLOCK, np.float32), np.zeros(BLOCK, np.float32)
        # Slot 3 (the second process's slot 1) has no stream; the first process's slot 0 is fine.
        process.submit(rings.cycle(np.array([0, 3]), [first, later], np.array([False, False]), np.array([0])))
        with pytest.raises(RuntimeError, match=r"the feature process failed: ValueError: .*without a stream.*: \[1\]"):
            process.result()
        # Both serve the next ones, in order.
        process.submit(rings.cycle(np.array([0]), [later], np.array([False]), np.array([], np.int64)))
        process.submit(rings.cycle(np.array([0, 2]), [later, first], np.array([False, False]), np.array([2])))
        with pytest.raises(RuntimeError, match=f"{MAX_IN_FLIGHT} cycles are in flight"):
            process.submit(rings.cycle(np.array([0]), [later], np.array([False]), np.array([], np.int64)))
        assert process.result().counts.tolist() == [CHUNK_FRAMES, 0, 0, 0]  # in submission order
        assert process.result().counts.tolist() == [CHUNK_FRAMES, 0, CHUNK_FRAMES, 0]


def test_a_dead_process_is_an_error_and_features_handed_out_outlive_close():
    process = FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, CAPACITY, threads=1, workers=2)
    rings = Rings(process.samples)
    block = np.random.default_rng(2).standard_normal(FIRST_BLOCK).astype(np.float32)
    process.submit(rings.cycle(np.array([1, 2]), [block, block], np.array([False, False]), np.array([1, 2])))
    features = process.result().features  # a view of the memory shared with the processes
    expected = features.copy()
    assert expected[1].any() and expected[2].any()  # each process wrote its slice
    os.kill(process._processes[1].pid, signal.SIGKILL)
    process._processes[1].join(timeout=10)
    later = np.zeros(BLOCK, np.float32)
    with pytest.raises(RuntimeError, match=r"the feature process 2 of 2 died \(exit code -9\)"):
        process.submit(rings.cycle(np.array([1]), [later], np.array([False]), np.array([], np.int64)))
        process.result()
    process.close()
    process.close()  # idempotent
    assert not any(child.is_alive() for child in process._processes)
    np.testing.assert_array_equal(features, expected)  # still mapped: the view holds the memory


class Reader:
    """A copy in flight from a result's features: when asked to finish, it checks they are still that result's."""

    def __init__(self, view: np.ndarray) -> None:
        self.view, self.expected, self.finished = view, view.copy(), 0

    def synchronize(self) -> None:
        np.testing.assert_array_equal(self.view, self.expected)  # not written again before the reader is done
        self.finished += 1


def test_a_result_being_read_is_written_again_only_after_its_reader_is_done():
    frontend = Phi4MMFrontend()
    with FeatureProcess(frontend, BATCH, CHUNK_FRAMES, CAPACITY, threads=1, workers=2) as process:
        with pytest.raises(RuntimeError, match="no result was taken"):
            process.read_until(Reader(np.zeros(1)))
        rings = Rings(process.samples)
        readers = []
        for _, slots, blocks, final, joins in cycles(5, 9):
            process.submit(rings.cycle(slots, blocks, final, joins))
            result = process.result()
            assert np.shares_memory(result.features, process.feature_memory.numpy())
            readers.append(Reader(result.features))
            process.read_until(readers[-1])
        # Three buffers taken in turn: each result's reader is asked to finish by the submission that
        # writes its buffer again, three cycles on, and only then; the last three are still being read.
        assert [reader.finished for reader in readers] == [1] * 6 + [0] * 3


def test_a_script_without_a_main_guard_gets_an_error_that_says_so(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from audiomask.features import Phi4MMFrontend\n"
        "from audiomask.features.process import FeatureProcess\n"
        f"FeatureProcess(Phi4MMFrontend(), {BATCH}, {CHUNK_FRAMES}, {CAPACITY}, threads=1, workers=1).close()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert "the feature process died (exit code 1) while starting" in done.stderr
    assert "if __name__ == '__main__':" in done.stderr


def shared_memory_files() -> set[str]:
    """/dev/shm's files but multiprocessing's semaphores ("sem.mp-..."): FeatureProcess makes none (it talks
    over pipes), while tests on other workers make and remove them (queues, barriers) at any moment."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.mp-")}


def test_forgotten_processes_are_stopped_when_collected_and_leave_no_shared_memory_files():
    before = shared_memory_files()
    process = FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, CAPACITY, threads=1, workers=2)
    rings = Rings(process.samples)
    process.submit(rings.cycle(np.array([0]), [np.zeros(FIRST_BLOCK, np.float32)], np.array([False]), np.array([0])))
    features = process.result().features
    children = process._processes
    del process, rings
    gc.collect()
    for child in children:
        child.join(timeout=10)
        assert not child.is_alive() and child.exitcode == 0  # asked to stop, not killed
    assert features.shape == (BATCH, CHUNK_FRAMES, 80) and np.isfinite(features).all()  # still readable
    assert shared_memory_files() <= before


def test_worker_counts_follow_the_cores_and_are_checked():
    assert (
        default_workers(256, cores=16) == 4 and default_workers(2, cores=64) == 2 and default_workers(8, cores=3) == 1
    )
    assert default_threads(4, cores=16) == min(4, torch.get_num_threads()) and default_threads(8, cores=2) == 1
    with pytest.raises(
        ValueError,
        match=r"at most the slots of a lane \(4 = the narrowest lane's\): each owns slots of every lane, got 5",
    ):
        FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, CAPACITY, workers=5)
    with pytest.raises(ValueError, match=r"workers must be at most the slots of a lane \(1 = .*got 2"):
        FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, CAPACITY, workers=2, lanes=[3, 1])
    with pytest.raises(ValueError, match=r"lanes must sum to batch_size \(4\), got \[2, 1\]"):
        FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, CAPACITY, lanes=[2, 1])
    with pytest.raises(ValueError, match="lanes must be <= 4, got 5"):
        FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, CAPACITY, lanes=5)
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, CAPACITY, workers=0)
