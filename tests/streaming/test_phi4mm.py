"""audiomask.streaming.Phi4MMSlots: chunk-by-chunk outputs equal the ``hard``-masked forward.

The concatenated ``push``/``flush`` outputs equal ``encoder(...,
mask_mode="hard")`` with the same chunk settings on every utterance's valid
tokens, for random piece sizes and batches of streams of different lengths.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.models import conformer
from audiomask.streaming import Phi4MMSlots, buffer

TOLERANCE = 1e-4  # float32 on CPU
PHI_MEL = 80
STREAM_EXAMPLES = 8  # per chunking: each example streams a batch through a 2-block model


@pytest.fixture(scope="module")
def phi4mm(tiny_phi4mm):
    return tiny_phi4mm()


CHUNKINGS = [(1, 0), (2, 1), (3, 2), (4, 100)]  # (chunk_size tokens, left_chunk chunks); 100: all the past


@pytest.mark.parametrize(("chunk_size", "left_chunk"), CHUNKINGS)
@settings(max_examples=STREAM_EXAMPLES)
@given(
    lengths=st.lists(st.integers(0, 260), min_size=1, max_size=3),
    sizes=st.lists(st.integers(1, 70), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_phi4mm_stream_equals_hard_forward(
    phi4mm, stream_in_pieces, assert_streamed_equals, chunk_size, left_chunk, lengths, sizes, seed
):
    features = torch.randn(len(lengths), max(lengths), PHI_MEL, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        reference, reference_lengths = phi4mm(
            features, lengths, chunk_size=chunk_size, left_chunk=left_chunk, mask_mode="hard"
        )
    slots = Phi4MMSlots(phi4mm, batch_size=len(lengths), chunk_size=chunk_size, left_chunk=left_chunk)
    pieces, valid = stream_in_pieces(slots, features, lengths, sizes)
    assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit=chunk_size)


def test_phi4mm_stream_in_subsampling_slices_equals_hard_forward(
    phi4mm, stream_in_pieces, assert_streamed_equals, monkeypatch
):
    """A batch whose first subsampling stage outgrows SUBSAMPLING_SLICE_BYTES subsamples slice by slice, each
    slice's caches its own rows."""
    lengths = [37, 64, 0, 51, 64]
    features = torch.randn(len(lengths), max(lengths), PHI_MEL, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference, reference_lengths = phi4mm(features, lengths, chunk_size=2, left_chunk=1, mask_mode="hard")
    monkeypatch.setattr(conformer, "SUBSAMPLING_SLICE_BYTES", 1)  # slices of one utterance
    slots = Phi4MMSlots(phi4mm, batch_size=len(lengths), chunk_size=2, left_chunk=1)
    pieces, valid = stream_in_pieces(slots, features, lengths, [16, 9, 40])
    assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit=2)


@pytest.mark.parametrize(("chunk_size", "left_chunk"), [(2, 1), (3, 0)])
def test_phi4mm_stream_in_block_slices_equals_hard_forward(
    phi4mm, stream_in_pieces, assert_streamed_equals, monkeypatch, chunk_size, left_chunk
):
    """A batch whose blocks' activations outgrow BLOCK_SLICE_BYTES runs the blocks slice by slice, each slice
    its own rows of the caches and masks (slices of two streams: a short last slice too)."""
    lengths = [37, 64, 0, 51, 64]
    features = torch.randn(len(lengths), max(lengths), PHI_MEL, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        reference, reference_lengths = phi4mm(
            features, lengths, chunk_size=chunk_size, left_chunk=left_chunk, mask_mode="hard"
        )
    config = phi4mm.config
    width = max(2 * config.intermediate_size, 3 * config.hidden_size, 2 * config.ext_pw_out_channel)
    monkeypatch.setattr(conformer, "BLOCK_SLICE_BYTES", 2 * chunk_size * width * 4)  # two float32 streams
    assert conformer.block_slice_rows(config, chunk_size, 4) == 2
    slots = Phi4MMSlots(phi4mm, batch_size=len(lengths), chunk_size=chunk_size, left_chunk=left_chunk)
    pieces, valid = stream_in_pieces(slots, features, lengths, [16, 9, 40])
    assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit=chunk_size)


