"""Memory-bound work of the Conformer block, of the conv stacks and of the LLM's MLP as Triton kernels on GPUs: the
SiLU-gated linear unit, the causal depthwise conv over time, a one-channel conv from its patches with its
activation, a conv's bias with its activation, a streaming chunk's attention over its cached keys.

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

The conv stacks (Qwen3-ASR's three stride-2 convs, each followed by an exact
GELU; Phi-4MM's NeMo stack, each stage ending in a pointwise conv and a ReLU)
write the largest tensors of their steps: the first conv's output is 480 or
1,024 channels at half the frame rate and half the mel bins. As PyTorch ops
the first conv's activation is a pass of its own over it, and each later conv
is the library's convolution, a pass adding its bias (a broadcast over
channels-last memory, slower than a plain add), then the activation's pass.
Here (:data:`ACTIVATIONS`):

- :func:`patch_products` computes the first conv from its input patches
  (as :func:`audiomask.models.convs.patch_conv`'s matrix product) and its
  activation in one kernel: the output is written once, never read back.
- :func:`bias_activation_` adds a conv's bias and takes the activation in one
  pass, in place: the values of the two PyTorch ops (each rounds to the dtype).

Both also take a row mask: Phi-4MM's stack zeroes each stage's outputs beyond
an utterance (a CUDA-graph step always does, an all-ones mask changing
nothing), which as an op is one more pass over the stage's output.

A Phi-4MM streaming step's attention is a chunk's 16 queries a head over 80
keys (its own 16 and its left context's 64, at 1.28 s chunks with 4 left
chunks): each (stream, head) reads its keys and values,
10 kB each in bfloat16, once, and does little else, so the step's attention is
bound by reading the key/value cache. :func:`chunk_attention` is one program a
(stream, head) that reads the cached and the chunk's own keys and values once,
with the additive bias, writes its output with the heads merged (where SDPA's
output needs a copy to merge them), then the chunk's keys and values over the
oldest of the cache: the cache holds the left context only, never the chunk.

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

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_MAX_KEYS",
    "ATTENTION_MAX_QUERIES",
    "bias_activation_",
    "causal_depthwise",
    "chunk_attention",
    "fuses",
    "patch_products",
    "reference",
    "reference_ops",
    "silu_gate",
]

# The activations the conv stacks' kernels take where the output is written, by name: the exact GELU (erf, as
# F.gelu's default) and the ReLU.
ACTIVATIONS = ("gelu", "relu")

GATE_BLOCK = 1024  # gate columns per program
DEPTHWISE_BLOCK_STEPS, DEPTHWISE_BLOCK_CHANNELS = 16, 128  # a depthwise program's output tile: steps x channels
PATCH_BLOCK_POSITIONS, PATCH_BLOCK_CHANNELS, PATCH_WARPS = 64, 64, 4  # a patch program's output tile, its warps
BIAS_BLOCK_ROWS, BIAS_BLOCK_CHANNELS = 16, 128  # a bias-activation program's tile: positions x channels
ATTENTION_MAX_KEYS = 256  # ring keys chunk_attention takes in one tile (a Phi-4MM ring: 64 at 1.28 s chunks, 4 left)
ATTENTION_MAX_QUERIES = 64  # queries a head of chunk_attention takes in one tile (16 a chunk at 1.28 s)
ATTENTION_WARPS = 4


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


def _activation_name(activation: str | None, *, optional: bool) -> str:
    """``activation`` as the kernels' constant ("" for none, where ``optional``)."""
    if activation in ACTIVATIONS or (optional and activation is None):
        return activation or ""
    raise ValueError(f"activation must be {'None or ' * optional}one of {ACTIVATIONS}, got {activation!r}")


