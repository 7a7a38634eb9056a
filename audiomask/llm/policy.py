"""When an LLM recogniser's stream gets its partials, and what they start from: :class:`StreamPolicy`.

The knobs and defaults are the official ``qwen-asr`` streaming recipe's (``init_streaming_state``): a partial
every ``chunk_s`` of audio, decoded from the previous answer less its last ``unfixed_tokens`` tokens (no such
prefix for the first ``unfixed_chunks`` chunks); :class:`~audiomask.llm.streaming.LLMStreams` adds how long one
update's answer may be, the segments of long streams and the final pass's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from audiomask.checks import check_int
from audiomask.constants import SAMPLE_RATE
from audiomask.llm.model import DEFAULT_MAX_NEW_TOKENS
from audiomask.llm.prompt import encode_texts

__all__ = [
    "DEFAULT_CHUNK_S",
    "DEFAULT_SEGMENT_WINDOWS",
    "DEFAULT_UNFIXED_CHUNKS",
    "DEFAULT_UNFIXED_TOKENS",
    "DEFAULT_UPDATE_TOKENS",
    "REPLACEMENT_CHARACTER",
    "WINDOW_S",
    "StreamPolicy",
    "segment_windows_within",
]

DEFAULT_CHUNK_S = 2.0  # the recipe's chunk: a partial every 2 s of audio
DEFAULT_UNFIXED_CHUNKS = 2  # the recipe's first chunks decoded without a prefix
DEFAULT_UNFIXED_TOKENS = 5  # the recipe's roll-back: the previous answer's last tokens are decoded again
DEFAULT_UPDATE_TOKENS = 32  # the longest answer one update adds beyond its prefix (~8 s of speech at ~4 tokens/s)
DEFAULT_SEGMENT_WINDOWS = 4  # closed 8 s windows a segment holds: 32 s
WINDOW_S = 8.0  # what segment_windows counts: Qwen3-ASR's attention window (and the re-feed's span)
REPLACEMENT_CHARACTER = "\ufffd"  # a cut through a multi-byte character decodes to this


@dataclass(frozen=True)
class StreamPolicy:
    """When partials come and what they start from (the ``qwen-asr`` recipe's knobs, same defaults).

    ``update_tokens``: the most tokens one update decodes after its prefix; ``fixed_tokens``: decode
    exactly this many instead, ignoring the end token (a benchmark of random weights, which never say it);
    ``segment_windows``: closed encoder windows a segment may hold before a new one starts;
    ``final_tokens``: the longest final (offline) answer of a segment.
    """

    chunk_s: float = DEFAULT_CHUNK_S
    unfixed_chunks: int = DEFAULT_UNFIXED_CHUNKS
    unfixed_tokens: int = DEFAULT_UNFIXED_TOKENS
    update_tokens: int = DEFAULT_UPDATE_TOKENS
    fixed_tokens: int | None = None
    segment_windows: int = DEFAULT_SEGMENT_WINDOWS
    final_tokens: int = DEFAULT_MAX_NEW_TOKENS

    def __post_init__(self) -> None:
        if not (isinstance(self.chunk_s, (int, float)) and 0 < self.chunk_s <= 60):
            raise ValueError(f"chunk_s must be in (0, 60] seconds, got {self.chunk_s!r}")
        check_int("unfixed_chunks", self.unfixed_chunks, minimum=0)
        check_int("unfixed_tokens", self.unfixed_tokens, minimum=0)
        check_int("update_tokens", self.update_tokens, minimum=1)
        check_int("segment_windows", self.segment_windows, minimum=1)
        check_int("final_tokens", self.final_tokens, minimum=1)
        if self.fixed_tokens is not None:
            check_int("fixed_tokens", self.fixed_tokens, minimum=1)

    @property
    def chunk_samples(self) -> int:
        """Samples per chunk at 16 kHz (the recipe rounds, at least 1)."""
        return max(1, round(self.chunk_s * SAMPLE_RATE))

    def answer_tokens(self, chunks: int) -> int:
        """The longest answer after ``chunks`` updates: each decodes ``fixed_tokens`` (or at most
        ``update_tokens``) after its prefix, the previous answer less ``unfixed_tokens`` (none for the first
        ``unfixed_chunks``). With fixed tokens, what a segment of that many chunks is answered with.

        >>> StreamPolicy(fixed_tokens=13).answer_tokens(16)  # 13, 13, then 8 more a chunk: 4 a second of audio
        125
        """
        length = 0
        for update in range(chunks):
            kept = max(0, length - self.unfixed_tokens) if update >= self.unfixed_chunks else 0
            length = kept + (self.fixed_tokens or self.update_tokens)
        return length

    def final_budget(self, samples: int) -> int:
        """The longest final (offline) answer of a segment of ``samples``: ``final_tokens``; with
        ``fixed_tokens``, exactly :meth:`answer_tokens` of its chunks (what the updates' answer grows to, as much
        as speech gives) -- random weights never end an answer themselves."""
        if self.fixed_tokens is None:
            return self.final_tokens
        return self.answer_tokens(max(1, -(-samples // self.chunk_samples)))

    def prefixes(self, tokenizer: Any, answers: Sequence[str], chunks: Sequence[int]) -> list[str]:
        """The text each stream's next answer starts from, given its answer so far (``answers[b]``, decoded text)
        after ``chunks[b]`` updates: that answer less its last ``unfixed_tokens`` tokens (the recipe's
        roll-back), none while ``chunks[b] < unfixed_chunks``; a cut through a character moves back a token.
        The answers are encoded again, as the recipe does (one call for all)."""
        prefixes = [""] * len(answers)
        rolled = [
            row
            for row, (answer, count) in enumerate(zip(answers, chunks, strict=True))
            if count >= self.unfixed_chunks and answer
        ]
        for row, ids in zip(rolled, encode_texts(tokenizer, [answers[row] for row in rolled]), strict=True):
            back = self.unfixed_tokens
            while (end := max(0, len(ids) - back)) > 0:
                prefixes[row] = tokenizer.decode(ids[:end])
                if REPLACEMENT_CHARACTER not in prefixes[row]:
                    break
                back += 1
            else:
                prefixes[row] = ""
        return prefixes


def segment_windows_within(longest_s: float | None) -> int:
    """``segment_windows`` for streams whose caller ends every segment within ``longest_s`` seconds (a server's
    ``--max-segment-s``; ``None``: never): enough closed windows that no segment ends before that, at most
    :data:`DEFAULT_SEGMENT_WINDOWS`. Fewer windows make a slot hold fewer positions (its cache is sized by them).

    >>> segment_windows_within(20.0), segment_windows_within(16.0), segment_windows_within(None)
    (3, 3, 4)
    """
    if longest_s is None:
        return DEFAULT_SEGMENT_WINDOWS
    return min(DEFAULT_SEGMENT_WINDOWS, int(longest_s // WINDOW_S) + 1)
