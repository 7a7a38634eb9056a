"""audiomask.models.convs: the conv stacks' channels-last path (CUDA's) equals the NCHW path, run here on the CPU;
the first conv's Triton kernel equals the conv and its activation (Triton's interpreter on the CPU, compiled on a GPU).

``convs.channels_last`` is set to answer True on the CPU, so both encoders' conv
stacks take the path they take on a GPU: the first conv from its patches (here
their matrix product), the others on channels-last weights. Float32: the same
sums in another order, 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from audiomask.models import convs
from audiomask.streaming import Phi4MMSlots
from tests.conftest import assert_within_ulps

TOLERANCE = 1e-5  # float32, the same sums in another order
PHI_MEL = 80
# (steps, mel bins, channels, top row): ragged tiles (odd sizes, channels past a block of 128), small enough for
# Triton's interpreter; on a GPU also Qwen3-ASR's chunk (128 bins x 100 frames, 480 channels) and Phi-4MM's first
# stage (a 1.28 s chunk's 128 frames x 80 bins, 1024 channels, the cached step on top)
SMALL_CASES = [(9, 7, 5, True), (33, 2, 130, False), (6, 11, 64, True)]
FULL_SIZE_CASES = [(100, 128, 480, False), (128, 80, 1024, True)]


def check_kernel(device: str, dtype: torch.dtype, ulps: float, cases: list = SMALL_CASES) -> None:
    """:func:`convs.patch_conv` with each activation on ``device`` within ``ulps`` units of ``dtype``'s last place of
    the conv and the activation in float32 on the CPU (inputs and weights in ``dtype``) rounded to ``dtype``."""
    generator = torch.Generator().manual_seed(0)
    for steps, bins, channels, with_top in cases:
        conv = nn.Conv2d(1, channels, 3, stride=2, padding=1)
        with torch.no_grad():
            for parameter in conv.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator).to(dtype))
        inputs = torch.randn(3, 1, steps, bins, generator=generator).to(dtype)
        top = torch.randn(3, 1, 1, bins, generator=generator).to(dtype) if with_top else None
        above = top if with_top else torch.zeros(3, 1, 1, bins, dtype=dtype)
        joined = torch.cat([above, inputs, torch.zeros(3, 1, 1, bins, dtype=dtype)], dim=2).float()
        conv_out = F.conv2d(joined, conv.weight.float(), conv.bias.float(), stride=2, padding=(0, 1))
        for activation in (None, *convs.ACTIVATIONS):
            want = conv_out if activation is None else convs.ACTIVATIONS[activation][1](conv_out.clone())
            want = want.to(dtype)
            with torch.no_grad():
                got = convs.patch_conv(
                    conv.to(device), inputs.to(device), None if top is None else top.to(device), activation
                )
            assert_within_ulps(got, want, ulps, (steps, bins, channels, activation))


def test_patch_kernel_in_tritons_interpreter_equals_the_conv(in_triton_interpreter):
    in_triton_interpreter(
        "import torch; from audiomask.models import convs; convs.fuses = lambda device: True; "
        "from tests.models.test_convs import check_kernel; check_kernel('cpu', torch.float32, 16)"
    )


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "ulps"), [(torch.float32, 16), (torch.bfloat16, 1)])
def test_patch_kernel_on_cuda_equals_the_conv(dtype: torch.dtype, ulps: float) -> None:
    assert convs.fuses(torch.device("cuda"))
    check_kernel("cuda", dtype, ulps, SMALL_CASES + FULL_SIZE_CASES)


@pytest.mark.parametrize(("height", "width", "kernel", "stride"), [(128, 100, 3, 2), (9, 6, 3, 2), (7, 80, 3, 1)])
def test_patch_conv_equals_conv(height, width, kernel, stride):
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 24, kernel, stride=stride, padding=1)
    inputs = torch.randn(3, 1, height, width)
    out = convs.patch_conv(conv, inputs)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, conv(inputs), rtol=0, atol=TOLERANCE)


def test_patch_conv_top_rows_replace_the_top_padding():
    """With ``top``, the conv of the row above and the input together, no top padding."""
    torch.manual_seed(1)
    conv = nn.Conv2d(1, 8, 3, stride=2, padding=1)
    inputs, top = torch.randn(2, 1, 10, 12), torch.randn(2, 1, 1, 12)
    reference = torch.nn.functional.conv2d(torch.cat([top, inputs], dim=2), conv.weight, conv.bias, 2, (0, 1))
    torch.testing.assert_close(convs.patch_conv(conv, inputs, top), reference, rtol=0, atol=TOLERANCE)
    with pytest.raises(ValueError, match=r"top must have shape \(2, 1, 1, 12\)"):
        convs.patch_conv(conv, inputs, top[:, :, :, :5])


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(2, 4, 3, 2, 1),
        nn.Conv2d(1, 4, 3, 2, 1, bias=False),
        nn.Conv2d(1, 4, 5, 2, 2),
        nn.Conv2d(1, 4, 3, 2, 1, 2),
    ],
    ids=["two-inputs", "no-bias", "25-taps", "dilated"],
)
def test_patch_conv_refuses_what_it_cannot_compute(conv):
    with pytest.raises(ValueError, match="conv must have one input channel"):
        convs.patch_conv(conv, torch.zeros(1, conv.in_channels, 8, 8))


def test_derived_weights_follow_the_parameters():
    """Made once per weight; an in-place load makes them again."""
    conv = nn.Conv2d(4, 4, 3, 2, 1)
    with torch.no_grad():
        first = convs.conv_weight(conv)
        assert convs.conv_weight(conv) is first
        assert first.is_contiguous(memory_format=torch.channels_last)
        conv.weight.mul_(2.0)
        torch.testing.assert_close(convs.conv_weight(conv), conv.weight, rtol=0, atol=0)


def test_channels_last_is_the_gpu_layout():
    assert convs.channels_last(torch.device("cuda", 0)) and not convs.channels_last(torch.device("cpu"))


def test_qwen3_asr_conv_stack_channels_last_equals_nchw(tiny_qwen3_asr, randomize, monkeypatch):
    encoder = randomize(tiny_qwen3_asr())
    features, lengths = torch.randn(2, 128, 730), [730, 415]
    with torch.no_grad():
        reference, reference_lengths = encoder(features, lengths)
        monkeypatch.setattr(convs, "channels_last", lambda device: True)
        outputs, output_lengths = encoder(features, lengths)
    assert output_lengths.tolist() == reference_lengths.tolist()
    torch.testing.assert_close(outputs, reference, rtol=0, atol=TOLERANCE * reference.abs().max().item())


def _stream(encoder, features: torch.Tensor, chunks: int) -> torch.Tensor:
    slots = Phi4MMSlots(encoder, batch_size=features.shape[0], chunk_size=2, left_chunk=1)
    size = slots.chunk_frames
    valid = np.full(features.shape[0], size)
    with torch.no_grad():
        return torch.cat([slots.step(features[:, i * size : (i + 1) * size], valid)[0] for i in range(chunks)], dim=1)


def test_phi4mm_streaming_subsampling_channels_last_equals_nchw(tiny_phi4mm, monkeypatch):
    """The streaming step's exact subsampling, its per-stage caches read by the patches' top row."""
    encoder = tiny_phi4mm()
    features = torch.randn(3, 16 * 5, PHI_MEL, generator=torch.Generator().manual_seed(4))
    reference = _stream(encoder, features, 5)
    monkeypatch.setattr(convs, "channels_last", lambda device: True)
    outputs = _stream(encoder, features, 5)
    torch.testing.assert_close(outputs, reference, rtol=0, atol=TOLERANCE * reference.abs().max().item())


def test_phi4mm_offline_subsampling_channels_last_equals_nchw(tiny_phi4mm, monkeypatch):
    """The whole-utterance forward (upstream's subsampling: padding takes part) on the same path."""
    encoder = tiny_phi4mm()
    features, lengths = torch.randn(2, 203, PHI_MEL, generator=torch.Generator().manual_seed(5)), [203, 120]
    with torch.no_grad():
        reference, _ = encoder(features, lengths)
        monkeypatch.setattr(convs, "channels_last", lambda device: True)
        outputs, _ = encoder(features, lengths)
    torch.testing.assert_close(outputs, reference, rtol=0, atol=TOLERANCE * reference.abs().max().item())
