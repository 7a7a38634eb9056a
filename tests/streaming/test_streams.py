"""audiomask.streaming: chunk-by-chunk outputs equal the offline forward (acceptance 3 and 4).

Phi-4MM: the concatenated ``push``/``flush`` outputs equal ``encoder(...,
mask_mode="hard")`` with the same chunk settings on every utterance's valid
tokens, for random piece sizes and batches of streams of different lengths.
Qwen3-ASR: completed windows, the flushed rest and the provisional window
equal the offline forward.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from encoder_models import (
    max_valid_diff,
    tiny_phi4mm,
    tiny_qwen3_asr,
    torch_one_thread,  # noqa: F401 (an autouse fixture)
)
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.masks import qwen3_asr
from audiomask.models import phi4mm as phi4mm_module
from audiomask.models import streaming

TOLERANCE = 1e-4  # float32 on CPU
PHI_MEL, QWEN_MEL = 80, 128
STREAM_EXAMPLES = 8  # per chunking: each example streams a batch through a 2-block model


@pytest.fixture(scope="module")
def phi4mm():
    return tiny_phi4mm()


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen3_asr()


def stream_in_pieces(stream, features: torch.Tensor, lengths: list[int], sizes: list[int], time_dim: int):
    """Push each utterance's frames in pieces of ``sizes`` frames (cycled), all slots in lock step, then flush.

    A piece holds ``size`` frames per slot, of which ``real[b]`` are slot
    ``b``'s next frames and the rest noise (shorter utterances run out first).
    Returns the outputs of every call (the flush last) and the sum of their ``last_lengths``.
    """
    lengths = np.asarray(lengths)
    generator = torch.Generator().manual_seed(3)
    sent = np.zeros(lengths.size, np.int64)
    outputs = []
    valid = np.zeros(lengths.size, np.int64)
    step = 0
    while (sent < lengths).any():
        size = sizes[step % len(sizes)]
        step += 1
        real = np.clip(lengths - sent, 0, size)
        shape = list(features.shape)
        shape[time_dim] = size
        piece = torch.randn(shape, generator=generator) * 3
        for row, (start, count) in enumerate(zip(sent.tolist(), real.tolist())):
            piece[row].narrow(time_dim - 1, 0, count).copy_(features[row].narrow(time_dim - 1, start, count))
        outputs.append(stream.push(piece, real))
        valid += stream.last_lengths
        sent += real
    outputs.append(stream.flush())
    return outputs, valid + stream.last_lengths


def assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit: int) -> None:
    """Pushes emit whole units (chunks, windows); joined, the outputs equal the reference on the valid tokens."""
    assert all(piece.shape[1] % push_unit == 0 for piece in pieces[:-1])
    assert valid.tolist() == reference_lengths.tolist()  # last_lengths add up to the offline lengths
    outputs = torch.cat(pieces, dim=1)
    assert outputs.shape == reference.shape
    assert torch.isfinite(outputs).all()
    assert max_valid_diff(outputs, reference, reference_lengths.tolist()) <= TOLERANCE


CHUNKINGS = [(1, 0), (2, 1), (3, 2), (4, 100)]  # (chunk_size tokens, left_chunk chunks); 100: all the past


@pytest.mark.parametrize(("chunk_size", "left_chunk"), CHUNKINGS)
@settings(max_examples=STREAM_EXAMPLES)
@given(
    lengths=st.lists(st.integers(0, 260), min_size=1, max_size=3),
    sizes=st.lists(st.integers(1, 70), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_phi4mm_stream_equals_hard_forward(phi4mm, chunk_size, left_chunk, lengths, sizes, seed):
    features = torch.randn(len(lengths), max(lengths), PHI_MEL, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        reference, reference_lengths = phi4mm(
            features, lengths, chunk_size=chunk_size, left_chunk=left_chunk, mask_mode="hard"
        )
    stream = phi4mm.stream(batch_size=len(lengths), chunk_size=chunk_size, left_chunk=left_chunk)
    pieces, valid = stream_in_pieces(stream, features, lengths, sizes, time_dim=1)
    assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit=chunk_size)


def test_phi4mm_stream_in_subsampling_slices_equals_hard_forward(phi4mm, monkeypatch):
    """A batch larger than SUBSAMPLING_SLICE subsamples slice by slice, each slice's caches its own rows."""
    lengths = [37, 64, 0, 51, 64]
    features = torch.randn(len(lengths), max(lengths), PHI_MEL, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference, reference_lengths = phi4mm(features, lengths, chunk_size=2, left_chunk=1, mask_mode="hard")
    monkeypatch.setattr(phi4mm_module, "SUBSAMPLING_SLICE", 2)  # slices of 2, 2 and 1 utterances
    stream = phi4mm.stream(batch_size=len(lengths), chunk_size=2, left_chunk=1)
    pieces, valid = stream_in_pieces(stream, features, lengths, [16, 9, 40], time_dim=1)
    assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit=2)


