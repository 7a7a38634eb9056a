"""audiomask.streaming.Qwen3ASRSlots: completed windows, the flushed rest and the provisional window equal the offline forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.masks import qwen3_asr
from audiomask.streaming import Qwen3ASRSlots

TOLERANCE = 1e-4  # float32 on CPU
QWEN_MEL = 128
STREAM_EXAMPLES = 8  # each example streams a batch through a 2-layer model
WINDOW = qwen3_asr.WINDOW_TOKENS


@pytest.fixture(scope="module")
def qwen(tiny_qwen3_asr):
    return tiny_qwen3_asr()


@settings(max_examples=STREAM_EXAMPLES)
@given(
    lengths=st.lists(st.integers(0, 2000), min_size=1, max_size=3),
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_qwen3_asr_stream_equals_offline(qwen, stream_in_pieces, assert_streamed_equals, lengths, sizes, seed):
    """Zero beyond each length offline (the slots pad the last chunk with zeros): every output equal."""
    features = torch.randn(len(lengths), QWEN_MEL, max(lengths), generator=torch.Generator().manual_seed(seed))
    features *= (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None])[:, None]
    with torch.no_grad():
        reference, reference_lengths = qwen(features, lengths)
    pieces, valid = stream_in_pieces(Qwen3ASRSlots(qwen, batch_size=len(lengths)), features, lengths, sizes)
    assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit=WINDOW)


def test_qwen3_asr_completed_windows_are_final(qwen):
    """A window's outputs come out once its 8 chunks are in, equal to the offline forward of the whole input."""
    features = torch.randn(1, QWEN_MEL, 2000)  # noise after any cut: completed windows never see it
    with torch.no_grad():
        reference, _ = qwen(features, [2000])
    slots = Qwen3ASRSlots(qwen)
    assert slots.push(features[:, :, :799]).shape == (1, 0, 16)
    first = slots.push(features[:, :, 799:1000])
    assert first.shape == (1, WINDOW, 16)
    assert (first - reference[:, :WINDOW]).abs().max().item() <= TOLERANCE


def test_qwen3_asr_partial_window(qwen, max_valid_diff):
    """``partial`` attends the current window over the frames so far: the offline forward of the prefix."""
    features = torch.randn(2, QWEN_MEL, 1100)
    slots = Qwen3ASRSlots(qwen, batch_size=2)
    slots.push(features[:, :, :1030], lengths=[1030, 930])
    provisional = slots.partial()
    prefix_features = features[:, :, :1030].clone()
    prefix_features[1, :, 930:] = 0  # the slots zero-pad slot 1's last chunk
    with torch.no_grad():
        prefix, prefix_lengths = qwen(prefix_features, [1030, 930])
    assert provisional.shape == (2, prefix.shape[1] - WINDOW, 16)
    assert max_valid_diff(provisional, prefix[:, WINDOW:], (prefix_lengths - WINDOW).tolist()) <= TOLERANCE
    assert slots.partial().equal(provisional)  # it changed nothing


def test_qwen3_asr_slots_bad_push(qwen):
    with pytest.raises(ValueError, match=r"features must be a tensor of shape \(1, 128, t\), got \(1, 100, 128\)"):
        Qwen3ASRSlots(qwen).push(torch.zeros(1, 100, QWEN_MEL))


def test_qwen3_asr_step_emits_a_slot_window_at_its_eighth_or_final_chunk(qwen):
    """Slots started at different steps emit their windows at their own 8th chunk; ``final`` closes one early."""
    slots = Qwen3ASRSlots(qwen, batch_size=2)
    widths = []
    for step in range(10):
        if step == 2:
            slots.reset_slots([1])  # slot 1's utterance starts at step 2 and ends at step 5: then it idles
        valid = [100, 100 if 2 <= step <= 5 else 0]
        chunk = torch.randn(2, QWEN_MEL, 100) * (torch.arange(100) < torch.tensor(valid)[:, None])[:, None]
        outputs, lengths = slots.step(chunk, valid, final=np.array([False, step == 5]))
        widths.append((outputs.shape[1], lengths.tolist()))
    assert widths[7] == (WINDOW, [WINDOW, 0])  # slot 0's 8th chunk
    assert widths[5] == (WINDOW, [0, 4 * 13])  # slot 1 ends after 4 chunks
    assert all(width == (0, [0, 0]) for step, width in enumerate(widths) if step not in (5, 7))
    assert slots.last_lengths.tolist() == [0, 0]
