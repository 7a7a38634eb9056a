"""audiomask.streaming's protocol: a driver's steps (slots reset at any step, short and final last chunks) equal
each utterance's offline forward, for every encoder family; open_slots and default_frontend by encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from audiomask.features import Phi4MMFrontend, WhisperFrontend
from audiomask.streaming import (
    EncoderSlots,
    Phi4MMSlots,
    Qwen3ASRSlots,
    default_frontend,
    open_slots,
    share_graph_memory,
)

TOLERANCE = 1e-4  # float32 on CPU


@pytest.fixture(params=["phi4mm", "qwen3_asr"])
def family(request, tiny_phi4mm, tiny_qwen3_asr):
    """``(3 slots, offline forward of one utterance's (T, F) frames -> its real tokens (N, D))``."""
    if request.param == "phi4mm":
        encoder = tiny_phi4mm()

        def offline(frames: torch.Tensor) -> torch.Tensor:
            outputs, lengths = encoder(frames[None], [len(frames)], chunk_size=2, left_chunk=1, mask_mode="hard")
            return outputs[0, : int(lengths[0])]

        return open_slots(encoder, 3, chunk_ms=160, left_chunks=1), offline
    encoder = tiny_qwen3_asr()

    def offline(frames: torch.Tensor) -> torch.Tensor:
        outputs, lengths = encoder(frames.T[None], [len(frames)])
        return outputs[0, : int(lengths[0])]

    return open_slots(encoder, 3), offline


class NumbersPutThroughIndices(TorchDispatchMode):
    """Counts ``index_put_`` calls whose values are one number (``tensor[rows] = 0``): on CUDA torch first copies
    that number to the device synchronously, so the host waits for everything queued on the stream."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.index_put_.default and args[2].dim() == 0:
            self.calls += 1
        return func(*args, **(kwargs or {}))


# (slot, step) pairs where a slot's utterance has no chunk ready: the slot is inactive and keeps its state.
HELD_STEPS = {(0, 1), (0, 2), (0, 5), (1, 2), (1, 5), (1, 6), (0, 9), (0, 10), (0, 11), (0, 12), (0, 13)}


@pytest.mark.parametrize("held", [set(), HELD_STEPS], ids=["every-slot-active", "slots-held-mid-utterance"])
def test_steps_with_slots_reset_at_any_step_equal_each_utterance_offline(family, held):
    """Whole chunks per step as a driver sends them: utterances start in their slots at different steps
    (reset_slots), end with a short or a full final chunk, and slots idle in between; with ``held``, a slot
    whose utterance has no chunk ready sits some steps out (``active``), mid-utterance (for Phi-4MM across
    every ring phase). Each utterance's outputs, joined over the steps, equal its offline forward; no reset or
    step puts a number through an index (on CUDA a copy that waits for the device)."""
    slots, offline = family
    chunk_frames = slots.chunk_frames
    # Per slot: (first step, frames) of each utterance, one after another.
    plans = [[(0, 9 * chunk_frames + 7)], [(1, 2 * chunk_frames), (4, 3 * chunk_frames - 5)], [(2, 5)]]
    generator = torch.Generator().manual_seed(5)
    utterances = [
        [torch.randn(frames, slots.feature_size, generator=generator) for _, frames in plan] for plan in plans
    ]
    collected = [[[] for _ in plan] for plan in plans]
    current = [None] * 3  # (utterance index, frames sent) per slot
    for step in range(12 + len(held)):
        chunk = torch.zeros(3, chunk_frames, slots.feature_size)
        valid, final, joins = np.zeros(3, np.int64), np.zeros(3, bool), []
        active = np.array([(slot, step) not in held for slot in range(3)])
        for slot, plan in enumerate(plans):
            starting = [index for index, (first, _) in enumerate(plan) if first == step]
            if current[slot] is None and starting:
                current[slot] = (starting[0], 0)
                joins.append(slot)
            if current[slot] is not None and active[slot]:
                index, sent = current[slot]
                frames = utterances[slot][index]
                valid[slot] = min(chunk_frames, len(frames) - sent)
                chunk[slot, : valid[slot]] = frames[sent : sent + valid[slot]]
                final[slot] = sent + valid[slot] == len(frames)
        layout = chunk if slots.time_dim == 1 else chunk.transpose(1, 2)
        with NumbersPutThroughIndices() as numbers_put:
            slots.reset_slots(joins)
            outputs, lengths = slots.step(layout.numpy(), valid, final, active if held else None)
        assert numbers_put.calls == 0, step
        assert outputs.shape[1] <= slots.tokens_per_chunk and slots.last_lengths.tolist() == lengths.tolist()
        assert not lengths[~active].any()
        for slot in range(3):
            if current[slot] is not None and active[slot]:
                index, sent = current[slot]
                collected[slot][index].append(outputs[slot, : lengths[slot]])
                current[slot] = None if final[slot] else (index, sent + valid[slot])
    with torch.no_grad():
        for slot, plan in enumerate(plans):
            for index in range(len(plan)):
                streamed, reference = torch.cat(collected[slot][index]), offline(utterances[slot][index])
                assert streamed.shape == reference.shape, (slot, index)
                assert (streamed - reference).abs().max().item() <= TOLERANCE, (slot, index)


def test_open_slots_picks_the_family_and_its_geometry(tiny_phi4mm, tiny_qwen3_asr):
    phi = open_slots(tiny_phi4mm(chunk_size=3, left_chunk=2), 2)  # the config's chunking
    assert isinstance(phi, Phi4MMSlots) and isinstance(phi, EncoderSlots)
    assert (phi.chunk_frames, phi.tokens_per_chunk, phi.left_chunk, phi.chunk_shape) == (24, 3, 2, (2, 24, 80))
    qwen = open_slots(tiny_qwen3_asr(), 2, chunk_ms=1000)
    assert isinstance(qwen, Qwen3ASRSlots)
    assert (qwen.chunk_frames, qwen.tokens_per_chunk, qwen.left_chunk, qwen.chunk_shape) == (
        100,
        104,
        None,
        (2, 128, 100),
    )
    assert isinstance(default_frontend(tiny_phi4mm()), Phi4MMFrontend)
    whisper = default_frontend(tiny_qwen3_asr())
    assert isinstance(whisper, WhisperFrontend) and (whisper.n_mels, whisper.time_axis) == (128, 1)


@pytest.mark.parametrize(
    ("family", "options", "message"),
    [
        ("phi4mm", {}, r"chunk_ms must be given: the encoder config's chunk_size \(-1\) means full attention"),
        ("phi4mm", {"chunk_ms": 100}, r"chunk_ms must be a multiple of 80 \(one encoder token\), got 100"),
        ("phi4mm", {"chunk_ms": 80, "left_chunks": -1}, "left_chunks must be >= 0, got -1"),
        ("phi4mm", {"chunk_ms": 80, "cuda_graph": True}, "cuda_graph needs the encoder on a CUDA device"),
        ("qwen3_asr", {"chunk_ms": 500}, r"chunk_ms must be 1000 \(Qwen3-ASR's conv chunk\) or None, got 500"),
        ("qwen3_asr", {"left_chunks": 2}, "left_chunks must be None for Qwen3-ASR"),
        ("qwen3_asr", {"cuda_graph": True}, "cuda_graph must be False or None for Qwen3-ASR"),
        ("other", {}, "encoder must be a Phi4MMEncoder or Qwen3ASREncoder, got Linear"),
    ],
)
def test_open_slots_bad_options(tiny_phi4mm, tiny_qwen3_asr, family, options, message):
    encoder = {"phi4mm": tiny_phi4mm, "qwen3_asr": tiny_qwen3_asr}.get(family, lambda: torch.nn.Linear(2, 2))()
    if family == "phi4mm" and torch.cuda.is_available() and "cuda_graph" in options:
        pytest.skip("checks the error without CUDA")
    with pytest.raises(ValueError, match=message):
        open_slots(encoder, **options)


@pytest.mark.parametrize(
    ("valid", "final", "active", "message"),
    [
        ([4, 0, 0], None, [False, True, True], "slot 0 is not active but has valid=4"),
        ([0, 0, 0], [False, True, False], [True, False, True], "slot 1 is not active .* final=True"),
        ([0, 0, 0], None, [1, 1, 1], r"active must be None or a \(3,\) bool array"),
    ],
)
def test_step_refuses_frames_for_inactive_slots(family, valid, final, active, message):
    slots, _ = family
    with pytest.raises(ValueError, match=message):
        slots.step(np.zeros(slots.chunk_shape, np.float32), np.array(valid), final and np.array(final), active)


def test_slots_without_graphs_to_capture_take_no_graph_pool(family):
    """Eager slots (every family on the CPU) have no CUDA graphs: a shared pool is not theirs to use, and a driver's
    lanes off CUDA are left as they are."""
    slots, _ = family
    assert slots.use_graph_pool(object()) is False
    lanes = (slots, open_slots(slots.encoder, 2, plan=slots.plan))
    assert share_graph_memory(lanes) is lanes