def test_phi4mm_stream_long_utterance(phi4mm, stream_in_pieces):
    """Over 500 tokens (no unfold in hard mode), relative distances past bias_max_distance inside the cache."""
    frames = 8 * 530 + 5
    features = torch.randn(1, frames, PHI_MEL)
    with torch.no_grad():
        reference, _ = phi4mm(features, [frames], chunk_size=16, left_chunk=2, mask_mode="hard")
    slots = Phi4MMSlots(phi4mm, chunk_size=16, left_chunk=2)
    outputs = torch.cat(stream_in_pieces(slots, features, [frames], [1000, 37])[0], dim=1)
    assert (outputs - reference).abs().max().item() <= TOLERANCE


def test_phi4mm_slots_emits_each_chunk_once_its_frames_are_in(phi4mm):
    """No lookahead: chunk k is emitted by the push that completes its chunk_size * 8 frames."""
    slots = Phi4MMSlots(phi4mm, batch_size=2, chunk_size=3, left_chunk=1)
    chunk_frames = 3 * 8
    assert slots.push(torch.randn(2, chunk_frames - 1, PHI_MEL)).shape == (2, 0, 16)
    assert slots.last_lengths.tolist() == [0, 0]
    assert slots.push(torch.randn(2, 1, PHI_MEL)).shape == (2, 3, 16)
    assert slots.push(torch.randn(2, 2 * chunk_frames, PHI_MEL)).shape == (2, 6, 16)
    assert slots.last_lengths.tolist() == [6, 6]
    # A slot that lags holds the batch back (lock step) until flush.
    assert slots.push(torch.randn(2, chunk_frames, PHI_MEL), lengths=[chunk_frames, 5]).shape == (2, 0, 16)
    assert slots.flush().shape == (2, 3, 16)  # 4 chunks in all, the last one padded in slot 1
    assert slots.last_lengths.tolist() == [3, 1]  # slot 1: 5 frames -> 1 token


