"""audiomask.models.convs: both encoders' channels-last conv stacks, the first conv a product of its patches, equal
the NCHW modules. Float32: the same sums in another order, 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from audiomask.models import convs, fused

TOLERANCE = 1e-5  # float32, the same sums in another order
PHI_MEL = 80


@pytest.mark.parametrize(("height", "width", "kernel", "stride"), [(128, 100, 3, 2), (9, 6, 3, 2), (7, 80, 3, 1)])
def test_patch_conv_equals_conv(height, width, kernel, stride):
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 24, kernel, stride=stride, padding=1)
    inputs = torch.randn(3, 1, height, width)
    with torch.no_grad():
        reference = conv(inputs)
        out = convs.patch_conv(conv, inputs)
        assert out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out, reference, rtol=0, atol=TOLERANCE)
        with fused.reference_ops():
            torch.testing.assert_close(convs.patch_conv(conv, inputs), out, rtol=0, atol=TOLERANCE)


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


def test_derived_keeps_one_entry_per_name(tiny_phi4mm):
    """A pointwise conv's channels-last weight and the bias folded into it from the depthwise conv before it are
    both kept on it: a second forward builds neither again."""
    subsampling = tiny_phi4mm().embed
    pointwise = subsampling.conv[3]
    features = torch.randn(2, 16, PHI_MEL, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        subsampling(features, exact=True)
        first = {name: entry[1] for name, entry in pointwise.__dict__["_derived_cache"].items()}
        subsampling(features, exact=True)
        again = {name: entry[1] for name, entry in pointwise.__dict__["_derived_cache"].items()}
    assert sorted(first) == ["", "folded bias"]
    assert all(again[name] is first[name] for name in first)


def test_qwen3_asr_embed_chunks_equal_the_nchw_stack(tiny_qwen3_asr, randomize):
    encoder = randomize(tiny_qwen3_asr())
    chunks = torch.randn(5, 128, 100, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden = chunks.unsqueeze(1)
        for conv in (encoder.conv2d1, encoder.conv2d2, encoder.conv2d3):
            hidden = F.gelu(conv(hidden))  # NCHW modules
        count, channels, bins, steps = hidden.shape
        reference = encoder.conv_out(hidden.permute(0, 3, 1, 2).reshape(count, steps, channels * bins))
        reference = reference + encoder.positional_embedding[:steps]
        outputs = encoder.embed_chunks(chunks)
    torch.testing.assert_close(outputs, reference, rtol=0, atol=TOLERANCE * reference.abs().max().item())


@pytest.mark.parametrize("nemo_activation", ["relu", "swish"])  # a conv takes the ReLU; the SiLU runs as a module
def test_phi4mm_subsampling_chunk_by_chunk_equals_the_nchw_stack_whole(tiny_phi4mm, nemo_activation):
    """Chunk by chunk with the per-stage caches (the first conv's patches read the cached step as their top row)
    equals the NCHW modules over the whole utterance; the whole-utterance path equals them too; with frames
    beyond an utterance, each stage's outputs beyond it are zero as the NCHW modules zeroed stage by stage give."""
    subsampling = tiny_phi4mm(nemo_activation=nemo_activation, nemo_conv_channels=16).embed  # 4: dead last ReLUs
    chunk, chunks = 16, 5
    features = torch.randn(3, chunk * chunks, PHI_MEL, generator=torch.Generator().manual_seed(4))
    caches = [
        torch.zeros(3, conv.in_channels, 1, bins) for conv, bins in zip(subsampling.strided_convs(), (80, 40, 20))
    ]
    with torch.no_grad():
        reference = subsampling._tokens(subsampling.conv(features.unsqueeze(1)))  # NCHW modules, zero padding
        whole = subsampling(features)
        streamed = torch.cat(
            [subsampling(features[:, i * chunk : (i + 1) * chunk], caches=caches, exact=True) for i in range(chunks)],
            dim=1,
        )
    scale = reference.abs().max().item()
    torch.testing.assert_close(whole, reference, rtol=0, atol=TOLERANCE * scale)
    torch.testing.assert_close(streamed, reference, rtol=0, atol=TOLERANCE * scale)

    frame_valid = torch.arange(chunk * chunks)[None, :] < torch.tensor([[80], [69], [35]])
    with torch.no_grad():
        masked = subsampling(features, frame_valid)
        hidden, stride = (features * frame_valid[:, :, None]).unsqueeze(1), 1
        for module in subsampling.conv:  # NCHW modules, each stage's outputs zeroed beyond the utterance
            hidden = module(hidden)
            if isinstance(module, nn.Conv2d):
                stride *= module.stride[0]
            else:
                hidden = hidden * frame_valid[:, None, ::stride, None]
        zeroed = subsampling._tokens(hidden)
    torch.testing.assert_close(masked, zeroed, rtol=0, atol=TOLERANCE * zeroed.abs().max().item())


def test_phi4mm_subsampling_trains_as_the_nchw_stack(tiny_phi4mm):
    """With autograd on (the recipe's training) the gradients reach every conv as through the NCHW modules."""
    subsampling = tiny_phi4mm().embed
    features = torch.randn(2, 48, PHI_MEL, generator=torch.Generator().manual_seed(7))
    gradients = []
    for run in (lambda: subsampling(features), lambda: subsampling._tokens(subsampling.conv(features.unsqueeze(1)))):
        subsampling.zero_grad()
        run().square().sum().backward()
        gradients.append([conv.weight.grad.clone() for conv in subsampling.conv if isinstance(conv, nn.Conv2d)])
    for ours, reference in zip(*gradients, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5 * reference.abs().max().item())
