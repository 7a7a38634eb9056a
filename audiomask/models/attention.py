"""Attention helpers shared by the encoders: mask-convention converters and one attention call.

``audiomask.masks`` builds masks with polarity ``True`` = the query row MAY
attend to the key column. The encoders need other conventions, named in the
converters' names:

- :func:`may_attend_to_additive_bias`: the ``hard`` mask mode. A key that may
  not be attended gets ``finfo(dtype).min``, never ``-inf``: a row with no
  valid key (a padded query, an empty stream) then softmaxes to a uniform
  average of finite values instead of ``0 / 0 = NaN``, on every attention
  kernel, and ``finfo.min`` plus any finite score stays finite.
- :func:`may_attend_to_compat_bias`: the ``phi4mm_compat`` mode. Upstream
  Phi-4MM adds the boolean mask to its float relative bias, so a "masked" key
  is only 1 logit down (``True -> 1.0``, ``False -> 0.0``).

>>> mask = torch.tensor([[True, False]])
>>> may_attend_to_additive_bias(mask, torch.float32)
tensor([[ 0.0000e+00, -3.4028e+38]])
>>> may_attend_to_compat_bias(mask, torch.float32)
tensor([[1., 0.]])
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

__all__ = [
    "MASK_MODES",
    "MaskMode",
    "attend",
    "check_mask_mode",
    "may_attend_to_additive_bias",
    "may_attend_to_compat_bias",
    "split_heads",
]

MaskMode = Literal["hard", "phi4mm_compat"]
MASK_MODES: tuple[str, ...] = ("hard", "phi4mm_compat")


def check_mask_mode(mask_mode: object) -> MaskMode:
    """Return ``mask_mode`` if it is one of :data:`MASK_MODES`, else raise ``ValueError``."""
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode must be one of {MASK_MODES}, got {mask_mode!r}")
    return mask_mode  # type: ignore[return-value]


def may_attend_to_additive_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``True`` (may attend) -> ``0``, ``False`` -> ``finfo(dtype).min``, as ``dtype``; any shape.

    Add the result to the attention logits (or to a relative-position bias)
    to exclude the keys that may not be attended. Rows without any valid key
    give finite outputs (see the module docstring).
    """
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.finfo(dtype).min)


def may_attend_to_compat_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``True`` (may attend) -> ``1``, ``False`` -> ``0``, as ``dtype``: upstream Phi-4MM's ``mask + bias``."""
    return mask.to(dtype)


def split_heads(hidden: torch.Tensor, heads: int) -> torch.Tensor:
    """``(N, T, H * d)`` -> ``(N, H, T, d)`` (a view)."""
    batch, length, dim = hidden.shape
    return hidden.view(batch, length, heads, dim // heads).transpose(1, 2)


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Scaled dot-product attention, ``softmax(q k^T / sqrt(d) + bias) v``, heads first.

    Args:
        query: ``(N, H, T_q, d)``.
        key, value: ``(N, H, T_k, d)``.
        bias: additive float bias broadcastable to ``(N, H, T_q, T_k)`` in the
            query's dtype, or ``None`` for full attention.

    Returns:
        ``(N, T_q, H * d)``, heads merged again.
    """
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=query.shape[-1] ** -0.5)
    batch, heads, length, head_dim = out.shape
    return out.transpose(1, 2).reshape(batch, length, heads * head_dim)