def test_phi4mm_stream_long_utterance(phi4mm):
    """Over 500 tokens (no unfold in hard mode), relative distances past bias_max_distance inside the cache."""
    frames = 8 * 530 + 5
    features = torch.randn(1, frames, PHI_MEL)
    with torch.no_grad():
        reference, _ = phi4mm(features, [frames], chunk_size=16, left_chunk=2, mask_mode="hard")
    stream = phi4mm.stream(chunk_size=16, left_chunk=2)
    outputs = torch.cat(stream_in_pieces(stream, features, [frames], [1000, 37], time_dim=1)[0], dim=1)
    assert (outputs - reference).abs().max().item() <= TOLERANCE


def test_phi4mm_stream_emits_each_chunk_once_its_frames_are_in(phi4mm):
    """No lookahead: chunk k is emitted by the push that completes its chunk_size * 8 frames."""
    stream = phi4mm.stream(batch_size=2, chunk_size=3, left_chunk=1)
    chunk_frames = 3 * 8
    assert stream.push(torch.randn(2, chunk_frames - 1, PHI_MEL)).shape == (2, 0, 16)
    assert stream.last_lengths.tolist() == [0, 0]
    assert stream.push(torch.randn(2, 1, PHI_MEL)).shape == (2, 3, 16)
    assert stream.push(torch.randn(2, 2 * chunk_frames, PHI_MEL)).shape == (2, 6, 16)
    assert stream.last_lengths.tolist() == [6, 6]
    # A slot that lags holds the batch back (lock step) until flush.
    assert stream.push(torch.randn(2, chunk_frames, PHI_MEL), lengths=[chunk_frames, 5]).shape == (2, 0, 16)
    assert stream.flush().shape == (2, 3, 16)  # 4 chunks in all, the last one padded in slot 1
    assert stream.last_lengths.tolist() == [3, 1]  # slot 1: 5 frames -> 1 token


