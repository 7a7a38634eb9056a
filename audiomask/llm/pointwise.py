"""The decoder layer's elementwise work in Triton kernels on GPUs: RMSNorm, query/key norm with rotary
positions, and the MLP's SiLU gate (:func:`audiomask.models.fused.silu_gate`, shared with the audio Conformer).

Written as PyTorch ops, a layer of :class:`~audiomask.llm.lm.CausalLM`
launches some 56 kernels, of which only 7 are matrix products or attention:
each RMSNorm is 8 (float32 copy, square, mean, add, rsqrt, multiply, cast back,
weight), the query and key heads' norm and rotation 14 each, the gate 2. A
decode step of a few rows is bound by those launches, not by the bytes it
reads (28 layers: ~1,600 kernels, ~5 ms on the H200 however few the rows),
and every one of them is a pass over the prefill's activations. Here each is
one kernel that reads its input once, computing in float32 and rounding to
the model's dtype where the PyTorch ops round (the norm's output before the
weight, each product of the rotation, the SiLU before the gate's product), so
the results are those ops' up to the order of the norm's sum.

The kernels run where :func:`fuses` (a CUDA device with Triton importable);
elsewhere the layer runs its PyTorch ops (the CPU's reference path).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch wheels come without Triton
    triton = None

__all__ = ["fuses", "norm_rotate", "rms_norm"]


def fuses(device: torch.device) -> bool:
    """Whether the kernels run on ``device`` (a CUDA device with Triton importable)."""
    return triton is not None and device.type == "cuda"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm of each row of ``x`` ``(..., D)`` (last dim contiguous): ``weight * (x / rms(x))``,
    the normalised row rounded to ``x``'s dtype before the weight ``(D,)``; returns ``x``'s shape and dtype."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(rows)
    size = rows.shape[1]
    block = triton.next_power_of_2(size)
    _rms_norm[(rows.shape[0],)](rows, weight, out, rows.stride(0), size, eps, BLOCK=block, num_warps=_warps(block))
    return out.view(x.shape)


def norm_rotate(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Rotary positions on the heads of ``x`` ``(N, heads, head_dim)`` (each head's dims contiguous), each head
    RMS-normalised first with ``weight`` ``(head_dim,)`` unless ``weight`` is ``None``.

    ``cos``, ``sin``: ``(N, rotary)`` in ``x``'s dtype, ``rotary`` even and at most ``head_dim``: the first
    ``rotary`` dims of each head turn (``x * cos + turned * sin``, turned = the second half negated, then the
    first), the rest pass. Returns a contiguous ``(N, heads, head_dim)`` in ``x``'s dtype.
    """
    total, heads, head_dim = x.shape
    rotary = cos.shape[1]
    if x.stride(2) != 1 or cos.stride(1) != 1 or sin.stride() != cos.stride() or rotary % 2 or rotary > head_dim:
        raise ValueError(f"x {tuple(x.shape)} and cos/sin {tuple(cos.shape)}/{tuple(sin.shape)} do not match")
    out = torch.empty((total, heads, head_dim), dtype=x.dtype, device=x.device)
    block_h, block_d = triton.next_power_of_2(heads), triton.next_power_of_2(head_dim)
    _norm_rotate[(total,)](
        x, x if weight is None else weight, cos, sin, out,
        x.stride(0), x.stride(1), cos.stride(0), heads, eps,
        HEAD_DIM=head_dim, ROTARY=rotary, BLOCK_H=block_h, BLOCK_D=block_d, NORM=weight is not None,
        num_warps=_warps(block_h * block_d),
    )  # fmt: skip
    return out


def _warps(elements: int) -> int:
    """Warps for a program over ``elements`` values: one per 256, 1 to 8."""
    return max(1, min(8, elements // 256))


if triton is not None:

    @triton.jit
    def _rms_norm(x, weight, out, stride, size, eps, BLOCK: tl.constexpr):  # noqa: N803
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        real = cols < size
        values = tl.load(x + row * stride + cols, mask=real, other=0.0).to(tl.float32)
        scale = tl.rsqrt(tl.sum(values * values, 0) / size + eps)
        normed = (values * scale).to(out.dtype.element_ty).to(tl.float32)
        w = tl.load(weight + cols, mask=real, other=0.0).to(tl.float32)
        tl.store(out + row * size + cols, (w * normed).to(out.dtype.element_ty), mask=real)

    @triton.jit
    def _norm_rotate(
        x, weight, cos, sin, out,
        stride_n, stride_h, stride_c, heads, eps,
        HEAD_DIM: tl.constexpr, ROTARY: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,  # noqa: N803
        NORM: tl.constexpr,  # noqa: N803
    ):  # fmt: skip
        # One program: every head of one input.
        n = tl.program_id(0)
        head = tl.arange(0, BLOCK_H)[:, None]
        dim = tl.arange(0, BLOCK_D)[None, :]
        real = (head < heads) & (dim < HEAD_DIM)
        turns = dim < ROTARY
        half = ROTARY // 2
        partner = tl.where(dim < half, dim + half, dim - half)  # the dim each rotated dim pairs with
        base = x + n * stride_n + head * stride_h
        values = tl.load(base + dim, mask=real, other=0.0).to(tl.float32)
        partners = tl.load(base + partner, mask=real & turns, other=0.0).to(tl.float32)
        dtype = out.dtype.element_ty
        if NORM:
            scale = tl.rsqrt(tl.sum(values * values, 1) / HEAD_DIM + eps)[:, None]
            w = tl.load(weight + dim, mask=dim < HEAD_DIM, other=0.0).to(tl.float32)
            w_partner = tl.load(weight + partner, mask=turns, other=0.0).to(tl.float32)
            values = (w * (values * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
            partners = (w_partner * (partners * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        c = tl.load(cos + n * stride_c + dim, mask=turns, other=0.0).to(tl.float32)
        s = tl.load(sin + n * stride_c + dim, mask=turns, other=0.0).to(tl.float32)
        turned = tl.where(dim < half, -partners, partners)
        rotated = ((values * c).to(dtype).to(tl.float32) + (turned * s).to(dtype).to(tl.float32)).to(dtype)
        result = tl.where(turns, rotated, values.to(dtype))
        tl.store(out + (n * heads + head) * HEAD_DIM + dim, result, mask=real)
