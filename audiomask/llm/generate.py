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

__all__ = ["greedy", "prefill"]


def prefill(lm: CausalLM, cache: KVCache, slots: Sequence[int], inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Append ``inputs[b]`` ``(n_b, hidden_size)`` (``n_b >= 1``) to slot ``slots[b]``; the next-token logits.

    One forward over the rows padded to the longest; returns float32 ``(B, vocab_size)``.
    """
    counts = np.array([len(row) for row in inputs], np.int64)
    padded = torch.nn.utils.rnn.pad_sequence([row.to(lm.device, lm.dtype) for row in inputs], batch_first=True)
    return lm(padded, np.asarray(slots, np.int64), counts, cache)


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