def test_phi4mm_stream_reusable_after_flush(phi4mm):
    features = torch.randn(2, 100, PHI_MEL)
    stream = phi4mm.stream(batch_size=2, chunk_size=2, left_chunk=1)
    first = torch.cat([stream.push(features, [100, 60]), stream.flush()], dim=1)
    assert stream.flush().shape == (2, 0, 16)  # nothing pushed since
    second = torch.cat([stream.push(features, [100, 60]), stream.flush()], dim=1)
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_phi4mm_empty_streams_stay_finite(phi4mm):
    """A slot that never gets a frame attends to no valid key at all: finite padding, no NaN."""
    stream = phi4mm.stream(batch_size=3, chunk_size=2, left_chunk=0)
    pushed = stream.push(torch.randn(3, 100, PHI_MEL), [100, 0, 3])
    assert stream.last_lengths.tolist() == [0, 0, 0]  # slots 1 and 2 hold the others back
    outputs = torch.cat([pushed, stream.flush()], dim=1)
    assert stream.last_lengths.tolist() == [13, 0, 1]
    assert outputs.shape == (3, 13, 16)
    assert torch.isfinite(outputs).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "chunk_size must be >= 1, got -1"),  # the config's default: full attention cannot stream
        ({"chunk_size": 2, "left_chunk": -1}, "left_chunk must be >= 0, got -1"),
        ({"chunk_size": 2, "batch_size": 0}, "batch_size must be >= 1, got 0"),
    ],
)
def test_phi4mm_stream_bad_settings(phi4mm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        phi4mm.stream(**kwargs)


@pytest.mark.parametrize(
    ("features", "lengths", "message"),
    [
        (torch.zeros(2, 8, 80), None, r"features must be a tensor of shape \(1, t, 80\), got \(2, 8, 80\)"),
        (torch.zeros(1, 8, 128), None, r"features must be a tensor of shape \(1, t, 80\), got \(1, 8, 128\)"),
        (torch.zeros(1, 8, 80), [9], r"lengths must be <= t \(8\), got 9"),
        (torch.zeros(1, 8, 80), [1, 2], r"lengths must have 1 entries \(batch_size\), got 2"),
    ],
)
def test_phi4mm_stream_bad_push(phi4mm, features, lengths, message):
    with pytest.raises(ValueError, match=message):
        phi4mm.stream(chunk_size=2).push(features, lengths)


# --- Qwen3-ASR -----------------------------------------------------------------------------

WINDOW = qwen3_asr.WINDOW_TOKENS


@settings(max_examples=STREAM_EXAMPLES)
@given(
    lengths=st.lists(st.integers(0, 2000), min_size=1, max_size=3),
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_qwen3_asr_stream_equals_offline(qwen, lengths, sizes, seed):
    """Zero beyond each length offline (the stream pads its last chunk with zeros): every output equal."""
    features = torch.randn(len(lengths), QWEN_MEL, max(lengths), generator=torch.Generator().manual_seed(seed))
    features *= (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None])[:, None]
    with torch.no_grad():
        reference, reference_lengths = qwen(features, lengths)
    pieces, valid = stream_in_pieces(qwen.stream(batch_size=len(lengths)), features, lengths, sizes, time_dim=2)
    assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit=WINDOW)


def test_qwen3_asr_completed_windows_are_final(qwen):
    """A window's outputs come out once its 8 chunks are in, equal to the offline forward of the whole input."""
    features = torch.randn(1, QWEN_MEL, 2000)  # noise after any cut: completed windows never see it
    with torch.no_grad():
        reference, _ = qwen(features, [2000])
    stream = qwen.stream()
    assert stream.push(features[:, :, :799]).shape == (1, 0, 16)
    first = stream.push(features[:, :, 799:1000])
    assert first.shape == (1, WINDOW, 16)
    assert (first - reference[:, :WINDOW]).abs().max().item() <= TOLERANCE


def test_qwen3_asr_partial_window(qwen):
    """``partial`` attends the current window over the frames so far: the offline forward of the prefix."""
    features = torch.randn(2, QWEN_MEL, 1100)
    stream = qwen.stream(batch_size=2)
    stream.push(features[:, :, :1030], lengths=[1030, 930])
    provisional = stream.partial()
    prefix_features = features[:, :, :1030].clone()
    prefix_features[1, :, 930:] = 0  # the stream zero-pads slot 1's last chunk
    with torch.no_grad():
        prefix, prefix_lengths = qwen(prefix_features, [1030, 930])
    assert provisional.shape == (2, prefix.shape[1] - WINDOW, 16)
    assert max_valid_diff(provisional, prefix[:, WINDOW:], (prefix_lengths - WINDOW).tolist()) <= TOLERANCE
    assert stream.partial().equal(provisional)  # it changed nothing


def test_qwen3_asr_stream_bad_push(qwen):
    with pytest.raises(ValueError, match=r"features must be a tensor of shape \(1, 128, t\), got \(1, 100, 128\)"):
        qwen.stream().push(torch.zeros(1, 100, QWEN_MEL))


