"""Attention of each row's queries over its own slot of a :class:`~audiomask.llm.cache.KVCache`, in place.

A decode step of ``B`` streams attends each stream's query to the keys of its
own cache slot. With PyTorch's SDPA that needs the slots' keys and values as
one ``(B, kv_heads, span, head_dim)`` batch: a gathered copy of every row
padded to the longest, then (the mask and the grouped-query heads leaving
only the math kernel) a float mask and the key heads repeated per query
head. On the H200 that made a step of 64 streams cost 55 ms and grow with
the batch (0.8 ms a stream) — far above the bytes it has to read.

:func:`slot_attention` is one Triton kernel that reads each row's keys where
they lie (slot, head, position: no copy, no padding past the row's own
length), attends a group of query heads per key head (grouped-query attention
native), masks causally from each row's first position, and keeps the
softmax online in float32 (flash attention's recurrence). Triton comes with
PyTorch's CUDA wheels; where it is missing, or the tensors are on the CPU,
:func:`reads_in_place` is false and the caller runs SDPA over
:meth:`KVCache.read` (the CPU's reference path for the equality tests).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch wheels come without Triton
    triton = None

__all__ = ["reads_in_place", "slot_attention"]

KEY_BLOCK = 64  # keys per inner step
# Query rows (query x head of a group) per program: the fewest tl.dot takes (decode steps), and the prefill's.
QUERY_BLOCKS = (16, 64)


def reads_in_place(device: torch.device) -> bool:
    """Whether :func:`slot_attention` runs on ``device`` (a CUDA device with Triton importable)."""
    return triton is not None and device.type == "cuda"


def slot_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    first: torch.Tensor,
    count: torch.Tensor,
    starts: torch.Tensor,
    longest: int,
) -> torch.Tensor:
    """Causal grouped-query attention of packed ``queries`` over cache slots, without gathering them.

    Args:
        queries: ``(N, heads, head_dim)``, the rows' queries packed row after row: row ``b``'s query ``i``
            (``i < count[b]``) is ``queries[starts[b] + i]``, at position ``first[b] + i``.
        keys, values: one layer's cache ``(slots, kv_heads, capacity, head_dim)``, the rows' own keys
            already written (``heads`` a multiple of ``kv_heads``), same dtype as ``queries``.
        slots, first, count, starts: ``(B,)`` int64 on the same device: each row's slot, first position,
            queries, and first query's index in ``queries``.
        longest: at least ``count.max()`` (a host int: the launch's size, so the counts are never read back).

    Returns:
        ``(N, heads, head_dim)`` in the queries' dtype: query ``i`` of row ``b`` attends keys
        ``0 .. first[b] + i`` of slot ``slots[b]`` with scale ``head_dim ** -0.5``. Float32 inputs are
        multiplied in IEEE float32 (no TF32); the softmax is float32 throughout.
    """
    total, heads, head_dim = queries.shape
    kv_heads = keys.shape[1]
    if heads % kv_heads or keys.shape[3] != head_dim or values.shape != keys.shape:
        raise ValueError(
            f"queries {tuple(queries.shape)} and keys/values {tuple(keys.shape)}/{tuple(values.shape)} do not match"
        )
    queries = queries.contiguous()
    out = torch.empty_like(queries)
    batch, group = len(slots), heads // kv_heads
    block_m = QUERY_BLOCKS[0] if longest * group <= QUERY_BLOCKS[0] else QUERY_BLOCKS[1]
    grid = (batch * kv_heads, triton.cdiv(longest * group, block_m))
    _slot_attention[grid](
        queries, keys, values, out, slots, first, count, starts,
        queries.stride(0), queries.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2),
        head_dim**-0.5,
        KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(max(head_dim, 16)),
        BLOCK_M=block_m, BLOCK_N=KEY_BLOCK,
        PRECISION="ieee" if queries.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _slot_attention(
        queries, keys, values, out, slots, firsts, counts, starts,
        stride_qn, stride_qh,
        stride_ks, stride_kh, stride_kc,
        scale,
        KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,  # noqa: N803
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,  # noqa: N803
    ):  # fmt: skip
        # One program: row b, key head h, BLOCK_M of the row's (query, head of h's group) pairs.
        row = tl.program_id(0) // KV_HEADS
        kv_head = tl.program_id(0) % KV_HEADS
        slot = tl.load(slots + row)
        first = tl.load(firsts + row)
        count = tl.load(counts + row)
        begin = tl.load(starts + row)
        pair = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        query = pair // GROUP
        head = kv_head * GROUP + pair % GROUP
        real = query < count
        dims = tl.arange(0, BLOCK_D)
        in_dims = dims < HEAD_DIM
        q_at = (begin + query)[:, None] * stride_qn + head[:, None] * stride_qh + dims[None, :]
        q = tl.load(queries + q_at, mask=real[:, None] & in_dims[None, :], other=0.0)
        position = first + query
        # Keys this block needs: up to its last real query's position (none when it holds only padding).
        last_query = tl.minimum(count - 1, (tl.program_id(1) * BLOCK_M + BLOCK_M - 1) // GROUP)
        end = tl.where(tl.program_id(1) * BLOCK_M < count * GROUP, first + last_query + 1, 0)
        base = slot * stride_ks + kv_head * stride_kh
        best = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start in range(0, end, BLOCK_N):
            key = start + tl.arange(0, BLOCK_N)
            kv_at = base + key[:, None] * stride_kc + dims[None, :]
            kv_mask = (key < end)[:, None] & in_dims[None, :]
            k = tl.load(keys + kv_at, mask=kv_mask, other=0.0)
            v = tl.load(values + kv_at, mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            scores = tl.where((key[None, :] <= position[:, None]) & real[:, None], scores, float("-inf"))
            top = tl.maximum(best, tl.max(scores, 1))
            shift = tl.where(top == float("-inf"), 0.0, top)  # rows with no key yet: keep exp() finite
            weights = tl.exp(scores - shift[:, None])
            rescale = tl.exp(best - shift)
            total = total * rescale + tl.sum(weights, 1)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            best = top
        result = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        tl.store(out + q_at, result.to(out.dtype.element_ty), mask=real[:, None] & in_dims[None, :])
