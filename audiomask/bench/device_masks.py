"""Phi-4MM's hidden-state mask built with torch where the lengths are, on the device: no mask copy.

vLLM's open proposal for Phi-4MM is to build the streaming masks on the GPU
instead of copying them. :func:`hs_mask_torch` is that alternative, made as
fast as torch allows (a few elementwise kernels, no Python loop), so that the
latency benchmark compares it fairly with :func:`audiomask.masks.phi4mm.hs_mask`
built on the host and moved by :mod:`audiomask.transfer`. The lengths must be
on the device already: moving them there is the caller's (measured) cost.
"""

from __future__ import annotations

import torch

from audiomask.checks import check_int
from audiomask.masks.phi4mm import TIME_REDUCTION

__all__ = ["hs_mask_torch"]


def hs_mask_torch(
    feature_lengths: torch.Tensor,
    max_frames: int,
    chunk_size: int,
    left_chunk: int,
    time_reduction: int = TIME_REDUCTION,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`audiomask.masks.phi4mm.hs_mask` on ``feature_lengths``' device: ``(B, L, L)`` bool, True = may attend.

    ``out[b, i, j] = (j // C >= i // C - left_chunk) & (j // C <= i // C) & (j < ceil(len_b / r))``
    with ``C = chunk_size`` (``<= 0``: one chunk, full attention), ``r = time_reduction``
    and ``L = ceil(max_frames / r)``. Nothing is read back to the host, so the
    call only enqueues kernels; lengths above ``max_frames`` are not checked
    (that would need their values on the host).

    Args:
        feature_lengths: ``(B,)`` integer tensor of feature frames per utterance, on the target device.
        max_frames: padded feature length ``T`` in frames, ``>= 0``.
        chunk_size: tokens per chunk; ``<= 0`` = full attention.
        left_chunk: chunks of left context, ``>= 0``.
        time_reduction: feature frames per token, ``>= 1``.
        out: optional ``(B, L, L)`` bool tensor on the same device to write into.

    >>> hs_mask_torch(torch.tensor([40, 17]), 40, chunk_size=2, left_chunk=1)[1].int()
    tensor([[1, 1, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 0, 1, 0, 0]], dtype=torch.int32)
    """
    if (
        not isinstance(feature_lengths, torch.Tensor)
        or feature_lengths.ndim != 1
        or feature_lengths.is_floating_point()
    ):
        shown = tuple(feature_lengths.shape) if isinstance(feature_lengths, torch.Tensor) else type(feature_lengths)
        raise ValueError(f"feature_lengths must be a 1-D integer tensor, got {shown}")
    max_frames = check_int("max_frames", max_frames, minimum=0)
    chunk_size = check_int("chunk_size", chunk_size)
    left_chunk = check_int("left_chunk", left_chunk, minimum=0)
    time_reduction = check_int("time_reduction", time_reduction, minimum=1)
    device, batch = feature_lengths.device, feature_lengths.shape[0]
    seq_len = -(-max_frames // time_reduction)
    if out is not None and (out.shape != (batch, seq_len, seq_len) or out.dtype != torch.bool or out.device != device):
        raise ValueError(
            f"out must be a bool tensor of shape {(batch, seq_len, seq_len)} on {device}, "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    tokens = torch.arange(seq_len, device=device)
    chunk = tokens // chunk_size if chunk_size > 0 else torch.zeros_like(tokens)
    behind = chunk[:, None] - chunk[None, :]  # (L_q, L_k): chunks from the key's back to the query's
    band = (behind >= 0) & (behind <= left_chunk)
    key_valid = (
        tokens < torch.div(feature_lengths + (time_reduction - 1), time_reduction, rounding_mode="floor")[:, None]
    )
    return torch.logical_and(band[None], key_valid[:, None, :], out=out)
