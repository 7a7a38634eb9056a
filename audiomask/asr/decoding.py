"""Greedy CTC decoding to text, with a character tokenizer; works chunk by chunk.

- :class:`CharTokenizer`: characters <-> token ids, id 0 the CTC blank.
- :class:`GreedyCTCDecoder`: best token per frame, repeats merged, blanks
  dropped; it remembers each stream's last frame, so decoding the chunks of
  a stream one by one gives the same tokens as decoding the whole utterance.
- :func:`greedy_decode`: the same for a whole batch at once.

>>> tokenizer = CharTokenizer("ab ")
>>> logits = torch.tensor([[[0, 9, 0, 0], [0, 9, 0, 0], [9, 0, 0, 0], [0, 9, 0, 0], [0, 0, 9, 0]]]).float()
>>> [tokenizer.decode(ids) for ids in greedy_decode(logits)]  # a a _ a b -> "aab"
['aab']
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from audiomask.checks import check_int, check_lengths

__all__ = ["BLANK_ID", "CharTokenizer", "GreedyCTCDecoder", "greedy_decode"]

BLANK_ID = 0  # the CTC blank: emitted between and around characters, never part of the text


class CharTokenizer:
    """One token per character of ``alphabet``, ids ``1 .. len(alphabet)``; id :data:`BLANK_ID` is the blank.

    >>> tokenizer = CharTokenizer("abc ")
    >>> tokenizer.encode("cab a"), tokenizer.vocab_size
    ([3, 1, 2, 4, 1], 5)
    >>> tokenizer.decode([3, 0, 1, 2])  # blanks are skipped
    'cab'
    """

    def __init__(self, alphabet: str) -> None:
        if not isinstance(alphabet, str) or not alphabet:
            raise ValueError(f"alphabet must be a non-empty string, got {alphabet!r}")
        repeated = sorted({char for char in alphabet if alphabet.count(char) > 1})
        if repeated:
            raise ValueError(f"alphabet must not repeat characters, got {alphabet!r} (repeats {''.join(repeated)!r})")
        self.alphabet = alphabet
        self._ids = {char: index + 1 for index, char in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        """Characters plus the blank."""
        return len(self.alphabet) + 1

    def encode(self, text: str) -> list[int]:
        """Token ids of the characters of ``text``; a character outside the alphabet is a ``ValueError``."""
        try:
            return [self._ids[char] for char in text]
        except KeyError as error:
            raise ValueError(
                f"text has a character outside the alphabet {self.alphabet!r}: {error.args[0]!r}"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ids; blanks are skipped."""
        chars = []
        for value in ids:
            index = check_int("ids", value, minimum=0)
            if index >= self.vocab_size:
                raise ValueError(f"ids must be < vocab_size ({self.vocab_size}), got {index}")
            if index != BLANK_ID:
                chars.append(self.alphabet[index - 1])
        return "".join(chars)


class GreedyCTCDecoder:
    """Greedy CTC decoding of ``batch_size`` streams, chunk by chunk.

    Per frame the best token; a token is emitted when it is not the blank
    and differs from the previous frame's best token, which is remembered
    across chunks (so a character spanning a chunk boundary is emitted once).

    >>> decoder = GreedyCTCDecoder(batch_size=1)
    >>> one_hot = torch.eye(3)[[1, 1]][None]  # two frames of token 1
    >>> decoder.push(one_hot), decoder.push(one_hot)  # the second chunk continues the same token
    ([[1]], [[]])
    """

    def __init__(self, batch_size: int, blank: int = BLANK_ID) -> None:
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.blank = check_int("blank", blank, minimum=0)
        self._previous = np.full(self.batch_size, self.blank, np.int64)

    def reset(self, streams: object = None) -> None:
        """Start new utterances in ``streams`` (stream indices; ``None``: all)."""
        self._previous[slice(None) if streams is None else np.asarray(streams, np.int64)] = self.blank

    def push(self, logits: torch.Tensor, lengths: object = None) -> list[list[int]]:
        """Decode the next chunk ``logits`` ``(B, n, V)`` (any monotone scores: logits, log-probs).

        ``lengths`` ``(B,)``: the real frames of each stream in this chunk
        (default all ``n``); frames after them are ignored. Returns the new
        token ids of each stream.
        """
        if not isinstance(logits, torch.Tensor) or logits.ndim != 3 or logits.shape[0] != self.batch_size:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must be a tensor of shape ({self.batch_size}, n, V), got {shape}")
        frames = logits.shape[1]
        if lengths is None:
            lengths = np.full(self.batch_size, frames, np.int64)
        else:
            lengths = check_lengths("lengths", lengths, maximum=frames, maximum_name="n (logits.shape[1])")
            if lengths.size != self.batch_size:
                raise ValueError(f"lengths must have {self.batch_size} entries (batch_size), got {lengths.size}")
        return self.push_best(logits.argmax(dim=-1).cpu().numpy(), lengths, np.arange(self.batch_size))

    def push_best(self, best: np.ndarray, lengths: np.ndarray, streams: np.ndarray) -> list[list[int]]:
        """:meth:`push_best_at` without the frames: the new token ids of each stream.

        >>> GreedyCTCDecoder(3).push_best(np.array([[2, 2, 0], [1, 0, 1]]), np.array([3, 3]), np.array([2, 0]))
        [[2], [1, 1]]
        """
        return self.push_best_at(best, lengths, streams)[0]

    def push_best_at(
        self, best: np.ndarray, lengths: np.ndarray, streams: np.ndarray
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Decode the next chunk of some streams from their best ids: the new token ids of each, and the
        frame of the chunk (0-based) where each was emitted (its first frame: greedy CTC's token time).

        ``best`` ``(S, n)`` int: each frame's best token id (the argmax of its
        scores) for the streams ``streams`` ``(S,)`` (indices, distinct);
        ``lengths`` ``(S,)``: their real frames. All rows at once: a driver
        calls this on every chunk step, on the thread that launches the steps.

        >>> GreedyCTCDecoder(3).push_best_at(np.array([[2, 2, 0], [1, 0, 1]]), np.array([3, 3]), np.array([2, 0]))
        ([[2], [1, 1]], [[0], [0, 2]])
        """
        frames = best.shape[1]
        before = np.concatenate((self._previous[streams, None], best[:, :-1]), axis=1)
        emitted = (best != self.blank) & (best != before) & (np.arange(frames) < lengths[:, None])
        spoke = lengths > 0
        self._previous[streams[spoke]] = best[spoke, lengths[spoke] - 1]
        ids = best[emitted].tolist()  # row-major: each stream's ids in order, stream after stream
        at = np.nonzero(emitted)[1].tolist()  # ... and the frame of each
        ends = np.cumsum(emitted.sum(axis=1)).tolist()
        pieces = list(zip([0, *ends[:-1]], ends))
        return [ids[start:end] for start, end in pieces], [at[start:end] for start, end in pieces]


def greedy_decode(logits: torch.Tensor, lengths: object = None, blank: int = BLANK_ID) -> list[list[int]]:
    """Greedy CTC decoding of whole utterances ``logits`` ``(B, T, V)``; ``lengths`` ``(B,)`` real frames.

    Returns the token ids of each utterance (blanks and repeats removed).
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise ValueError(f"logits must be a tensor of shape (B, T, V), got {getattr(logits, 'shape', logits)!r}")
    if logits.shape[0] == 0:
        return []
    return GreedyCTCDecoder(logits.shape[0], blank).push(logits, lengths)
