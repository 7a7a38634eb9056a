"""The encoders' stride-2 conv stacks channels-last, the first conv from its patches.

Both subsampling front ends (Qwen3-ASR's three 3x3 stride-2 conv2d + GELU,
Phi-4MM's NeMo ``dw_striding``) start from one input channel and fan out to
hundreds (480, 1024) at half the frame rate: the first conv's output is the
largest tensor of a step. In the default (NCHW) layout they run poorly three
ways: cuDNN's bfloat16 tensor-core convolutions work in NHWC, so every conv
converts its input and output; a conv from one input channel gets a
non-tensor-core algorithm; and a depthwise conv goes to PyTorch's own CUDA
kernel. The stacks therefore run channels-last on every device (on the CPU,
oneDNN's convolutions are faster so too; docs/benchmarks.md has the figures):

- :func:`patch_conv`: the first conv, each output step from its 3x3 input
  patch, written in ``(N, H', W', C)`` order (the ``(N, C, H', W')`` output in
  channels-last memory) with its bias and activation (GELU, ReLU) applied: one
  Triton kernel, bound by that one write, where
  :func:`~audiomask.models.fused.fuses` (the separate passes of a conv, its
  bias and its activation read and write the largest tensor five times).
  Elsewhere (the CPU, training): one matrix product of the patches,
  ``(steps, 16) @ (16, C)`` (9 taps, a column of ones that carries the bias,
  zeros to 16: aligned rows), then the activation. Under
  :func:`~audiomask.models.fused.reference_ops`: the convolution itself.
- :func:`conv_weight`: the other convs' weights in channels-last memory, made
  once per weight (the input's layout then decides the library's: NHWC in,
  NHWC out).

Same convolutions, different kernels: outputs agree with the NCHW modules to
the kernels' rounding (float32: 1e-6 relative), and a step's shapes, hence its
kernels, do not depend on the other streams.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from audiomask.models import fused
from audiomask.models.layers import derived

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch wheels come without Triton
    triton = None

__all__ = ["ACTIVATIONS", "PATCH_COLUMNS", "conv_weight", "patch_conv"]

PATCH_COLUMNS = 16  # a patch row: 3 x 3 taps, the bias's 1, zeros to a 32-byte bfloat16 row
# The activations patch_conv applies, by name: the kernel's code and the PyTorch op (exact GELU, erf's).
ACTIVATIONS = {"gelu": (1, F.gelu), "relu": (2, torch.relu_)}
BLOCK_STEPS, BLOCK_CHANNELS = 64, 128  # a kernel program's output tile: steps x channels


def _check_patch_conv(conv: nn.Conv2d) -> None:
    taps = conv.kernel_size[0] * conv.kernel_size[1]
    plain = not isinstance(conv.padding, str) and conv.dilation == (1, 1) and conv.groups == 1
    if conv.in_channels != 1 or not plain or taps + 1 > PATCH_COLUMNS or conv.bias is None:
        raise ValueError(
            f"conv must have one input channel, a bias, at most {PATCH_COLUMNS - 1} taps, numeric padding and no "
            f"dilation, got {conv} (bias: {conv.bias is not None})"
        )


def _patch_weight(conv: nn.Conv2d) -> torch.Tensor:
    """``(PATCH_COLUMNS, C)``: the conv's taps in patch order, then its bias, then zeros."""
    _check_patch_conv(conv)

    def build() -> torch.Tensor:
        taps = conv.weight.reshape(conv.out_channels, -1)  # (C, kh * kw), row-major taps as a patch's
        rows = torch.cat([taps, conv.bias[:, None]], dim=1)
        return F.pad(rows, (0, PATCH_COLUMNS - rows.shape[1])).t().contiguous()

    return derived(conv, (conv.weight, conv.bias), build)


