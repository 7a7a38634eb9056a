"""audiomask.llm.prompt: encode_texts and decode_texts, one batched call each, the same as the tokenizer text by text."""

from __future__ import annotations

import pytest

from audiomask.llm.prompt import decode_texts, encode_texts
from bench.llm_checkpoints import QWEN3_ASR_SPECIALS, qwen3_asr_tokenizer

pytest.importorskip("transformers")

TEXTS = [
    "",
    "hello world",
    "language English<asr_text>Ada Lovelace wrote the first program.",
    "  two  spaces, émigré café, 数字 123 ",
    f"a{QWEN3_ASR_SPECIALS[1]}b",  # a special token inside a text is one id, as the tokenizer encodes it
    "\n\n\t",
]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen3_asr_tokenizer(2048)


def _each(tokenizer, texts):
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def test_encode_texts_equals_encode_text_by_text(tokenizer):
    assert encode_texts(tokenizer, TEXTS) == _each(tokenizer, TEXTS)
    assert encode_texts(tokenizer, []) == []


def test_encode_texts_follows_the_tokenizer_when_its_backend_is_set_otherwise(tokenizer):
    """Split special tokens, or truncation left on the backend: the tokenizer's own call, not the backend's."""
    tokenizer.split_special_tokens = True
    try:
        assert encode_texts(tokenizer, TEXTS) == _each(tokenizer, TEXTS)
        assert len(encode_texts(tokenizer, TEXTS[4:5])[0]) > 3  # the special token spelled out
    finally:
        tokenizer.split_special_tokens = False
    tokenizer.backend_tokenizer.enable_truncation(max_length=3)
    try:
        assert encode_texts(tokenizer, TEXTS) == _each(tokenizer, TEXTS)
    finally:
        tokenizer.backend_tokenizer.no_truncation()


class _TextByText:
    """A tokenizer with ``encode`` alone (not callable, no backend)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_encode_texts_of_a_tokenizer_without_a_batch_call():
    assert encode_texts(_TextByText(), ["ab", ""]) == [[97, 98], []]


def _decoded_each(tokenizer, id_lists):
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in id_lists]


def test_decode_texts_equals_decode_list_by_list(tokenizer):
    id_lists = _each(tokenizer, TEXTS) + [[*tokenizer.encode("hi", add_special_tokens=False), 2047], []]
    assert decode_texts(tokenizer, id_lists) == _decoded_each(tokenizer, id_lists)
    assert decode_texts(tokenizer, id_lists)[4] == "ab"  # the special token between them skipped
    assert decode_texts(tokenizer, []) == []


def test_decode_texts_follows_the_tokenizer_where_it_cleans_up_spaces(tokenizer):
    id_lists = _each(tokenizer, ["a , b .", "don 't"])
    tokenizer.clean_up_tokenization_spaces = True
    try:
        assert decode_texts(tokenizer, id_lists) == _decoded_each(tokenizer, id_lists)
    finally:
        tokenizer.clean_up_tokenization_spaces = False


class _ListByList:
    """A tokenizer with ``decode`` alone (no backend)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def test_decode_texts_of_a_tokenizer_without_a_backend():
    assert decode_texts(_ListByList(), [[97, 98], []]) == ["ab", ""]
