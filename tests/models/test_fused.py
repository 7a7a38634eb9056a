"""audiomask.models.fused: the gated unit, the causal depthwise conv, the patch conv and the bias-activation against
PyTorch's ops (Triton's interpreter on the CPU, compiled on a GPU), and the Phi-4MM Conformer and the Qwen3-ASR conv
stack and Phi-4MM's subsampling with them against themselves without."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from audiomask.models import fused
from audiomask.streaming import Phi4MMSlots
from tests.conftest import assert_within_ulps

# (rows, gated width): Phi-4MM's feed-forward (1,536) and conv module (1,024), a ragged block, a tiny one
GATE_CASES = [(5, 1536), (3, 1024), (4, 1100), (2, 8)]
# (batch, output steps, channels, taps, bias): Phi-4MM's conv module (16 tokens a chunk, 1,024 channels, 3 taps),
# ragged tiles
DEPTHWISE_CASES = [(2, 16, 1024, 3, True), (3, 7, 130, 3, False), (1, 33, 5, 4, True)]
# (count, padded plane height, width, channels, kernel, stride): Qwen3-ASR's first conv (a 1 s chunk of 128 mel
# bins, 480 channels), ragged tiles, a stride-1 conv
PATCH_CASES = [(2, 130, 102, 480, 3, 2), (3, 11, 9, 70, 3, 2), (1, 5, 21, 17, 3, 1)]
# (N, C, H, W): Qwen3-ASR's second conv's output, ragged
BIAS_CASES = [(2, 480, 32, 25), (3, 70, 5, 3), (1, 17, 2, 9)]
# (N, H, T, S, d): Phi-4MM's step at 1.28 s chunks (16 queries a head over 80 keys of 64 dims), ragged tiles,
# the tiny model's (2 queries over 4 keys of 8 dims)
ATTENTION_CASES = [(3, 16, 16, 64, 64), (2, 3, 5, 37, 24), (1, 2, 3, 0, 8), (2, 2, 2, 4, 8)]  # (N, H, T, S, d)
ATTENTION_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # of the largest output, against float32's
SMALL = 2  # the interpreter's cases: the last ones of each list
OPS = {None: lambda x: x, "gelu": F.gelu, "relu": F.relu}  # PyTorch's op of each name the kernels take


def check(device: str, dtype: torch.dtype, ulps: float, small: bool = False) -> None:
    """Both kernels on ``device`` within ``ulps`` units of ``dtype``'s last place of PyTorch's ops on the CPU:
    the gate as the ops round it, the depthwise conv from its float32 sum rounded once."""
    generator = torch.Generator().manual_seed(0)

    def close(got: torch.Tensor, want: torch.Tensor, what: object) -> None:
        assert_within_ulps(got, want, ulps, what)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    for rows, size in GATE_CASES[-SMALL:] if small else GATE_CASES:
        x = randn(rows, 2 * size) * 4
        first, second = x.chunk(2, dim=-1)
        close(fused.silu_gate(x.to(device), gate_first=True), F.silu(first) * second, ("gate first", size))
        close(fused.silu_gate(x.to(device), gate_first=False), first * F.silu(second), ("gate second", size))
    for batch, steps, channels, taps, with_bias in DEPTHWISE_CASES[-SMALL:] if small else DEPTHWISE_CASES:
        joined, weight = randn(batch, steps + taps - 1, channels), randn(channels, taps)
        bias = randn(channels) if with_bias else None
        want = F.conv1d(joined.float().transpose(1, 2), weight.float()[:, None], None if bias is None else bias.float(),
                        groups=channels).transpose(1, 2).to(dtype)  # fmt: skip
        got = fused.causal_depthwise(joined.to(device), weight.to(device), None if bias is None else bias.to(device))
        close(got, want, ("depthwise", channels, taps))
    for count, height, width, channels, kernel, stride in PATCH_CASES[-SMALL:] if small else PATCH_CASES:
        plane, weight, bias = randn(count, height, width), randn(channels, 1, kernel, kernel), randn(channels)
        rows = torch.cat([weight.reshape(channels, -1), bias[:, None]], dim=1)  # taps, bias; zeros to 16 columns
        patch_weight = F.pad(rows, (0, -rows.shape[1] % 16)).t().contiguous()
        conv = F.conv2d(plane[:, None].float(), weight.float(), bias.float(), stride).permute(0, 2, 3, 1).to(dtype)
        rows = rows_valid(count, conv.shape[1])
        for activation in (None, *fused.ACTIVATIONS):
            for valid in (None, rows):
                got = fused.patch_products(plane.to(device), patch_weight.to(device), (kernel, kernel),
                                           (stride, stride), activation=activation,
                                           valid=None if valid is None else valid.to(device))  # fmt: skip
                want = OPS[activation](conv) * (1 if valid is None else valid[:, :, None, None])
                close(got, want, ("patch", channels, activation, valid is not None))
    for shape in BIAS_CASES[-SMALL:] if small else BIAS_CASES:
        rows = rows_valid(shape[0], shape[2])
        for activation in fused.ACTIVATIONS:
            for valid in (None, rows):
                x, bias = randn(*shape).contiguous(memory_format=torch.channels_last), randn(shape[1])
                want = OPS[activation](x + bias[:, None, None]) * (1 if valid is None else valid[:, None, :, None])
                got = fused.bias_activation_(x.to(device), bias.to(device), activation,
                                             None if valid is None else valid.to(device))  # fmt: skip
                assert got.is_contiguous(memory_format=torch.channels_last)
                close(got, want, ("bias", activation, shape, valid is not None))


def check_attention(device: str, dtype: torch.dtype, small: bool = False) -> None:
    """:func:`fused.chunk_attention` on ``device`` against :func:`attend` in float32 on the CPU of the same
    ``dtype`` inputs, over the ring's keys and values concatenated with the chunk's: queries, keys and values as
    the Phi-4MM step lays them out (views of the q/k/v product and of the cache), a per-row bias with masked keys,
    one query row that may attend none; the ring afterwards read only, or holding the chunk's keys and values."""
    from audiomask.models.attention import attend, split_heads

    generator = torch.Generator().manual_seed(1)
    for count, heads, length, ring, head_dim in ATTENTION_CASES[-SMALL:] if small else ATTENTION_CASES:
        joined = torch.randn(count, length, 3 * heads * head_dim, generator=generator).to(dtype)
        query, keys, values = (split_heads(part, heads) for part in joined.chunk(3, dim=-1))  # (N, H, T, d), strided
        cache = torch.randn(2, count, heads, ring, head_dim, generator=generator).to(dtype)
        bias = torch.randn(count, heads, length, ring + length, generator=generator).to(dtype)
        bias[:, :, :, (ring + length) // 2 :] = torch.finfo(dtype).min  # keys past the utterance
        bias[0, :, -1] = torch.finfo(dtype).min  # a query that may attend none: the average of all values
        every_key, every_value = torch.cat([cache[0], keys], dim=2), torch.cat([cache[1], values], dim=2)
        on_device = [t.to(device) for t in (query, keys, values)]
        tolerance = None
        for row_bias in (bias, bias[-1:]):  # per row; shared by every row (the step's without key masks), broadcast
            want = attend(*(t.float() for t in (query, every_key, every_value, row_bias)))
            tolerance = ATTENTION_TOLERANCE[dtype] * want.abs().max().item()
            written = cache.to(device, copy=True)
            got = fused.chunk_attention(*on_device, written[0], written[1], row_bias.to(device))
            assert got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
            torch.testing.assert_close(got.cpu().float(), want, rtol=0, atol=tolerance)
            torch.testing.assert_close(written.cpu(), cache, rtol=0, atol=0)  # read only
        # The chunk's own keys and values written over the ring's first or last slots after the attention, in
        # the same kernel: the output is the same, the ring afterwards holds them exactly.
        for slot in sorted({0, ring - length}) if ring >= length else ():
            after = cache.clone()
            after[0, :, :, slot : slot + length] = keys
            after[1, :, :, slot : slot + length] = values
            written = cache.to(device, copy=True)
            got = fused.chunk_attention(*on_device, written[0], written[1], bias[-1:].to(device), write_slot=slot)
            torch.testing.assert_close(written.cpu(), after, rtol=0, atol=0)
            torch.testing.assert_close(got.cpu().float(), want, rtol=0, atol=tolerance)


def rows_valid(count: int, rows: int) -> torch.Tensor:
    """``(count, rows)`` bool, a strided view (every other column of a wider mask): row ``n`` valid up to a
    different length each, the last row of the first one invalid."""
    frames = torch.arange(2 * rows)[None, :] < (2 * rows - 2 * torch.arange(count)[:, None] - 1)
    return frames[:, ::2]


def test_kernels_in_tritons_interpreter_equal_the_ops(in_triton_interpreter) -> None:
    in_triton_interpreter(
        "import torch; from tests.models.test_fused import check, check_attention; "
        "check('cpu', torch.float32, 8, small=True); check_attention('cpu', torch.float32, small=True)"
    )


def test_chunk_attention_refuses_what_it_cannot_take() -> None:
    query, ring = torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match="do not fit"):
        fused.chunk_attention(query, query, query, ring, torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="do not fit"):
        fused.chunk_attention(query, torch.zeros(1, 2, 4, 8), query, ring, ring, torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="at most 64 queries and 256 ring keys, got 3, 300"):
        many = torch.zeros(1, 2, 300, 8)
        fused.chunk_attention(query, query, query, many, many, torch.zeros(1, 2, 3, 303))
    with pytest.raises(ValueError, match="write_slot 3: the chunk's 3 keys must fit the ring's 5 slots"):
        fused.chunk_attention(query, query, query, ring, ring, torch.zeros(1, 2, 3, 8), write_slot=3)


