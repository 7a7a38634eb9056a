"""A recogniser's prompt as token ids before and after the audio: :class:`PromptParts`; texts to ids in batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PromptParts", "encode_texts", "split_at_audio"]


@dataclass(frozen=True)
class PromptParts:
    """The prompt of one request: ``head`` ids, then one input per audio token, then ``tail`` ids.

    The model's answer follows ``tail`` (which ends with the assistant's turn, and with any text the
    answer is forced to start with).
    """

    head: tuple[int, ...]
    tail: tuple[int, ...]


def split_at_audio(tokenizer: Any, text: str, placeholder: str) -> PromptParts:
    """Token ids of ``text`` before and after its one ``placeholder`` (the chat template's audio item).

    The placeholder is a special token, atomic to the tokenizer, so the ids of the two sides are the ids
    the whole prompt has with the placeholder repeated per audio token.
    """
    if text.count(placeholder) != 1:
        raise ValueError(
            f"the chat template must put one {placeholder!r} where the audio goes, got {text.count(placeholder)} "
            f"in {text!r}"
        )
    head, tail = text.split(placeholder)
    encode = tokenizer.encode
    return PromptParts(tuple(encode(head, add_special_tokens=False)), tuple(encode(tail, add_special_tokens=False)))


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids, no special tokens added: ``tokenizer.encode(text, add_special_tokens=False)`` for each
    (an empty text's: none).

    A callable tokenizer (transformers') gets them all in one call, which a fast tokenizer encodes in Rust
    over every core: a streaming update encodes two texts a stream, hundreds of streams at a time.
    """
    if not texts:
        return []
    if callable(tokenizer):
        return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]
