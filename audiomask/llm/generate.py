"""Greedy decoding of many sequences at once, each in its own :class:`~audiomask.llm.cache.KVCache` slot.

Rows never share positions or padding: row ``b`` continues slot ``slots[b]``
from its length, so a sequence decoded beside others gives the tokens it
gives alone (up to the kernels' rounding), and rows join and finish at any
step. Inputs are embeddings (audio embeddings spliced between prompt
tokens), so the same loop serves every recogniser.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from audiomask.llm.cache import KVCache
from audiomask.llm.graphs import GraphedDecode
from audiomask.llm.lm import CausalLM
from audiomask.transfer import to_device, to_host

__all__ = ["AHEAD_STEPS", "PREFILL_TOKENS", "Decoder", "greedy", "prefill"]

# Steps a run launches for the rows still riding along after it, without waiting for them: the device decodes
# those rows while the host does what follows the run (parsing its answers, the next update's front end and
# inputs), time in which it would otherwise idle. Few enough that they are done by the next run
# (docs/defaults.md).
AHEAD_STEPS = 8
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
    budgets = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (len(inputs),))
    decoder = Decoder(lm, cache, stop_ids, stop=stop, steps=steps)
    for row, (slot, row_inputs, budget) in enumerate(zip(slots, inputs, budgets.tolist(), strict=True)):
        decoder.add(row, slot, row_inputs, budget)
    done = decoder.run()
    return [done[row] for row in range(len(inputs))]


@dataclass
class _Row:
    key: Hashable
    slot: int
    budget: int
    finish: bool  # the run that prefills it ends only once it is done
    tokens: list[int] = field(default_factory=list)


class Decoder:
    """Greedy decoding whose rows may outlive a call, each in its own cache slot (as :func:`greedy`).

    :meth:`add` gives a row (its slot, emptied or holding what precedes ``inputs``, and a budget);
    :meth:`run` prefills the rows added since the last run in one prefill, then steps every row in flight
    together until the rows added with ``finish=True`` are done. A row added with ``finish=False`` goes on
    in later runs, riding along their steps: an utterance's final pass decoded beside the updates of the
    streams still talking, rather than in steps of its own. A row's tokens do not depend on when or beside
    which rows it is stepped (up to the kernels' rounding). ``ahead_steps``: steps each run launches for the
    rows still in flight at its end, their tokens read by the next run (:meth:`run`).
    """

    def __init__(
        self,
        lm: CausalLM,
        cache: KVCache,
        stop_ids: Collection[int],
        *,
        stop: bool = True,
        steps: GraphedDecode | None = None,
        ahead_steps: int = AHEAD_STEPS,
    ) -> None:
        self.lm, self.cache, self.stop, self.steps = lm, cache, stop, steps
        self.ahead_steps = ahead_steps
        self._stops = np.array(sorted(stop_ids), np.int64)
        self._added: list[tuple[_Row, torch.Tensor]] = []
        self._rows: list[_Row] = []  # in flight, each with its last chosen token not yet in its slot ...
        self._chosen: torch.Tensor | None = None  # ... those tokens, (len(_rows),) long on the device
        # Steps launched after the last run, their tokens not yet read: (their rows, tokens on the host, copied).
        self._ahead: list[tuple[list[_Row], torch.Tensor, torch.cuda.Event | None]] = []
        self._finished: dict[Hashable, list[int]] = {}  # rows found done outside a run, for the next one

    def add(self, key: Hashable, slot: int, inputs: torch.Tensor, budget: int, *, finish: bool = True) -> None:
        """A row ``key`` (distinct): ``inputs`` ``(n, hidden_size)`` (``n >= 1``) to append to slot ``slot``, then
        at most ``budget`` tokens; ``finish``: the next run ends only once it is done."""
        self._added.append((_Row(key, int(slot), int(budget), finish), inputs))

    @property
    def busy(self) -> bool:
        """Whether rows were added since the last :meth:`run`, or are in flight."""
        return bool(self._added or self._rows or self._ahead)

    def discard(self, key: Hashable) -> None:
        """Forget row ``key`` (added or in flight; its slot keeps what was written): its tokens never come."""
        self._settle()
        self._finished.pop(key, None)
        self._added = [(row, inputs) for row, inputs in self._added if row.key != key]
        keep = [index for index, row in enumerate(self._rows) if row.key != key]
        if len(keep) < len(self._rows):
            self._keep(keep)

    def run(self, extra_steps: int = 0) -> dict[Hashable, list[int]]:
        """Prefill the rows added, then step every row in flight until those added with ``finish=True`` are
        done, then at most ``extra_steps`` more steps; the rows done (``key -> token ids``), in flight no more.
        Then it launches :attr:`ahead_steps` steps of the rows still in flight and returns without waiting for
        them: the next run reads their tokens first.

        Each step is launched before the tokens of the step before it are read (their copy to the host runs
        ahead of it), so the device does not wait for the host's bookkeeping between steps; a row whose token
        was a stop token has been stepped once more by then: that step's token is dropped and its slot cropped
        back to what it holds without it.
        """
        self._settle()
        done, self._finished = self._finished, {}
        added = []
        for row, inputs in self._added:
            if row.budget < 1:
                done[row.key] = []
            else:
                added.append((row, inputs))
        self._added = []
        unread = 0  # rows at the end of _rows whose chosen token is not yet recorded
        if added:
            logits = prefill(self.lm, self.cache, [row.slot for row, _ in added], [inputs for _, inputs in added])
            chosen = logits.argmax(dim=-1)
            self._chosen = chosen if self._chosen is None or not self._rows else torch.cat((self._chosen, chosen))
            self._rows += [row for row, _ in added]
            unread = len(added)
        extra = extra_steps
        while self._rows:
            rows, first = self._rows, len(self._rows) - unread
            host, copied = to_host(self._chosen[first:]) if unread else (torch.zeros(0, dtype=torch.long), None)
            # A row steps again unless the token being read is its budget's last.
            stepping = [index for index, row in enumerate(rows) if len(row.tokens) + (index >= first) < row.budget]
            finishing = any(rows[index].finish for index in stepping)
            stepped = bool(stepping) and (finishing or extra > 0)
            if stepped and not finishing:
                extra -= 1
            chosen = self._step(stepping) if stepped else None
            if copied is not None:
                copied.synchronize()
            ended = {first + offset for offset in self._record(rows[first:], host.numpy(), done)}
            if not stepped:
                if ended:
                    self._keep([index for index in range(len(rows)) if index not in ended])
                break
            going = [position for position, index in enumerate(stepping) if index not in ended]
            for index in stepping:
                if index in ended:  # stopped: the step just launched wrote its stop token
                    self.cache.crop(rows[index].slot, int(self.cache.lengths[rows[index].slot]) - 1)
            self._rows = [rows[stepping[position]] for position in going]
            self._chosen = chosen if len(going) == len(chosen) else self._pick(chosen, going)
            unread = len(self._rows)
        self._launch_ahead()
        return done

    def _launch_ahead(self) -> None:
        """Launch up to :attr:`ahead_steps` steps of the rows in flight (their tokens all read), each row's
        last under its budget, each step's tokens copied to the host behind it (:meth:`_settle` reads them)."""
        for steps in range(self.ahead_steps):
            # A row's tokens once the steps launched are read: len(tokens) + steps (every row took each).
            stepping = [index for index, row in enumerate(self._rows) if len(row.tokens) + steps < row.budget]
            if len(stepping) < len(self._rows):  # the rest end at their budget with the last step's tokens
                self._keep(stepping)
            if not self._rows:
                break
            self._chosen = self._step(list(range(len(self._rows))))
            self._ahead.append((list(self._rows), *to_host(self._chosen)))

    def _settle(self) -> None:
        """Read the steps :meth:`_launch_ahead` launched: their tokens recorded, the rows that ended to
        :attr:`_finished` (and out of flight); a row that said a stop token is cropped back by the steps that
        ran past it (each wrote a position)."""
        if not self._ahead:
            return
        ahead, self._ahead = self._ahead, []
        copied = ahead[-1][2]
        if copied is not None:
            copied.synchronize()  # the copies complete in order: the last one's event covers all
        ended: dict[int, list] = {}  # id(row) -> [the row, positions written past its end]
        for rows, tokens, _ in ahead:
            live = [index for index, row in enumerate(rows) if id(row) not in ended]
            for row in rows:
                if id(row) in ended:  # stopped earlier: this step wrote a position past its end
                    ended[id(row)][1] += 1
            closing = self._record([rows[index] for index in live], tokens.numpy()[live], self._finished)
            ended.update((id(rows[live[offset]]), [rows[live[offset]], 0]) for offset in closing)
        for row, past in ended.values():
            if past:
                self.cache.crop(row.slot, int(self.cache.lengths[row.slot]) - past)
        if ended:
            self._keep([index for index, row in enumerate(self._rows) if id(row) not in ended])

    def _step(self, stepping: list[int]) -> torch.Tensor:
        """Launch one step of rows ``stepping`` (indices into ``_rows``) from their chosen tokens; its tokens."""
        chosen = self._chosen if len(stepping) == len(self._rows) else self._pick(self._chosen, stepping)
        slots = np.array([self._rows[index].slot for index in stepping], np.int64)
        if self.steps is not None:
            logits = self.steps.step(chosen, slots)
        else:
            logits = self.lm(self.lm.embed(chosen)[:, None], slots, np.ones(len(slots), np.int64), self.cache)
        return logits.argmax(dim=-1)

    def _record(self, rows: list[_Row], chosen: np.ndarray, done: dict[Hashable, list[int]]) -> list[int]:
        """Record ``chosen[r]``, the token of ``rows[r]``; the rows that end (a stop token, or their budget's
        last) go to ``done``; their indices in ``rows``."""
        stops = np.isin(chosen, self._stops) if self.stop else np.zeros(len(chosen), bool)
        ended = []
        for index, (row, token, stop) in enumerate(zip(rows, chosen.tolist(), stops.tolist(), strict=True)):
            if not stop:
                row.tokens.append(token)
            if stop or len(row.tokens) >= row.budget:
                done[row.key] = row.tokens
                ended.append(index)
        return ended

    def _pick(self, tokens: torch.Tensor, rows: list[int]) -> torch.Tensor | None:
        """``tokens[rows]`` (``None`` for no rows), indexed on the device."""
        return tokens[to_device(np.array(rows, np.int64), self.lm.device)] if rows else None

    def _keep(self, keep: list[int]) -> None:
        self._rows = [self._rows[index] for index in keep]
        self._chosen = self._pick(self._chosen, keep)