def test_phi4mm_step_frames_equals_push_and_step(phi4mm):
    """A driver's whole-chunk steps (host frames, per-slot valid counts, slots reset mid-way) equal push + step."""
    chunk_frames = 3 * 8
    rng = np.random.default_rng(7)
    by_push = phi4mm.stream(batch_size=3, chunk_size=3, left_chunk=1)
    by_chunk = phi4mm.stream(batch_size=3, chunk_size=3, left_chunk=1)
    for step in range(6):
        frames = rng.standard_normal((3, chunk_frames, PHI_MEL)).astype(np.float32)
        valid = np.array([chunk_frames, rng.integers(0, chunk_frames + 1), chunk_frames])
        frames[np.arange(chunk_frames)[None, :] >= valid[:, None]] = 0.0  # a driver's batch is zero-padded
        if step == 3:
            for stream in (by_push, by_chunk):
                stream.reset_slots([1])
        by_push._push_frames(torch.from_numpy(frames), valid)
        expected = by_push.step()
        outputs = by_chunk.step_frames(frames, valid)
        assert by_chunk.last_lengths.tolist() == by_push.last_lengths.tolist()
        torch.testing.assert_close(outputs, expected, rtol=0, atol=0)


def test_phi4mm_step_frames_casts_host_frames_on_the_device(phi4mm, monkeypatch):
    """float32 host frames for a bf16 encoder cross as float32 and are cast there (the same outputs, no host
    cast), unless they are as large as a staging memcpy that runs on torch's pool anyway."""
    encoder = copy.deepcopy(phi4mm).to(torch.bfloat16)
    frames = np.random.default_rng(3).standard_normal((2, 16, PHI_MEL)).astype(np.float32)
    cast_first = encoder.stream(batch_size=2, chunk_size=2, left_chunk=1)
    expected = cast_first.step_frames(torch.from_numpy(frames).to(torch.bfloat16), [16, 9])
    crossed = []
    original = streaming.to_device

    def recording(data, *args, **kwargs):
        result = original(data, *args, **kwargs)
        crossed.append(result.dtype)
        return result

    monkeypatch.setattr(streaming, "to_device", recording)
    outputs = encoder.stream(batch_size=2, chunk_size=2, left_chunk=1).step_frames(frames, [16, 9])
    assert outputs.dtype == torch.bfloat16
    torch.testing.assert_close(outputs, expected, rtol=0, atol=0)
    assert torch.float32 in crossed and torch.bfloat16 not in crossed  # the frames crossed as they were
    crossed.clear()
    monkeypatch.setattr(streaming, "parallel_copy_bytes", lambda: frames.nbytes)  # as large as a parallel memcpy
    outputs = encoder.stream(batch_size=2, chunk_size=2, left_chunk=1).step_frames(frames, [16, 9])
    torch.testing.assert_close(outputs, expected, rtol=0, atol=0)
    assert torch.bfloat16 in crossed and torch.float32 not in crossed  # cast while staging: half the bytes


def test_phi4mm_step_frames_refuses_bad_input(phi4mm):
    stream = phi4mm.stream(batch_size=2, chunk_size=2, left_chunk=1)
    with pytest.raises(ValueError, match=r"chunk must have shape \(2, 16, 80\), got \(2, 15, 80\)"):
        stream.step_frames(np.zeros((2, 15, PHI_MEL), np.float32), [15, 15])
    with pytest.raises(ValueError, match="valid"):
        stream.step_frames(np.zeros((2, 16, PHI_MEL), np.float32), [17, 3])
    stream.push(torch.zeros(2, 5, PHI_MEL))
    with pytest.raises(ValueError, match="empty frame buffer"):
        stream.step_frames(np.zeros((2, 16, PHI_MEL), np.float32), [16, 16])


def test_phi4mm_cuda_graph_needs_cuda(phi4mm):
    if torch.cuda.is_available():
        pytest.skip("checks the error without CUDA")
    with pytest.raises(ValueError, match="cuda_graph needs the encoder on a CUDA device, got cpu"):
        phi4mm.stream(cuda_graph=True, chunk_size=2, left_chunk=1)
