"""What a stream has said so far: its text, its tokens and when each starts. Plain data, no torch.

Servers pass it between processes that load no model.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Transcript"]


@dataclass(frozen=True)
class Transcript:
    """A stream's text and its tokens, each with the time it starts.

    ``tokens``: the text's tokens in order (the tokenizer's pieces: characters
    for :class:`~audiomask.asr.decoding.CharTokenizer`); ``times_s``: where each starts, seconds from
    the stream's start: the start of the encoder output token at which greedy
    CTC emitted it (a token's first frame, so a resolution of one output
    token: 40 ms for the shipped model).
    """

    text: str = ""
    tokens: tuple[str, ...] = ()
    times_s: tuple[float, ...] = ()
