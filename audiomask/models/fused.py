"""Elementwise work of the Conformer block and of the LLM's MLP as Triton kernels on GPUs: the SiLU-gated
linear unit, the causal depthwise conv over time.

As PyTorch ops each is several passes over a step's activations, the largest
tensors of the Phi-4MM block after its matrix products: the gated unit
(``up * silu(gate)``: the SiLU, then the product) runs in both feed-forward
modules (1,536 wide) and in the conv module (1,024), the depthwise conv is
one multiply-add pass per tap (three) over its input. Here each is one kernel
that reads its input once and writes its output once.

- :func:`silu_gate` rounds the SiLU to the dtype before the product, as the
  PyTorch ops do: the same values up to the exponential's last bit.
- :func:`causal_depthwise` sums the taps and the bias in float32 and rounds
  once (the PyTorch ops round after each tap): within the dtype's rounding of
  them.

They run where :func:`fuses` (a CUDA device with Triton importable, autograd off);
elsewhere the modules run their PyTorch ops (the CPU's reference path, and training).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch wheels come without Triton
    triton = None

__all__ = ["causal_depthwise", "fuses", "reference", "reference_ops", "silu_gate"]

GATE_BLOCK = 1024  # gate columns per program
DEPTHWISE_BLOCK_STEPS, DEPTHWISE_BLOCK_CHANNELS = 16, 128  # a depthwise program's output tile: steps x channels


_STATE = threading.local()


@contextlib.contextmanager
def reference_ops() -> Iterator[None]:
    """Within it (this thread), the encoders run their plain PyTorch ops on every device: no kernel of this module,
    and the subsampling's first conv a convolution (:func:`audiomask.models.convs.patch_conv`). Their FLOPs are then
    the model's, whatever the device (``audiomask.bench.limits`` counts them so), and their outputs the reference
    that the kernels are held to."""
    saved = reference()
    _STATE.reference = True
    try:
        yield
    finally:
        _STATE.reference = saved


def reference() -> bool:
    """Whether :func:`reference_ops` is on in this thread."""
    return getattr(_STATE, "reference", False)


def fuses(device: torch.device) -> bool:
    """Whether the kernels run on ``device``: a CUDA device with Triton importable, autograd off (they have no
    backward: training runs the PyTorch ops, whose gradients reach every weight) and :func:`reference_ops` off."""
    return triton is not None and device.type == "cuda" and not torch.is_grad_enabled() and not reference()


def silu_gate(x: torch.Tensor, *, gate_first: bool) -> torch.Tensor:
    """The SiLU-gated unit of ``x`` ``(..., 2 * I)`` (last dim contiguous): ``silu(gate) * up``, the SiLU rounded
    to ``x``'s dtype before the product (as ``F.silu(gate) * up``); ``gate`` the first half with ``gate_first``
    (transformers' Qwen3 and Phi-3 MLPs), else the second (Phi-4MM's audio Conformer). Returns ``(..., I)``."""
    if x.stride(-1) != 1 or x.shape[-1] % 2:
        raise ValueError(f"x must have an even, contiguous last dim, got shape {tuple(x.shape)}, strides {x.stride()}")
    rows = x.reshape(-1, x.shape[-1])
    total, width = rows.shape
    size = width // 2
    out = torch.empty((total, size), dtype=x.dtype, device=x.device)
    grid = (total, triton.cdiv(size, GATE_BLOCK))
    _silu_gate[grid](rows, out, rows.stride(0), size, GATE_FIRST=gate_first, BLOCK=GATE_BLOCK)
    return out.view(*x.shape[:-1], size)


def causal_depthwise(joined: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The depthwise conv over time of ``joined`` ``(B, T + K - 1, D)`` (time-major, last dim contiguous; the
    ``K - 1`` steps before the ``T`` outputs' first included): ``out[b, t, d] = bias[d] + sum_k weight[d, k] *
    joined[b, t + k, d]``, ``weight`` ``(D, K)``, ``bias`` ``(D,)`` or ``None``; summed in float32, rounded once to
    ``joined``'s dtype. Returns a contiguous ``(B, T, D)``."""
    batch, steps_in, channels = joined.shape
    kernel = weight.shape[1]
    if joined.stride(2) != 1 or weight.shape != (channels, kernel) or steps_in < kernel:
        raise ValueError(f"joined {tuple(joined.shape)} and weight {tuple(weight.shape)} do not match")
    steps = steps_in - kernel + 1
    out = torch.empty((batch, steps, channels), dtype=joined.dtype, device=joined.device)
    taps = weight.t().contiguous()  # (K, D): each tap's channels in a row
    grid = (batch, triton.cdiv(steps, DEPTHWISE_BLOCK_STEPS), triton.cdiv(channels, DEPTHWISE_BLOCK_CHANNELS))
    _causal_depthwise[grid](
        joined, taps, taps if bias is None else bias, out,
        joined.stride(0), joined.stride(1), steps, channels,
        KERNEL=kernel, BIAS=bias is not None,
        BLOCK_T=DEPTHWISE_BLOCK_STEPS, BLOCK_D=DEPTHWISE_BLOCK_CHANNELS,
    )  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _silu_gate(x, out, stride, size, GATE_FIRST: tl.constexpr, BLOCK: tl.constexpr):  # noqa: N803
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        real = cols < size
        if GATE_FIRST:
            gate = tl.load(x + row * stride + cols, mask=real, other=0.0).to(tl.float32)
            up = tl.load(x + row * stride + size + cols, mask=real, other=0.0).to(tl.float32)
        else:
            up = tl.load(x + row * stride + cols, mask=real, other=0.0).to(tl.float32)
            gate = tl.load(x + row * stride + size + cols, mask=real, other=0.0).to(tl.float32)
        dtype = out.dtype.element_ty
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        tl.store(out + row * size + cols, (silu * up).to(dtype), mask=real)

    @triton.jit
    def _causal_depthwise(
        joined, taps, bias, out, stride_b, stride_t, steps, channels,
        KERNEL: tl.constexpr, BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,  # noqa: N803
    ):  # fmt: skip
        batch = tl.program_id(0)
        step = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
        channel = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
        real = (step < steps) & (channel < channels)
        base = joined + batch.to(tl.int64) * stride_b + channel
        total = tl.zeros((BLOCK_T, BLOCK_D), tl.float32)
        for tap in tl.static_range(KERNEL):
            w = tl.load(taps + tap * channels + channel, mask=channel < channels, other=0.0).to(tl.float32)
            total += w * tl.load(base + (step + tap) * stride_t, mask=real, other=0.0).to(tl.float32)
        if BIAS:
            total += tl.load(bias + channel, mask=channel < channels, other=0.0).to(tl.float32)
        where = (batch.to(tl.int64) * steps + step) * channels + channel
        tl.store(out + where, total.to(out.dtype.element_ty), mask=real)
