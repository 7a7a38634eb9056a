"""The CTC head: encoder outputs ``(B, T, D)`` -> per-frame log-probabilities ``(B, T, V)`` over a vocabulary."""

from __future__ import annotations

import torch
from torch import nn

from audiomask.checks import check_int

__all__ = ["CTCHead"]


class CTCHead(nn.Module):
    """Linear projection to the vocabulary and log-softmax: ``(B, T, D)`` -> ``(B, T, V)`` float32 log-probs.

    >>> CTCHead(8, 5)(torch.zeros(2, 3, 8)).shape
    torch.Size([2, 3, 5])
    """

    def __init__(self, input_size: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(
            check_int("input_size", input_size, minimum=1), check_int("vocab_size", vocab_size, minimum=2)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # Log-softmax in float32: bf16 log-probabilities would tie argmaxes that differ.
        return torch.log_softmax(self.proj(hidden).float(), dim=-1)
