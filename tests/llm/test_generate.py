"""The decoder's rows beside others: each one's tokens are its own alone, whatever stops it and whenever."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from audiomask.llm import checkpoint
from audiomask.llm.generate import Decoder

transformers = pytest.importorskip("transformers")

TOKENS = 12  # each reference row's tokens


@pytest.fixture(scope="module")
def lm(tiny_qwen3_asr_dir: Path):
    return checkpoint.load(tiny_qwen3_asr_dir).lm


def alone(lm, inputs: torch.Tensor, count: int) -> list[int]:
    """``count`` greedy tokens after ``inputs``, one eager forward a token, in a cache of its own."""
    cache = lm.new_cache(1, len(inputs) + count)
    logits = lm(inputs[None], [0], np.array([len(inputs)]), cache)
    tokens: list[int] = []
    while len(tokens) < count:
        tokens.append(int(logits.argmax(dim=-1)[0]))
        logits = lm(lm.embed([[tokens[-1]]]), [0], np.ones(1, np.int64), cache)
    return tokens


def test_rows_stopped_by_stop_tokens_or_budgets_beside_others_keep_their_own_tokens_and_slots(lm) -> None:
    """Rows of different lengths ending at a stop token (some at their first token), at their budget, or
    riding along later runs (``finish=False``, stepped by ``extra_steps``): each row's tokens are its tokens
    alone up to its first stop token or its budget; its slot holds its inputs and every token but a budget's
    last (a stop token never stays in it, though a step ran past it)."""
    generator = torch.Generator().manual_seed(5)
    lengths = [3, 7, 5, 9, 4]
    inputs = [lm.embed(torch.randint(0, lm.config.vocab_size, (n,), generator=generator)) for n in lengths]
    references = [alone(lm, row, TOKENS) for row in inputs]
    stop_ids = {references[0][4], references[2][0], references[3][7]}
    budgets = [TOKENS, 6, TOKENS, 10, TOKENS]
    slots = [4, 0, 2, 5, 1]
    expected = []
    for reference, budget in zip(references, budgets, strict=True):
        cut = next((index for index, token in enumerate(reference) if token in stop_ids), len(reference))
        expected.append(reference[: min(cut, budget)])
    assert any(len(tokens) < budget for tokens, budget in zip(expected, budgets, strict=True))  # some stop
    cache = lm.new_cache(6, max(lengths) + TOKENS)
    decoder = Decoder(lm, cache, stop_ids)
    for row, (slot, row_inputs, budget) in enumerate(zip(slots, inputs, budgets, strict=True)):
        decoder.add(row, slot, row_inputs, budget, finish=row < 4)
    done = decoder.run()
    assert set(done) >= {0, 1, 2, 3}
    while 4 not in done:
        done |= decoder.run(extra_steps=3)
    assert not decoder.busy
    assert [done[row] for row in range(5)] == expected
    for row, slot in enumerate(slots):
        stopped = len(expected[row]) < budgets[row]
        held = lengths[row] + len(expected[row]) - (not stopped)
        assert cache.lengths[slot] == held, f"row {row}"
