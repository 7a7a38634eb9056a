"""audiomask.models.convs: the conv stacks' channels-last path (CUDA's) equals the NCHW path, run here on the CPU.

``convs.channels_last`` is set to answer True on the CPU, so both encoders' conv
stacks take the path they take on a GPU: the first conv as a matrix product of
patches, the others on channels-last weights. Float32: the same sums in another
order, 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from audiomask.models import convs
from audiomask.streaming import Phi4MMSlots

TOLERANCE = 1e-5  # float32, the same sums in another order
PHI_MEL = 80


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