def chunk_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    ring_keys: torch.Tensor,
    ring_values: torch.Tensor,
    bias: torch.Tensor,
    *,
    write_slot: int | None = None,
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + bias) v`` of a streaming chunk's queries over its cached keys and its own, heads
    merged.

    ``query``, ``keys`` and ``values`` ``(N, H, T, d)``: the chunk's own; ``ring_keys`` and ``ring_values``
    ``(N, H, S, d)``: the left context's (``S >= 0``); any strides with the last dim contiguous, one float dtype.
    The queries attend to ``S + T`` keys, the ring's then the chunk's: ``bias`` additive, broadcastable to
    ``(N, H, T, S + T)`` in that dtype (a key that may not be attended: ``finfo.min``; a row with none averages
    all, as :func:`audiomask.models.attention.attend` does). ``T <= ATTENTION_MAX_QUERIES``,
    ``S <= ATTENTION_MAX_KEYS``. Scores and softmax in float32; the weights rounded to the dtype for their
    product with the values (float32: IEEE products, no TF32): the values of ``attend`` over the keys and values
    concatenated, to the dtype's rounding. ``write_slot``: after they are read, the chunk's keys and values
    replace the ring's at ``write_slot .. write_slot + T - 1``, in the same program (``None``: the ring is only
    read). Returns ``(N, T, H * d)`` contiguous, as ``attend``.
    """
    count, heads, length, head_dim = query.shape
    ring = ring_keys.shape[2]
    if (
        keys.shape != query.shape
        or values.shape != query.shape
        or ring_keys.shape != (count, heads, ring, head_dim)
        or ring_values.shape != ring_keys.shape
    ):
        raise ValueError(f"query {tuple(query.shape)}, keys {tuple(keys.shape)}, values {tuple(values.shape)}, "
                         f"ring {tuple(ring_keys.shape)} and {tuple(ring_values.shape)} do not fit")  # fmt: skip
    if write_slot is not None and not 0 <= write_slot <= ring - length:
        raise ValueError(f"write_slot {write_slot}: the chunk's {length} keys must fit the ring's {ring} slots")
    if length > ATTENTION_MAX_QUERIES or ring > ATTENTION_MAX_KEYS:
        raise ValueError(f"at most {ATTENTION_MAX_QUERIES} queries and {ATTENTION_MAX_KEYS} ring keys, "
                         f"got {length}, {ring}")  # fmt: skip
    tensors = (query, keys, values, ring_keys, ring_values)
    if any(t.stride(-1) != 1 for t in tensors) or len({t.dtype for t in tensors}) > 1:
        raise ValueError("query, keys and values must have a contiguous last dim and one dtype")
    bias = bias.expand(count, heads, length, ring + length)  # broadcast dims: stride 0
    out = torch.empty((count, length, heads * head_dim), dtype=query.dtype, device=query.device)
    if not out.numel():
        return out
    _chunk_attention[(count, heads)](
        query, keys, values, ring_keys, ring_values, bias, out,
        *query.stride()[:3], *keys.stride()[:3], *values.stride()[:3],
        *ring_keys.stride()[:3], *ring_values.stride()[:3], *bias.stride(),
        0 if write_slot is None else write_slot, heads, length, ring, head_dim, head_dim**-0.5,
        WRITE=write_slot is not None, BLOCK_T=max(16, triton.next_power_of_2(length)),
        BLOCK_S=max(16, triton.next_power_of_2(ring)), BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        IEEE=query.dtype == torch.float32, num_warps=ATTENTION_WARPS,
    )  # fmt: skip
    return out


def _check_valid(valid: torch.Tensor | None, shape: tuple[int, int]) -> None:
    if valid is not None and tuple(valid.shape) != shape:
        raise ValueError(f"valid must have shape {shape} (one value an output row), got {tuple(valid.shape)}")


def patch_products(
    plane: torch.Tensor,
    weight: torch.Tensor,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    *,
    activation: str | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """A one-channel conv from its patches: ``out[n, y, x, c] = sum_k patch[n, y, x, k] * weight[k, c]``.

    ``plane`` ``(N, H, W)`` contiguous, the conv's input with its padding;
    ``weight`` ``(K, C)`` contiguous in ``plane``'s dtype, ``K`` a multiple of
    16 above ``kh * kw``: rows ``0 .. kh * kw - 1`` the taps in row-major order,
    row ``kh * kw`` the bias (its patch column is 1), zeros after. ``kernel``
    ``(kh, kw)``, ``stride`` ``(sh, sw)``: output ``(y, x)`` reads the plane's
    rows ``y * sh ..`` and columns ``x * sw ..``. Summed as the dtype's matrix
    products sum (float32 for bfloat16 and float16; IEEE float32, no TF32,
    for float32), rounded once; with ``activation`` (one of :data:`ACTIVATIONS`)
    that of the rounded sum, rounded again (``F.gelu`` or ``F.relu`` of the
    product). ``valid`` ``(N, H')`` (bool or float, any strides): each output
    row multiplied by its value after that (``out * valid``: 0 zeroes a row
    beyond an utterance). Returns ``(N, H', W', C)`` contiguous,
    ``H' = (H - kh) // sh + 1`` (``W'`` likewise).
    """
    name = _activation_name(activation, optional=True)
    (kh, kw), (sh, sw) = kernel, stride
    count, height, width = plane.shape
    columns, channels = weight.shape
    if not plane.is_contiguous() or not weight.is_contiguous() or weight.dtype != plane.dtype:
        raise ValueError(f"plane and weight must be contiguous and of one dtype, got {plane.dtype}, {weight.dtype}")
    if columns % 16 or columns <= kh * kw or height < kh or width < kw:
        raise ValueError(f"weight {tuple(weight.shape)} and plane {tuple(plane.shape)} do not fit kernel {kernel}")
    out_h, out_w = (height - kh) // sh + 1, (width - kw) // sw + 1
    _check_valid(valid, (count, out_h))
    out = torch.empty((count, out_h, out_w, channels), dtype=plane.dtype, device=plane.device)
    positions = out_h * out_w
    grid = (count, triton.cdiv(positions, PATCH_BLOCK_POSITIONS), triton.cdiv(channels, PATCH_BLOCK_CHANNELS))
    _patch_conv[grid](
        plane, weight, out, height * width, width, out_w, positions, channels,
        out if valid is None else valid, *((0, 0) if valid is None else valid.stride()),
        KH=kh, KW=kw, SH=sh, SW=sw, COLUMNS=columns, ACTIVATION=name, MASKED=valid is not None,
        IEEE=plane.dtype == torch.float32,
        BLOCK_P=PATCH_BLOCK_POSITIONS, BLOCK_C=PATCH_BLOCK_CHANNELS, num_warps=PATCH_WARPS,
    )  # fmt: skip
    return out


def bias_activation_(
    x: torch.Tensor, bias: torch.Tensor, activation: str, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """``x = activation(x + bias)`` in place, ``x`` ``(N, C, H, W)`` in channels-last memory, ``bias`` ``(C,)``,
    ``activation`` one of :data:`ACTIVATIONS`: the sum rounded to ``x``'s dtype, then the activation rounded again
    (the values of ``x.add_(bias[:, None, None])`` then ``F.gelu`` or ``F.relu``, in one pass); with ``valid``
    ``(N, H)`` (bool or float, any strides) each row ``x[n, :, h]`` then multiplied by ``valid[n, h]`` (as
    ``x.mul_(valid[:, None, :, None])``). Returns ``x``."""
    name = _activation_name(activation, optional=False)
    if x.ndim != 4 or not x.is_contiguous(memory_format=torch.channels_last) or bias.shape != (x.shape[1],):
        raise ValueError(f"x must be (N, C, H, W) channels-last with a (C,) bias, got {tuple(x.shape)}, "
                         f"strides {x.stride()}, bias {tuple(bias.shape)}")  # fmt: skip
    count, channels, height, width = x.shape
    _check_valid(valid, (count, height))
    rows = x.numel() // channels  # (N, H, W) positions, each a row of its channels in channels-last memory
    grid = (triton.cdiv(rows, BIAS_BLOCK_ROWS), triton.cdiv(channels, BIAS_BLOCK_CHANNELS))
    _bias_activation[grid](
        x, bias, rows, channels, height, width, x if valid is None else valid,
        *((0, 0) if valid is None else valid.stride()), ACTIVATION=name, MASKED=valid is not None,
        BLOCK_R=BIAS_BLOCK_ROWS, BLOCK_C=BIAS_BLOCK_CHANNELS,
    )  # fmt: skip
    return x


if triton is not None:

    @triton.jit
    def _gelu(value):
        """The exact GELU of float32 ``value``, as PyTorch computes it: ``value / 2 * (1 + erf(value * sqrt(1/2)))``."""
        return value * 0.5 * (1.0 + tl.math.erf(value * 0.7071067811865476))

    @triton.jit
    def _activate(value, ACTIVATION: tl.constexpr):  # noqa: N803
        """``ACTIVATION`` ("gelu", "relu" or "" for none) of float32 ``value``; NaN stays NaN, as in PyTorch."""
        if ACTIVATION == "gelu":
            return _gelu(value)
        elif ACTIVATION == "relu":
            return tl.maximum(value, 0.0, propagate_nan=tl.PropagateNan.ALL)
        else:
            return value

    @triton.jit
    def _patch_conv(
        plane, weight, out, plane_size, width, out_w, positions, channels, valid, valid_stride_n, valid_stride_y,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, COLUMNS: tl.constexpr,  # noqa: N803
        ACTIVATION: tl.constexpr, MASKED: tl.constexpr, IEEE: tl.constexpr,  # noqa: N803
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,  # noqa: N803
    ):  # fmt: skip
        count = tl.program_id(0).to(tl.int64)
        position = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
        channel = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        column = tl.arange(0, COLUMNS)
        row = (position // out_w * SH)[:, None] + (column // KW)[None, :]
        col = (position % out_w * SW)[:, None] + (column % KW)[None, :]
        tap = (position < positions)[:, None] & (column < KH * KW)[None, :]
        values = tl.load(plane + count * plane_size + row * width + col, mask=tap, other=0.0)
        patch = tl.where((column == KH * KW)[None, :], 1.0, values.to(tl.float32)).to(values.dtype)
        real_channel = (channel < channels)[None, :]
        taps = tl.load(weight + column[:, None] * channels + channel[None, :], mask=real_channel, other=0.0)
        if IEEE:
            total = tl.dot(patch, taps, input_precision="ieee")
        else:
            total = tl.dot(patch, taps)
        dtype = out.dtype.element_ty
        result = _activate(total.to(dtype).to(tl.float32), ACTIVATION).to(dtype)
        if MASKED:
            scale = tl.load(valid + count * valid_stride_n + position // out_w * valid_stride_y,
                            mask=position < positions, other=0.0)  # fmt: skip
            result = (result.to(tl.float32) * scale.to(tl.float32)[:, None]).to(dtype)
        where = (count * positions + position[:, None]) * channels + channel[None, :]
        tl.store(out + where, result, mask=(position < positions)[:, None] & real_channel)

    @triton.jit
    def _bias_activation(
        x, bias, rows, channels, height, width, valid, valid_stride_n, valid_stride_y,
        ACTIVATION: tl.constexpr, MASKED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,  # noqa: N803
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        channel = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        real = (row < rows)[:, None] & (channel < channels)[None, :]
        where = row[:, None] * channels + channel[None, :]
        dtype = x.dtype.element_ty
        value = tl.load(x + where, mask=real, other=0.0).to(tl.float32)
        value = value + tl.load(bias + channel, mask=channel < channels, other=0.0).to(tl.float32)[None, :]
        result = _activate(value.to(dtype).to(tl.float32), ACTIVATION).to(dtype)
        if MASKED:
            count, y = row // (height * width), row // width % height
            scale = tl.load(valid + count * valid_stride_n + y * valid_stride_y, mask=row < rows, other=0.0)
            result = (result.to(tl.float32) * scale.to(tl.float32)[:, None]).to(dtype)
        tl.store(x + where, result, mask=real)

    @triton.jit
    def _chunk_attention(
        q, k, v, ring_k, ring_v, bias, out, sq_n, sq_h, sq_t, sk_n, sk_h, sk_t, sv_n, sv_h, sv_t,
        srk_n, srk_h, srk_s, srv_n, srv_h, srv_s, sb_n, sb_h, sb_t, sb_s,
        slot, heads, length, ring, head_dim, scale, WRITE: tl.constexpr,  # noqa: N803
        BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,  # noqa: N803
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        t, s, d = tl.arange(0, BLOCK_T), tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
        real_t, real_s, real_d = t < length, s < ring, d < head_dim
        rows_t, rows_s = real_t[:, None] & real_d[None, :], real_s[:, None] & real_d[None, :]
        query = tl.load(q + row * sq_n + head * sq_h + t[:, None] * sq_t + d[None, :], mask=rows_t, other=0.0)
        own_k = tl.load(k + row * sk_n + head * sk_h + t[:, None] * sk_t + d[None, :], mask=rows_t, other=0.0)
        own_v = tl.load(v + row * sv_n + head * sv_h + t[:, None] * sv_t + d[None, :], mask=rows_t, other=0.0)
        left_k = tl.load(ring_k + row * srk_n + head * srk_h + s[:, None] * srk_s + d[None, :], mask=rows_s,
                         other=0.0)  # fmt: skip
        left_v = tl.load(ring_v + row * srv_n + head * srv_h + s[:, None] * srv_s + d[None, :], mask=rows_s,
                         other=0.0)  # fmt: skip
        if IEEE:
            left = tl.dot(query, tl.trans(left_k), input_precision="ieee")
            own = tl.dot(query, tl.trans(own_k), input_precision="ieee")
        else:
            left, own = tl.dot(query, tl.trans(left_k)), tl.dot(query, tl.trans(own_k))
        at = bias + row * sb_n + head * sb_h + t[:, None] * sb_t
        add = tl.load(at + s[None, :] * sb_s, mask=real_t[:, None] & real_s[None, :], other=0.0)
        left = tl.where(real_s[None, :], left * scale + add.to(tl.float32), float("-inf"))
        add = tl.load(at + (ring + t)[None, :] * sb_s, mask=real_t[:, None] & real_t[None, :], other=0.0)
        own = tl.where(real_t[None, :], own * scale + add.to(tl.float32), float("-inf"))
        top = tl.maximum(tl.max(left, axis=1), tl.max(own, axis=1))[:, None]
        left, own = tl.exp(left - top), tl.exp(own - top)
        total = tl.sum(left, axis=1) + tl.sum(own, axis=1)
        if IEEE:
            mixed = tl.dot(left, left_v, input_precision="ieee") + tl.dot(own, own_v, input_precision="ieee")
        else:
            mixed = tl.dot(left.to(left_v.dtype), left_v) + tl.dot(own.to(own_v.dtype), own_v)
        where = (row * length + t[:, None]) * heads * head_dim + head * head_dim + d[None, :]
        tl.store(out + where, (mixed / total[:, None]).to(out.dtype.element_ty), mask=rows_t)
        if WRITE:  # the chunk's keys and values replace the oldest of the ring, whose reads are done
            tl.debug_barrier()  # every thread's loads of the ring before any thread's stores into it
            at = (slot + t)[:, None]
            tl.store(ring_k + row * srk_n + head * srk_h + at * srk_s + d[None, :], own_k, mask=rows_t)
            tl.store(ring_v + row * srv_n + head * srv_h + at * srv_s + d[None, :], own_v, mask=rows_t)

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
