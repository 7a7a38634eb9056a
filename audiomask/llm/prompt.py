"""A recogniser's prompt as token ids before and after the audio: :class:`PromptParts`; texts to ids and back in
batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PromptParts", "decode_texts", "encode_texts", "split_at_audio"]


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

    A streaming update encodes two texts a stream, hundreds of streams at a time, so they go in one call:
    a fast tokenizer's Rust backend directly where it is set as transformers would set it for this call (no
    truncation, no padding, special tokens as the tokenizer splits them), which encodes them over every core
    and skips transformers' per-text conversion of the results (a third of the time); else the tokenizer's
    own batch call, or one call a text.
    """
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if _plain(tokenizer, backend):
        return [encoding.ids for encoding in backend.encode_batch_fast(list(texts), add_special_tokens=False)]
    if callable(tokenizer):
        return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def decode_texts(tokenizer: Any, id_lists: Sequence[Sequence[int]]) -> list[str]:
    """Each id list's text, special tokens skipped: ``tokenizer.decode(ids, skip_special_tokens=True)`` for each.

    A streaming update decodes an answer a stream, hundreds at a time: a fast tokenizer's Rust backend decodes them
    in one call (over every core, the interpreter lock let go) where the tokenizer adds nothing to it (no clean-up
    of spaces); else one call a list.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is not None
        and hasattr(backend, "decode_batch")
        and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
    ):
        return backend.decode_batch([list(ids) for ids in id_lists], skip_special_tokens=True)
    return [tokenizer.decode(list(ids), skip_special_tokens=True) for ids in id_lists]


def _plain(tokenizer: Any, backend: Any) -> bool:
    """Whether ``backend`` (a ``tokenizers.Tokenizer``) encodes as ``tokenizer``'s call without special tokens."""
    if backend is None or not hasattr(backend, "encode_batch_fast"):
        return False
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    return backend.truncation is None and backend.padding is None and backend.encode_special_tokens == split