def patch_conv(
    conv: nn.Conv2d, inputs: torch.Tensor, top: torch.Tensor | None = None, activation: str | None = None
) -> torch.Tensor:
    """``conv`` (one input channel) of ``inputs`` ``(N, 1, H, W)``, then ``activation`` (a name of
    :data:`ACTIVATIONS`, or ``None``): ``(N, C, H', W')`` in channels-last memory.

    The same values as ``conv(inputs)`` with its zero padding, except that with ``top`` ``(N, 1, rows, W)``
    the ``rows`` input steps above ``inputs`` (the previous chunk's last, for a streaming conv) take the
    place of the top padding (``rows`` = the conv's top padding). Any float dtype; products summed in float32
    for bfloat16 (the kernel: every dtype), rounded once to the dtype where the kernel runs
    (:func:`~audiomask.models.fused.fuses`), after the product and after the activation elsewhere.

    >>> conv = nn.Conv2d(1, 4, 3, stride=2, padding=1)
    >>> x = torch.randn(2, 1, 9, 6)
    >>> out = patch_conv(conv, x, activation="relu")
    >>> out.shape, out.is_contiguous(memory_format=torch.channels_last)
    (torch.Size([2, 4, 5, 3]), True)
    >>> bool(torch.allclose(out, torch.relu(conv(x)), atol=1e-6))
    True
    """
    weight = _patch_weight(conv)
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or None, got {activation!r}")
    (pad_h, pad_w), (kh, kw), (sh, sw) = conv.padding, conv.kernel_size, conv.stride
    count = inputs.shape[0]
    plane = inputs[:, 0]  # (N, H, W)
    if top is None:
        plane = F.pad(plane, (pad_w, pad_w, pad_h, pad_h))
    else:
        if top.shape != (count, 1, pad_h, inputs.shape[3]):
            raise ValueError(f"top must have shape {(count, 1, pad_h, inputs.shape[3])}, got {tuple(top.shape)}")
        plane = F.pad(torch.cat([top[:, 0].to(plane.dtype), plane], dim=1), (pad_w, pad_w, 0, pad_h))
    out_h, out_w = (plane.shape[1] - kh) // sh + 1, (plane.shape[2] - kw) // sw + 1
    if fused.reference():  # the convolution itself
        out = F.conv2d(plane[:, None], conv.weight.to(plane.dtype), conv.bias.to(plane.dtype), conv.stride)
        out = out if activation is None else ACTIVATIONS[activation][1](out)
        return out.contiguous(memory_format=torch.channels_last)
    if fused.fuses(plane.device):
        out = plane.new_empty(count, out_h, out_w, conv.out_channels)
        code = 0 if activation is None else ACTIVATIONS[activation][0]
        _launch(plane.contiguous(), weight.to(plane.dtype), out, (kh, kw), (sh, sw), code)
    else:
        windows = plane.unfold(1, kh, sh).unfold(2, kw, sw)  # (N, H', W', kh, kw): a view
        patches = windows.new_zeros(count, out_h, out_w, PATCH_COLUMNS)
        patches[..., : kh * kw] = windows.reshape(count, out_h, out_w, kh * kw)
        patches[..., kh * kw] = 1.0
        out = (patches.view(-1, PATCH_COLUMNS) @ weight.to(patches.dtype)).view(count, out_h, out_w, conv.out_channels)
        if activation is not None:
            out = ACTIVATIONS[activation][1](out)
    return out.permute(0, 3, 1, 2)


def _launch(
    plane: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    code: int,
) -> None:
    """The Triton kernel over padded planes ``(N, Hp, Wp)`` into ``out`` ``(N, H', W', C)``."""
    count, out_h, out_w, channels = out.shape
    steps = count * out_h * out_w
    grid = (triton.cdiv(steps, BLOCK_STEPS), triton.cdiv(channels, BLOCK_CHANNELS))
    _patch_conv[grid](
        plane, weight, out, steps, out_h, out_w, plane.shape[1], plane.shape[2], channels,
        KH=kernel[0], KW=kernel[1], SH=stride[0], SW=stride[1], ACTIVATION=code,
        BLOCK_M=BLOCK_STEPS, BLOCK_C=BLOCK_CHANNELS, num_warps=4,
    )  # fmt: skip


def conv_weight(conv: nn.Conv2d) -> torch.Tensor:
    """``conv.weight`` in channels-last memory (made once per weight): with a channels-last input, the NHWC
    kernels (cuDNN's, oneDNN's) read it as it is, no conversion per call."""
    return derived(conv, (conv.weight,), lambda: conv.weight.contiguous(memory_format=torch.channels_last))


if triton is not None:

    @triton.jit
    def _patch_conv(
        plane, weight, out, steps, out_h, out_w, plane_h, plane_w, channels,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,  # noqa: N803
        ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,  # noqa: N803
    ):  # fmt: skip
        step = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # output steps (n, h', w'), flattened
        channel = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        real_step, real_channel = step < steps, channel < channels
        image, place = step // (out_h * out_w), step % (out_h * out_w)
        corner = image.to(tl.int64) * plane_h * plane_w + (place // out_w) * SH * plane_w + (place % out_w) * SW
        total = tl.zeros((BLOCK_M, BLOCK_C), tl.float32)
        for row in tl.static_range(KH):
            for column in tl.static_range(KW):
                tap = tl.load(plane + corner + row * plane_w + column, mask=real_step, other=0.0).to(tl.float32)
                taps = tl.load(weight + (row * KW + column) * channels + channel, mask=real_channel, other=0.0)
                total += tap[:, None] * taps.to(tl.float32)[None, :]
        total += tl.load(weight + KH * KW * channels + channel, mask=real_channel, other=0.0).to(tl.float32)[None, :]
        if ACTIVATION == 1:
            total = 0.5 * total * (1.0 + tl.math.erf(total * 0.7071067811865476))
        elif ACTIVATION == 2:
            total = tl.maximum(total, 0.0)
        where = step.to(tl.int64)[:, None] * channels + channel[None, :]
        tl.store(out + where, total.to(out.dtype.element_ty), mask=real_step[:, None] & real_channel[None, :])