def test_phi4mm_stream_with_the_kernels_equals_without(in_triton_interpreter) -> None:
    """The tiny Phi-4MM's streaming steps with the kernels (the interpreter's, fuses forced) equal its PyTorch ops."""
    in_triton_interpreter(
        "import torch; from tests.models.test_fused import stream_with_and_without; stream_with_and_without()"
    )


def test_qwen3_asr_conv_stack_with_the_kernels_equals_without(in_triton_interpreter) -> None:
    """The tiny Qwen3-ASR's conv stack with the kernels (the interpreter's, fuses forced) equals its PyTorch ops."""
    in_triton_interpreter(
        "import torch; from tests.models.test_fused import conv_stack_with_and_without; conv_stack_with_and_without()"
    )


def conv_stack_with_and_without() -> None:
    """:meth:`Qwen3ASREncoder.embed_chunks` with the kernels forced in the interpreter against the PyTorch ops, 1e-5."""
    from audiomask.models import fused as kernels
    from tests.conftest import make_tiny_qwen3_asr

    encoder = make_tiny_qwen3_asr()
    chunks = torch.randn(3, 128, 100, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        reference = encoder.embed_chunks(chunks)
        kernels.fuses = lambda device: True
        tokens = encoder.embed_chunks(chunks)
    torch.testing.assert_close(tokens, reference, rtol=0, atol=1e-5 * reference.abs().max().item())


def test_bias_activation_refuses_a_tensor_not_channels_last_and_an_unknown_activation() -> None:
    with pytest.raises(ValueError, match="channels-last"):
        fused.bias_activation_(torch.zeros(1, 4, 3, 3), torch.zeros(4), "relu")
    x = torch.zeros(1, 4, 3, 3).contiguous(memory_format=torch.channels_last)
    for activation in (None, "silu"):
        with pytest.raises(ValueError, match=rf"activation must be one of \('gelu', 'relu'\), got {activation!r}"):
            fused.bias_activation_(x, torch.zeros(4), activation)
    with pytest.raises(ValueError, match=r"activation must be None or one of \('gelu', 'relu'\), got 'silu'"):
        fused.patch_products(torch.zeros(1, 5, 5), torch.zeros(16, 4), (3, 3), (2, 2), activation="silu")


def _stream(encoder: torch.nn.Module, features: torch.Tensor, chunks: int) -> torch.Tensor:
    """``chunks`` chunk steps of a Phi4MMSlots (2-token chunks, one left chunk) over ``features``: the outputs
    joined. In the last step the second stream's chunk is its last, 5 frames short (the subsampling's zeroing
    beyond it runs)."""
    slots = Phi4MMSlots(encoder, batch_size=features.shape[0], chunk_size=2, left_chunk=1)
    size = slots.chunk_frames
    full, ragged = np.full(features.shape[0], size), np.full(features.shape[0], size)
    ragged[1] -= 5
    with torch.no_grad():
        steps = [
            slots.step(features[:, i * size : (i + 1) * size], ragged if i == chunks - 1 else full)[0]
            for i in range(chunks)
        ]
    return torch.cat(steps, dim=1)


def stream_with_and_without() -> None:
    """The kernels forced in the interpreter against the PyTorch ops, 1e-5."""
    from audiomask.models import fused as kernels
    from tests.conftest import make_tiny_phi4mm

    encoder = make_tiny_phi4mm(nemo_conv_channels=16)  # with 4, every ReLU of the last stage's last row is 0 here
    features = torch.randn(2, 16 * 3, 80, generator=torch.Generator().manual_seed(6))
    reference = _stream(encoder, features, 3)
    kernels.fuses = lambda device: True
    outputs = _stream(encoder, features, 3)
    torch.testing.assert_close(outputs, reference, rtol=0, atol=1e-5 * reference.abs().max().item())


def test_kernels_run_on_cuda_without_autograd_only() -> None:
    """They have no backward: with autograd on (training) the modules run their PyTorch ops."""
    cuda = torch.device("cuda")
    with torch.no_grad():
        assert fused.fuses(cuda) == (fused.triton is not None)
        assert not fused.fuses(torch.device("cpu"))
    assert not fused.fuses(cuda)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "ulps"), [(torch.float32, 8), (torch.bfloat16, 1)])
def test_kernels_on_cuda_equal_the_ops(dtype: torch.dtype, ulps: float) -> None:
    with torch.no_grad():  # the modules call them so
        assert fused.fuses(torch.device("cuda"))
        check("cuda", dtype, ulps)
        check_attention("cuda", dtype)


def test_reference_ops_run_the_plain_ops(tiny_qwen3_asr, randomize) -> None:
    """Within reference_ops no kernel runs and the first conv is a convolution: the same tokens to 1e-5."""
    encoder = randomize(tiny_qwen3_asr())
    chunks = torch.randn(3, 128, 100, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        default = encoder.embed_chunks(chunks)
        with fused.reference_ops():
            assert fused.reference() and not fused.fuses(torch.device("cuda"))
            reference = encoder.embed_chunks(chunks)
        assert not fused.reference()
    assert reference.is_contiguous() and default.shape == reference.shape
    torch.testing.assert_close(default, reference, rtol=0, atol=1e-5 * reference.abs().max().item())
