"""audiomask.features.slots and .process: a driver's front-end stage, on this thread and in a process of its own.

The process must compute exactly what :class:`SlotFeatures` computes here,
cycle after cycle (per-slot framer state, joins, final flushes), and must
turn its failures and its death into errors in the caller.
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
from audiomask.features.process import MAX_IN_FLIGHT, FeatureProcess
from audiomask.features.slots import SlotFeatures

BATCH = 4
CHUNK_FRAMES = 16
HOP, WIN = 160, 400
BLOCK = CHUNK_FRAMES * HOP  # samples per slot per cycle after the first
FIRST_BLOCK = BLOCK + WIN - HOP  # a stream's first block: its first chunk of frames (no centring)


def cycles(seed: int, count: int, first_block: int = FIRST_BLOCK):
    """``count`` cycles of (slots, blocks, final, joins): streams joining, ending and rejoining slots."""
    rng = np.random.default_rng(seed)
    started = np.zeros(BATCH, bool)
    for index in range(count):
        slots = np.sort(rng.choice(BATCH, size=int(rng.integers(1, BATCH + 1)), replace=False))
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
def test_the_process_computes_what_the_stage_computes_here(frontend):
    """Per-slot framers and front-end state (Whisper's running floor), in either layout."""
    here = SlotFeatures(frontend, BATCH, CHUNK_FRAMES)
    first_block = FIRST_BLOCK - frontend.framing.pad  # a centred framing's first frame reads the reflection
    # As many torch threads there as here: the same reductions, so the same float32 rounding.
    with FeatureProcess(frontend, BATCH, CHUNK_FRAMES, first_block, threads=torch.get_num_threads()) as process:
        expected = []
        for index, slots, blocks, final, joins in cycles(1, 12, first_block):
            process.submit(slots, blocks, final, joins)  # the next cycle queued behind the one computing
            features, counts = here.compute(slots, blocks, final, joins)
            expected.append((features.copy(), counts))
            if index % 3 == 0:
                continue  # two in flight now and then: the process computes them in order
            while expected:
                features, counts, cpu_s = process.result()
                wanted_features, wanted_counts = expected.pop(0)
                assert counts.tolist() == wanted_counts.tolist() and cpu_s > 0
                np.testing.assert_array_equal(features, wanted_features)


def test_the_process_reports_bad_input_and_its_own_failures():
    with FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, FIRST_BLOCK, threads=1) as process:
        too_long = np.zeros(FIRST_BLOCK + 1, np.float32)
        with pytest.raises(ValueError, match=f"more than block_samples={FIRST_BLOCK}"):
            process.submit(np.array([0]), [too_long], np.array([False]), np.array([0]))
        with pytest.raises(RuntimeError, match="no cycle is in flight"):
            process.result()
        never_joined = np.zeros(BLOCK, np.float32)  # slot 1 has no stream: its framer does not exist
        process.submit(np.array([1]), [never_joined], np.array([False]), np.array([], np.int64))
        with pytest.raises(RuntimeError, match="the feature process failed: AttributeError"):
            process.result()
        first, later = np.zeros(FIRST_BLOCK, np.float32), np.zeros(BLOCK, np.float32)  # it serves the next ones
        process.submit(np.array([0]), [first], np.array([False]), np.array([0]))
        process.submit(np.array([0, 2]), [later, first], np.array([False, False]), np.array([2]))  # queued behind
        with pytest.raises(RuntimeError, match=f"{MAX_IN_FLIGHT} cycles are in flight"):
            process.submit(np.array([0]), [later], np.array([False]), np.array([], np.int64))
        assert process.result()[1].tolist() == [CHUNK_FRAMES, 0, 0, 0]  # in submission order
        assert process.result()[1].tolist() == [CHUNK_FRAMES, 0, CHUNK_FRAMES, 0]


def test_a_dead_process_is_an_error_and_features_handed_out_outlive_close():
    process = FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, FIRST_BLOCK, threads=1)
    block = np.random.default_rng(2).standard_normal(FIRST_BLOCK).astype(np.float32)
    process.submit(np.array([1]), [block], np.array([False]), np.array([1]))
    features = process.result()[0]  # a view of the memory shared with the process
    expected = features.copy()
    os.kill(process._process.pid, signal.SIGKILL)
    process._process.join(timeout=10)
    with pytest.raises(RuntimeError, match=r"the feature process died \(exit code -9\)"):
        process.submit(np.array([0]), [np.zeros(BLOCK, np.float32)], np.array([False]), np.array([0]))
    process.close()
    process.close()  # idempotent
    np.testing.assert_array_equal(features, expected)  # still mapped: the view holds the memory


def test_a_script_without_a_main_guard_gets_an_error_that_says_so(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from audiomask.features import Phi4MMFrontend\n"
        "from audiomask.features.process import FeatureProcess\n"
        f"FeatureProcess(Phi4MMFrontend(), {BATCH}, {CHUNK_FRAMES}, {FIRST_BLOCK}, threads=1).close()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert "died (exit code 1) while starting" in done.stderr and "if __name__ == '__main__':" in done.stderr


def test_a_forgotten_process_is_stopped_when_collected():
    process = FeatureProcess(Phi4MMFrontend(), BATCH, CHUNK_FRAMES, FIRST_BLOCK, threads=1)
    process.submit(np.array([0]), [np.zeros(FIRST_BLOCK, np.float32)], np.array([False]), np.array([0]))
    features = process.result()[0]
    child = process._process
    del process
    gc.collect()
    child.join(timeout=10)
    assert not child.is_alive() and child.exitcode == 0  # asked to stop, not killed
    assert features.shape == (BATCH, CHUNK_FRAMES, 80) and np.isfinite(features).all()  # still readable
