"""The encoders' stride-2 conv stacks channels-last, the first conv from its patches.

Both subsampling front ends (Qwen3-ASR's three 3x3 stride-2 conv2d + GELU,
Phi-4MM's NeMo ``dw_striding``) start from one input channel and fan out to
hundreds (480, 1024) at half the frame rate: the first conv's output is the
largest tensor of a step. In the default (NCHW) layout they run poorly three
ways: cuDNN's bfloat16 tensor-core convolutions work in NHWC, so every conv
converts its input and output; a conv from one input channel gets a
non-tensor-core algorithm; and a depthwise conv goes to PyTorch's own CUDA
kernel. The stacks therefore run channels-last on every device (on the CPU,
oneDNN's convolutions are faster so too; docs/benchmarks.md has the figures),
and the first conv is a matrix product:

- :func:`patch_conv`: the first conv as one matrix product of each output
  step's 3x3 input patch, ``(steps, 16) @ (16, C)`` (9 taps, a column of ones
  that carries the bias, zeros to 16: aligned rows), its ``(N, H', W', C)``
  result the ``(N, C, H', W')`` output in channels-last memory, bias included.
  Where :func:`~audiomask.models.fused.fuses`, one Triton kernel
  (:func:`~audiomask.models.fused.patch_products`) reads each patch from the
  input as it multiplies it, no patch tensor in memory. Under
  :func:`~audiomask.models.fused.reference_ops`: the convolution itself.
- :func:`conv_weight`: the other convs' weights in channels-last memory, made
  once per weight (the input's layout then decides the library's: NHWC in,
  NHWC out).
- A conv followed by its activation (Qwen3-ASR's exact GELUs, Phi-4MM's
  ReLUs): :func:`patch_conv` with ``activation`` and :func:`conv_activation`.
  Where the kernels of :mod:`audiomask.models.fused` run, the activation is
  taken where the output is written (the first conv) or with the bias in one
  pass (the others: the libraries add a conv's bias in a pass of their own).

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

__all__ = ["PATCH_COLUMNS", "activate", "conv_activation", "conv_weight", "patch_conv"]

PATCH_COLUMNS = 16  # a patch row: 3 x 3 taps, the bias's 1, zeros to a 32-byte bfloat16 row


def activate(hidden: torch.Tensor, activation: str | None, valid: torch.Tensor | None = None) -> torch.Tensor:
    """The PyTorch op of ``activation`` (one of :data:`~audiomask.models.fused.ACTIVATIONS`, or ``None``: none)
    on ``hidden`` ``(N, C, H, W)``, then each row ``[n, :, h]`` multiplied by ``valid[n, h]`` (``(N, H)``, bool
    or float; ``None``: none): the values the kernels are held to. Without autograd the ReLU and the product run
    in place (the stacks' outputs are their steps' largest tensors); the exact GELU has no in-place form."""
    in_place = not torch.is_grad_enabled()
    if activation == "relu":
        hidden = F.relu(hidden, inplace=in_place)
    elif activation == "gelu":
        hidden = F.gelu(hidden)
    elif activation is not None:
        raise ValueError(f"activation must be None or one of {fused.ACTIVATIONS}, got {activation!r}")
    if valid is None:
        return hidden
    scale = valid[:, None, :, None]
    return hidden.mul_(scale) if in_place else hidden * scale


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
    conv: nn.Conv2d,
    inputs: torch.Tensor,
    top: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``conv`` (one input channel) of ``inputs`` ``(N, 1, H, W)``: ``(N, C, H', W')`` in channels-last memory.

    The same values as ``conv(inputs)`` with its zero padding, except that with ``top`` ``(N, 1, rows, W)``
    the ``rows`` input steps above ``inputs`` (the previous chunk's last, for a streaming conv) take the
    place of the top padding (``rows`` = the conv's top padding). Any float dtype; products summed as the
    dtype's matrix products sum them (float32 for bfloat16, the bias in the sum), rounded once. With
    ``activation`` and ``valid`` ``(N, H')`` (:func:`activate`'s): those after it (one kernel where
    :func:`audiomask.models.fused.fuses`).

    >>> conv = nn.Conv2d(1, 4, 3, stride=2, padding=1)
    >>> x = torch.randn(2, 1, 9, 6)
    >>> out = patch_conv(conv, x)
    >>> out.shape, out.is_contiguous(memory_format=torch.channels_last)
    (torch.Size([2, 4, 5, 3]), True)
    >>> bool(torch.allclose(out, conv(x), atol=1e-6))
    True
    """
    weight = _patch_weight(conv)
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
        return activate(out.contiguous(memory_format=torch.channels_last), activation, valid)
    if fused.fuses(plane.device):
        out = fused.patch_products(
            plane.contiguous(), weight.to(plane.dtype), (kh, kw), (sh, sw), activation=activation, valid=valid
        )
        return out.permute(0, 3, 1, 2)
    windows = plane.unfold(1, kh, sh).unfold(2, kw, sw)  # (N, H', W', kh, kw): a view
    patches = windows.new_zeros(count, out_h, out_w, PATCH_COLUMNS)
    patches[..., : kh * kw] = windows.reshape(count, out_h, out_w, kh * kw)
    patches[..., kh * kw] = 1.0
    out = (patches.view(-1, PATCH_COLUMNS) @ weight.to(patches.dtype)).view(count, out_h, out_w, conv.out_channels)
    return activate(out.permute(0, 3, 1, 2), activation, valid)


def conv_activation(
    conv: nn.Conv2d,
    inputs: torch.Tensor,
    activation: str | None,
    bias: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``activation(conv(inputs))`` of a channels-last ``inputs`` ``(N, C_in, H, W)``: ``(N, C, H', W')``
    channels-last; ``activation`` and ``valid`` ``(N, H')`` :func:`activate`'s, ``bias`` ``(C,)`` in place of
    ``conv.bias`` (default: it).

    The library's convolution (cuDNN's, oneDNN's) with :func:`conv_weight`;
    where :func:`audiomask.models.fused.fuses`, the bias and the activation in
    one pass after it (:func:`~audiomask.models.fused.bias_activation_`: the
    same values).
    """
    weight, bias = conv_weight(conv), conv.bias if bias is None else bias
    if bias is not None and activation is not None and fused.fuses(inputs.device):
        out = F.conv2d(inputs, weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
        out = out.contiguous(memory_format=torch.channels_last)
        return fused.bias_activation_(out, bias.to(out.dtype), activation, valid)
    out = F.conv2d(inputs, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups)
    return activate(out, activation, valid)


def conv_weight(conv: nn.Conv2d) -> torch.Tensor:
    """``conv.weight`` in channels-last memory (made once per weight): with a channels-last input, the NHWC
    kernels (cuDNN's, oneDNN's) read it as it is, no conversion per call."""
    return derived(conv, (conv.weight,), lambda: conv.weight.contiguous(memory_format=torch.channels_last))