def test_phi4mm_slots_reusable_after_flush(phi4mm):
    features = torch.randn(2, 100, PHI_MEL)
    slots = Phi4MMSlots(phi4mm, batch_size=2, chunk_size=2, left_chunk=1)
    first = torch.cat([slots.push(features, [100, 60]), slots.flush()], dim=1)
    assert slots.flush().shape == (2, 0, 16)  # nothing pushed since
    second = torch.cat([slots.push(features, [100, 60]), slots.flush()], dim=1)
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_phi4mm_empty_streams_stay_finite(phi4mm):
    """A slot that never gets a frame attends to no valid key at all: finite padding, no NaN."""
    slots = Phi4MMSlots(phi4mm, batch_size=3, chunk_size=2, left_chunk=0)
    pushed = slots.push(torch.randn(3, 100, PHI_MEL), [100, 0, 3])
    assert slots.last_lengths.tolist() == [0, 0, 0]  # slots 1 and 2 hold the others back
    outputs = torch.cat([pushed, slots.flush()], dim=1)
    assert slots.last_lengths.tolist() == [13, 0, 1]
    assert outputs.shape == (3, 13, 16)
    assert torch.isfinite(outputs).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "chunk_size must be >= 1, got -1"),  # the config's default: full attention cannot slots
        ({"chunk_size": 2, "left_chunk": -1}, "left_chunk must be >= 0, got -1"),
        ({"chunk_size": 2, "batch_size": 0}, "batch_size must be >= 1, got 0"),
    ],
)
def test_phi4mm_slots_bad_settings(phi4mm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Phi4MMSlots(phi4mm, **kwargs)


@pytest.mark.parametrize(
    ("features", "lengths", "message"),
    [
        (torch.zeros(2, 8, 80), None, r"features must be a tensor of shape \(1, t, 80\), got \(2, 8, 80\)"),
        (torch.zeros(1, 8, 128), None, r"features must be a tensor of shape \(1, t, 80\), got \(1, 8, 128\)"),
        (torch.zeros(1, 8, 80), [9], r"lengths must be <= t \(8\), got 9"),
        (torch.zeros(1, 8, 80), [1, 2], r"lengths must have 1 entries \(batch_size\), got 2"),
    ],
)
def test_phi4mm_slots_bad_push(phi4mm, features, lengths, message):
    with pytest.raises(ValueError, match=message):
        Phi4MMSlots(phi4mm, chunk_size=2).push(features, lengths)


def test_phi4mm_step_casts_host_frames_on_the_device(phi4mm, monkeypatch):
    """float32 host frames for a bf16 encoder cross as float32 and are cast there (the same outputs, no host
    cast), unless they are as large as a staging memcpy that runs on torch's pool anyway."""
    encoder = copy.deepcopy(phi4mm).to(torch.bfloat16)
    frames = np.random.default_rng(3).standard_normal((2, 16, PHI_MEL)).astype(np.float32)
    cast_first = Phi4MMSlots(encoder, batch_size=2, chunk_size=2, left_chunk=1)
    expected, _ = cast_first.step(torch.from_numpy(frames).to(torch.bfloat16), [16, 9])
    crossed = []
    original = buffer.to_device

    def recording(data, *args, **kwargs):
        result = original(data, *args, **kwargs)
        crossed.append(result.dtype)
        return result

    monkeypatch.setattr(buffer, "to_device", recording)
    outputs, _ = Phi4MMSlots(encoder, batch_size=2, chunk_size=2, left_chunk=1).step(frames, [16, 9])
    assert outputs.dtype == torch.bfloat16
    torch.testing.assert_close(outputs, expected, rtol=0, atol=0)
    assert torch.float32 in crossed and torch.bfloat16 not in crossed  # the frames crossed as they were
    crossed.clear()
    monkeypatch.setattr(buffer, "parallel_copy_bytes", lambda: frames.nbytes)  # as large as a parallel memcpy
    outputs, _ = Phi4MMSlots(encoder, batch_size=2, chunk_size=2, left_chunk=1).step(frames, [16, 9])
    torch.testing.assert_close(outputs, expected, rtol=0, atol=0)
    assert torch.bfloat16 in crossed and torch.float32 not in crossed  # cast while staging: half the bytes


def test_phi4mm_step_refuses_bad_input(phi4mm):
    slots = Phi4MMSlots(phi4mm, batch_size=2, chunk_size=2, left_chunk=1)
    with pytest.raises(ValueError, match=r"chunk must have shape \(2, 16, 80\), got \(2, 15, 80\)"):
        slots.step(np.zeros((2, 15, PHI_MEL), np.float32), [15, 15])
    with pytest.raises(ValueError, match="valid"):
        slots.step(np.zeros((2, 16, PHI_MEL), np.float32), [17, 3])
    with pytest.raises(ValueError, match=r"final must be None or a \(2,\) bool array"):
        slots.step(np.zeros((2, 16, PHI_MEL), np.float32), [16, 3], final=[1, 0])
    with pytest.raises(ValueError, match=r"slots must lie in \[0, 2\), got \[2\]"):
        slots.reset_slots([2])
    slots.push(torch.zeros(2, 5, PHI_MEL))
    with pytest.raises(ValueError, match="empty frame buffer"):
        slots.step(np.zeros((2, 16, PHI_MEL), np.float32), [16, 16])
    with pytest.raises(ValueError, match="slots must hold no buffered frames"):
        slots.reset_slots([0])


def test_phi4mm_cuda_graph_needs_cuda(phi4mm):
    if torch.cuda.is_available():
        pytest.skip("checks the error without CUDA")
    with pytest.raises(ValueError, match="cuda_graph needs the encoder on a CUDA device, got cpu"):
        Phi4MMSlots(phi4mm, cuda_graph=True, chunk_size=2, left_chunk=1)
