"""Greedy decoding of many sequences at once, each in its own :class:`~audiomask.llm.cache.KVCache` slot.

Rows never share positions or padding: row ``b`` continues slot ``slots[b]``
from its length, so a sequence decoded beside others gives the tokens it
gives alone (up to the kernels' rounding), and rows join and finish at any
step. Inputs are embeddings (audio embeddings spliced between prompt
tokens), so the same loop serves every recogniser.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch

from audiomask.llm.cache import KVCache
from audiomask.llm.graphs import GraphedDecode
from audiomask.llm.lm import CausalLM
from audiomask.transfer import to_device

__all__ = ["PREFILL_TOKENS", "greedy", "prefill"]

# Most inputs one forward of a prefill takes: its activations grow with them (~2.6 GB of MLP activations for
# the 0.6B's 65,536 bf16 inputs). Rows beyond it go in the next forward; a row longer than it goes alone.
PREFILL_TOKENS = 65536


def prefill(lm: CausalLM, cache: KVCache, slots: Sequence[int], inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Append ``inputs[b]`` ``(n_b, hidden_size)`` (``n_b >= 1``) to slot ``slots[b]``; the next-token logits.

    Consecutive rows of at most :data:`PREFILL_TOKENS` inputs together go through one forward (padded to
    their longest; only real inputs are computed); returns float32 ``(B, vocab_size)``.
    """
    counts = np.array([len(row) for row in inputs], np.int64)
    slots = np.asarray(slots, np.int64)
    logits = []
    for rows in _groups(counts, PREFILL_TOKENS):
        padded = torch.nn.utils.rnn.pad_sequence(
            [inputs[row].to(lm.device, lm.dtype) for row in rows], batch_first=True
        )
        logits.append(lm(padded, slots[rows], counts[rows], cache))
    return logits[0] if len(logits) == 1 else torch.cat(logits)


def _groups(counts: np.ndarray, limit: int) -> list[np.ndarray]:
    """Consecutive runs of row indices whose ``counts`` sum to at most ``limit`` (a longer row alone).

    >>> [group.tolist() for group in _groups(np.array([3, 4, 9, 2, 2]), 8)]
    [[0, 1], [2], [3, 4]]
    """
    groups, start, total = [], 0, 0
    for row, count in enumerate(counts.tolist()):
        if row > start and total + count > limit:
            groups.append(np.arange(start, row))
            start, total = row, 0
        total += count
    groups.append(np.arange(start, len(counts)))
    return groups


def greedy(
    lm: CausalLM,
    cache: KVCache,
    slots: Sequence[int],
    inputs: Sequence[torch.Tensor],
    max_new_tokens: int | Sequence[int],
    stop_ids: Collection[int],
    *,
    stop: bool = True,
    steps: GraphedDecode | None = None,
) -> list[list[int]]:
    """Prefill ``inputs`` (see :func:`prefill`), then decode greedily: each row's new token ids.

    Row ``b`` ends after ``max_new_tokens`` (an int, or one per row) tokens, or at a token of ``stop_ids``
    (not returned, not written to the cache) when ``stop``; ``stop=False`` always decodes ``max_new_tokens``
    (a benchmark of random weights, which never say the end token). Each slot ends holding its inputs and the
    returned tokens (all but the last, whose keys no later step needed). ``steps``: run the one-token steps
    through it (CUDA graphs) instead of eagerly.
    """
    budget = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (len(inputs),)).copy()
    tokens: list[list[int]] = [[] for _ in inputs]
    active = np.flatnonzero(budget > 0)
    if active.size == 0:
        return tokens
    stops = to_device(np.array(sorted(stop_ids), np.int64), lm.device)
    logits = prefill(lm, cache, [slots[row] for row in active], [inputs[row] for row in active])
    slot_ids = np.asarray(slots, np.int64)
    while True:
        best = logits.argmax(dim=-1)
        ended = torch.isin(best, stops) if stop else torch.zeros_like(best, dtype=torch.bool)
        best_host, ended_host = best.cpu().numpy(), ended.cpu().numpy()
        going = []
        for index, row in enumerate(active):
            if ended_host[index]:
                continue
            tokens[row].append(int(best_host[index]))
            if len(tokens[row]) < budget[row]:
                going.append(index)
        if not going:
            return tokens
        keep = to_device(np.array(going, np.int64), lm.device)
        active = active[going]
        if steps is not None:
            logits = steps.step(best[keep], slot_ids[active])
        else:
            logits = lm(lm.embed(best[keep])[:, None], slot_ids[active], np.ones(len(active), np.int64), cache)
