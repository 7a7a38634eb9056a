"""Encoders on CUDA: float32 parity with transformers on the CPU, streaming, bfloat16 tolerance, no stalls.

Skipped without CUDA. TF32 is switched off for the float32 tests (cuDNN
convolutions use it by default, ~1e-3 relative error): float32 must mean
float32 to hold 1e-4.

bfloat16 tolerance, and why: bf16 keeps 8 significant bits, a unit roundoff
``u = 2^-8 = 3.9e-3`` per rounding. Every block ends in a LayerNorm, so
rounding errors add up across blocks instead of compounding, and the outputs
are O(1) (RMS ~0.5 tiny, ~1.0 full size). Measured against float32 on the
CPU (same weights and inputs): relative RMS error 0.3-0.6 % (1-2 u) for the
2-block tiny models and 1.5 % (4 u) for the full-size 24-block Phi-4MM
encoder, worst per-token cosine similarity 0.99989. GPU bf16 kernels also
accumulate in float32, so the bound is set at ``BF16_RELATIVE_RMS = 0.05``
(~13 u, 3x the full-size figure) and a per-token cosine similarity of at
least ``BF16_MIN_COSINE = 0.999``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder, conformer
from audiomask.streaming import Phi4MMSlots, Qwen3ASRSlots

pytestmark = pytest.mark.gpu

TOLERANCE = 1e-4  # float32
BF16_RELATIVE_RMS = 0.05  # see the module docstring
BF16_MIN_COSINE = 0.999


@pytest.fixture
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def valid_rows(outputs: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The real tokens of every utterance, ``(sum N_b, D)``, on the CPU in float32."""
    return torch.cat([outputs[b, :n] for b, n in enumerate(lengths)]).float().cpu()


@pytest.mark.parity
@pytest.mark.parametrize(("chunk_size", "left_chunk"), [(-1, 18), (3, 1)])
def test_phi4mm_cuda_float32_equals_transformers_on_cpu(
    no_tf32, tiny_phi4mm, randomize, max_valid_diff, chunk_size, left_chunk
):
    transformers = pytest.importorskip("transformers")
    encoder = tiny_phi4mm()
    fields = {**dataclasses.asdict(encoder.config), "chunk_size": chunk_size, "left_chunk": left_chunk}
    model = randomize(transformers.Phi4MultimodalAudioModel(transformers.Phi4MultimodalAudioConfig(**fields)))
    encoder.load_state_dict(model.state_dict())
    encoder.to("cuda")
    for frames, lengths in [(97, [97, 50, 3]), (8 * 520 + 3, [8 * 520 + 3])]:  # upstream unfolds B = 1 only
        features = torch.randn(len(lengths), frames, 80)
        mask = torch.arange(frames)[None] < torch.tensor(lengths)[:, None]
        with torch.no_grad():
            reference = model(features, mask)
            outputs, output_lengths = encoder(features, lengths, chunk_size=chunk_size, left_chunk=left_chunk)
        assert outputs.device.type == "cuda"
        assert max_valid_diff(outputs.cpu(), reference, output_lengths.tolist()) <= TOLERANCE


