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


@pytest.mark.parametrize("ahead_steps", [0, 1, 3, 8])
def test_rows_stopped_by_stop_tokens_or_budgets_beside_others_keep_their_own_tokens_and_slots(
    lm, ahead_steps: int
) -> None:
    """Rows of different lengths ending at a stop token (one at its first token), at their budget, or riding
    along later runs (``finish=False``: stepped by ``extra_steps``, and by the steps each run launches ahead
    of the next): each row's tokens are its tokens alone up to its first stop token or its budget; its slot
    holds its inputs and every token but a budget's last (a stop token never stays in it, though steps ran
    past it)."""
    generator = torch.Generator().manual_seed(5)
    lengths = [3, 7, 5, 9, 4, 6]
    inputs = [lm.embed(torch.randint(0, lm.config.vocab_size, (n,), generator=generator)) for n in lengths]
    references = [alone(lm, row, TOKENS) for row in inputs]
    stop_ids = {references[0][1], references[2][0], references[3][5], references[4][3]}
    budgets = [3, 2, 4, TOKENS, 9, 7]  # rows 0-2 finish in the first run; 3-5 ride along
    slots = [4, 0, 2, 5, 1, 6]
    expected = []
    for reference, budget in zip(references, budgets, strict=True):
        cut = next((index for index, token in enumerate(reference) if token in stop_ids), len(reference))
        expected.append(reference[: min(cut, budget)])
    assert any(len(tokens) < budget for tokens, budget in zip(expected[3:], budgets[3:], strict=True))  # some stop
    cache = lm.new_cache(7, max(lengths) + TOKENS)
    decoder = Decoder(lm, cache, stop_ids, ahead_steps=ahead_steps)
    for row, (slot, row_inputs, budget) in enumerate(zip(slots, inputs, budgets, strict=True)):
        decoder.add(row, slot, row_inputs, budget, finish=row < 3)
    done = decoder.run()
    assert set(done) >= {0, 1, 2}
    while decoder.busy:
        done |= decoder.run(extra_steps=1)
    assert [done[row] for row in range(len(lengths))] == expected
    for row, slot in enumerate(slots):
        stopped = len(expected[row]) < budgets[row]
        held = lengths[row] + len(expected[row]) - (not stopped)
        assert cache.lengths[slot] == held, f"row {row}"


def test_a_row_discarded_while_steps_run_ahead_never_comes_and_the_others_go_on(lm) -> None:
    """A riding row discarded between runs, its steps launched ahead of the next run: its tokens never come;
    the other riding row's tokens are its own alone."""
    generator = torch.Generator().manual_seed(6)
    inputs = [lm.embed(torch.randint(0, lm.config.vocab_size, (n,), generator=generator)) for n in (5, 8)]
    cache = lm.new_cache(2, 8 + TOKENS)
    decoder = Decoder(lm, cache, (), ahead_steps=4)
    for row, row_inputs in enumerate(inputs):
        decoder.add(row, row, row_inputs, TOKENS, finish=False)
    done = decoder.run(extra_steps=2)
    decoder.discard(0)
    while decoder.busy:
        done |= decoder.run(extra_steps=1)
    assert done == {1: alone(lm, inputs[1], TOKENS)}
