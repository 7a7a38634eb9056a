"""Density of a tensor's memory: the property a non-stalling host->device copy needs."""

from __future__ import annotations

import torch

__all__ = ["is_dense"]


def is_dense(t: torch.Tensor) -> bool:
    """Whether the elements of ``t`` fill one contiguous range of its storage exactly once.

    The order may be permuted: a transpose is dense, an expanded view (stride 0
    over a dimension longer than 1) or a strided slice is not. Dimensions of
    size 1 do not count, whatever their stride; a tensor with 0 or 1 elements
    is dense. A dense tensor can be copied as one block of ``t.nbytes`` bytes;
    a non-dense host tensor makes torch build a hidden pageable copy first,
    which stalls a ``non_blocking`` host->device copy.

    Sparse and other non-strided layouts are not dense.

    >>> x = torch.zeros(4, 6)
    >>> is_dense(x), is_dense(x.t()), is_dense(x[:, ::2]), is_dense(x[:1].expand(4, 6))
    (True, True, False, False)
    >>> is_dense(x[1:3]), is_dense(x[:, :3]), is_dense(x[:0, ::2])
    (True, False, True)
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        return False
    if t.numel() <= 1:
        return True
    # Sorted by stride, a dense layout is a row-major layout of some permutation:
    # each stride equals the product of the sizes of the dimensions below it.
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride(), strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True