@pytest.mark.parity
def test_qwen3_asr_cuda_float32_equals_transformers_on_cpu(no_tf32, tiny_qwen3_asr, randomize):
    transformers = pytest.importorskip("transformers")
    encoder = tiny_qwen3_asr()
    config = transformers.Qwen3ASREncoderConfig(**dataclasses.asdict(encoder.config))
    model = randomize(transformers.Qwen3ASREncoder(config))
    encoder.load_state_dict(model.state_dict())
    encoder.to("cuda")
    lengths = [2100, 1234, 130]
    features = torch.randn(3, 128, 2100)
    mask = (torch.arange(2100)[None] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        packed = model(features, mask).last_hidden_state
        outputs, output_lengths = encoder(features, lengths)
    assert (valid_rows(outputs, output_lengths.tolist()) - packed).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("block_slice", [None, 2], ids=["whole", "slices-of-2"])
def test_phi4mm_cuda_stream_equals_hard_forward(
    no_tf32, tiny_phi4mm, max_valid_diff, monkeypatch, cuda_graph, block_slice
):
    """Eager or from CUDA graphs; the blocks over the whole batch or in slices of streams (the last one short)."""
    encoder = tiny_phi4mm().to("cuda")
    lengths = [333, 150, 0]
    features = torch.randn(3, 333, 80)
    with torch.no_grad():
        reference, reference_lengths = encoder(features, lengths, chunk_size=4, left_chunk=2, mask_mode="hard")
    if block_slice is not None:
        rows = conformer.block_slice_rows(encoder.config, 4, 4)
        monkeypatch.setattr(conformer, "BLOCK_SLICE_BYTES", conformer.BLOCK_SLICE_BYTES * block_slice // rows)
        assert conformer.block_slice_rows(encoder.config, 4, 4) == block_slice
    slots = Phi4MMSlots(encoder, batch_size=3, chunk_size=4, left_chunk=2, cuda_graph=cuda_graph)
    pieces = []
    for start in range(0, 333, 45):
        real = [max(0, min(n - start, 45)) for n in lengths]
        pieces.append(slots.push(features[:, start : start + 45], real))
    pieces.append(slots.flush())
    outputs = torch.cat(pieces, dim=1)
    assert torch.isfinite(outputs).all()
    assert max_valid_diff(outputs.cpu(), reference.cpu(), reference_lengths.tolist()) <= TOLERANCE


def assert_bf16_close(low: torch.Tensor, reference: torch.Tensor) -> None:
    relative_rms = ((low - reference).norm() / reference.norm()).item()
    cosine = torch.nn.functional.cosine_similarity(low, reference, dim=-1).min().item()
    assert torch.isfinite(low).all()
    assert relative_rms <= BF16_RELATIVE_RMS, relative_rms
    assert cosine >= BF16_MIN_COSINE, cosine


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_phi4mm_bf16_within_tolerance(no_tf32, tiny_phi4mm, size):
    """bf16 on CUDA vs float32 on CUDA, same weights: offline (hard mode) and streamed."""
    torch.manual_seed(0)
    encoder = tiny_phi4mm() if size == "tiny" else Phi4MMEncoder(Phi4MMAudioConfig()).eval()
    encoder.to("cuda")
    lengths = [400, 230]
    features = torch.randn(2, 400, 80)
    settings = {"chunk_size": 16, "left_chunk": 2, "mask_mode": "hard"}
    with torch.no_grad():
        reference, output_lengths = encoder(features, lengths, **settings)
        encoder.to(torch.bfloat16)
        low, _ = encoder(features, lengths, **settings)
    slots = Phi4MMSlots(encoder, batch_size=2, chunk_size=16, left_chunk=2)
    streamed = torch.cat([slots.push(features, lengths), slots.flush()], dim=1)
    output_lengths = output_lengths.tolist()
    assert low.dtype == streamed.dtype == torch.bfloat16
    for outputs in (low, streamed):
        assert_bf16_close(valid_rows(outputs, output_lengths), valid_rows(reference, output_lengths))


def test_qwen3_asr_bf16_within_tolerance(no_tf32, tiny_qwen3_asr):
    encoder = tiny_qwen3_asr().to("cuda")
    lengths = [1200, 700]
    features = torch.randn(2, 128, 1200)
    with torch.no_grad():
        reference, output_lengths = encoder(features, lengths)
        low, _ = encoder.to(torch.bfloat16)(features, lengths)
    output_lengths = output_lengths.tolist()
    assert_bf16_close(valid_rows(low, output_lengths), valid_rows(reference, output_lengths))


# --- No host-device synchronisation in the steady state (``never_waits``: tests/conftest.py) ----------
# The tiny models launch a few hundred kernels per call, well below the ~1000 pending launches after which
# the host blocks in any launch (the full-size 24-block encoder launches ~800-900 per chunk step:
# scripts/bench_encoders.py counts them).


@pytest.mark.parametrize("lengths", [None, [50, 45, 41]], ids=["lock-step", "ragged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_phi4mm_stream_push_and_flush_never_wait_for_the_gpu(never_waits, tiny_phi4mm, lengths, dtype):
    encoder = tiny_phi4mm().to("cuda", dtype)
    slots = Phi4MMSlots(encoder, batch_size=3, chunk_size=2, left_chunk=2)
    features = torch.randn(3, 50, 80)  # host features, as the front end makes them: 3 chunks of 16 frames
    with torch.no_grad():
        for _ in range(2):  # warm up (first-use allocations and library handles), then a fresh utterance
            for _ in range(4):
                slots.push(features, lengths)
            slots.flush()
        for _ in range(4):  # the cache fills (left_chunk = 2) and the steady state follows
            outputs = never_waits(lambda: slots.push(features, lengths))
            assert outputs.shape[1] % 2 == 0 and outputs.shape[1] > 0
        outputs = never_waits(lambda: torch.cat([slots.push(features, lengths), slots.flush()], 1))
    assert torch.isfinite(outputs).all()


@pytest.mark.parametrize("mask_mode", ["hard", "phi4mm_compat"])
def test_phi4mm_forward_never_waits_for_the_gpu(never_waits, tiny_phi4mm, mask_mode):
    encoder = tiny_phi4mm().to("cuda")
    features = torch.randn(3, 97, 80)
    with torch.no_grad():
        encoder(features, [97, 50, 3], chunk_size=3, left_chunk=1, mask_mode=mask_mode)  # warm up
        outputs, _ = never_waits(
            lambda: encoder(features, [97, 50, 3], chunk_size=3, left_chunk=1, mask_mode=mask_mode)
        )
    assert torch.isfinite(outputs).all()


def test_qwen3_asr_forward_and_stream_never_wait_for_the_gpu(never_waits, tiny_qwen3_asr):
    encoder = tiny_qwen3_asr().to("cuda")
    features = torch.randn(2, 128, 900)
    with torch.no_grad():
        encoder(features, [900, 450])  # warm up
        never_waits(lambda: encoder(features, [900, 450]))
        slots = Qwen3ASRSlots(encoder, batch_size=2)
        for _ in range(2):
            never_waits(lambda: slots.push(features[:, :, :450], [450, 300]))
        never_waits(lambda: (slots.partial(), slots.flush()))


def test_qwen3_asr_slot_steps_and_resets_never_wait_for_the_gpu(never_waits, tiny_qwen3_asr):
    """A driver's calls: a slot joins, its window closes alone (the others' stay open), a slot is reset."""
    encoder = tiny_qwen3_asr().to("cuda")
    slots = Qwen3ASRSlots(encoder, batch_size=3)
    chunk = torch.randn(slots.chunk_shape)  # host features, as the front end makes them
    valid = np.full(3, slots.chunk_frames)
    first_only = np.array([True, False, False])
    chunks_per_window = encoder.config.chunks_per_window
    with torch.no_grad():
        for call in (lambda work: work(), never_waits):  # warm up, then the same calls behind queued work
            call(lambda: slots.reset_slots([0, 1, 2]))
            call(lambda: slots.step(chunk, valid * first_only, active=first_only))  # slot 0 one chunk ahead
            for _ in range(chunks_per_window - 2):
                call(lambda: slots.step(chunk, valid))
            outputs, lengths = call(lambda: slots.step(chunk, valid))  # slot 0's window closes alone
            assert lengths.tolist() == [encoder.config.window_tokens, 0, 0]
            call(lambda: slots.reset_slots([1]))
    assert torch.isfinite(outputs).all() and not outputs[1:].any()


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graphs"])
def test_phi4mm_slot_steps_and_resets_never_wait_for_the_gpu(never_waits, tiny_phi4mm, cuda_graph):
    """A driver's calls: a slot held out of a step, a slot reset while the others go on."""
    encoder = tiny_phi4mm().to("cuda")
    slots = Phi4MMSlots(encoder, batch_size=3, chunk_size=2, left_chunk=2, cuda_graph=cuda_graph)
    chunk = torch.randn(slots.chunk_shape)
    valid = np.full(3, slots.chunk_frames)
    stepping = np.array([True, False, True])  # slot 1 held out
    with torch.no_grad():
        for call in (lambda work: work(), never_waits):
            call(lambda: slots.reset_slots([0, 1, 2]))
            for _ in range(3):
                call(lambda: slots.step(chunk, valid))
            call(lambda: slots.step(chunk, valid * stepping, active=stepping))
            call(lambda: slots.reset_slots([1]))
            outputs, _ = call(lambda: slots.step(chunk, valid))
    assert torch.isfinite(outputs).all()


@pytest.mark.parametrize("mask_mode", ["hard", "phi4mm_compat"])
def test_phi4mm_lengths_on_the_gpu_equal_host_lengths_and_never_wait(never_waits, tiny_phi4mm, mask_mode):
    """Lengths already on the GPU: the masks are built there, nothing is read back, the outputs are the same."""
    encoder = tiny_phi4mm().to("cuda")
    features = torch.randn(3, 97, 80)
    lengths = [97, 50, 3]
    settings = {"chunk_size": 3, "left_chunk": 1, "mask_mode": mask_mode}
    on_device = torch.tensor(lengths, device="cuda")
    with torch.no_grad():
        reference, reference_lengths = encoder(features, lengths, **settings)
        encoder(features, on_device, **settings)  # warm up
        outputs, output_lengths = never_waits(lambda: encoder(features, on_device, **settings))
    torch.testing.assert_close(outputs, reference, rtol=0, atol=TOLERANCE)  # the same masks, built on the GPU
    assert output_lengths.device.type == "cuda" and output_lengths.tolist() == reference_lengths.tolist()


def test_qwen3_asr_lengths_on_the_gpu_equal_host_lengths_and_never_wait(never_waits, tiny_qwen3_asr):
    encoder = tiny_qwen3_asr().to("cuda")
    features = torch.randn(2, 128, 900)
    on_device = torch.tensor([900, 450], device="cuda")
    with torch.no_grad():
        reference, _ = encoder(features, [900, 450])
        encoder(features, on_device)  # warm up
        outputs, output_lengths = never_waits(lambda: encoder(features, on_device))
    torch.testing.assert_close(outputs[:, : reference.shape[1]], reference, rtol=0, atol=TOLERANCE)
    assert output_lengths.tolist() == [117, 59]
