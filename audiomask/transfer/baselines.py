"""The host->device copies the staging ring replaces, kept as the transfer benchmark's baselines.

:func:`direct_copy` is the unstaged copy (it stalls behind a busy queue when
its source is pageable or not dense) and :func:`pin_per_copy` pins a fresh
copy each time (vLLM's approach: safe, costly on the host). The library
itself never calls them; they live here because every host->device copy of
the project is made in :mod:`audiomask.transfer`.
"""

from __future__ import annotations

import torch

__all__ = ["COPY_METHODS", "direct_copy", "pin_per_copy"]

COPY_METHODS = ("to", "cuda", "copy_")


def direct_copy(t: torch.Tensor, device: object, *, method: str = "to", non_blocking: bool = True) -> torch.Tensor:
    """Copy ``t`` as it is (no staging) to ``device``: the copy that stalls when ``t`` is pageable or not dense.

    ``method`` picks the spelling: ``"to"`` (``Tensor.to``), ``"cuda"``
    (``Tensor.cuda``) or ``"copy_"`` (``empty(...).copy_(t)``). The device is
    taken as given (``"meta"`` included), not resolved.

    The unstaged copy the benchmark measures against the ring (the negative
    control that stalls behind a busy queue); the library never calls it.

    >>> direct_copy(torch.ones(2), "meta", method="copy_").device
    device(type='meta')
    """
    if method == "to":
        return t.to(device, non_blocking=non_blocking)
    if method == "cuda":
        # The caller keeps ``t`` alive until the copy is waited for.
        return t.cuda(torch.device(device), non_blocking=non_blocking)
    if method == "copy_":
        return torch.empty(t.shape, dtype=t.dtype, device=device).copy_(t, non_blocking=non_blocking)
    raise ValueError(f"method must be one of {COPY_METHODS}, got {method!r}")


def pin_per_copy(t: torch.Tensor, device: object) -> torch.Tensor:
    """Pin a fresh copy of ``t`` and copy it ``non_blocking``: the vLLM approach (its host cost: docs/benchmarks.md).

    A baseline the benchmark compares the ring with: safe as a copy (the
    fresh pinned buffer lives until the copy has read it), only slow.
    """
    return t.pin_memory().to(device, non_blocking=True)
