"""audiomask.llm.parse: Qwen3-ASR's raw output parsed as qwen-asr does, against transformers' port where the two agree.

qwen-asr (the recipe followed) is not a dependency; transformers' processor
carries the same repetition fix and a parser that agrees with qwen-asr on the
text always (without ``"assistant\\n"``) and on the language for model-shaped
output with a canonical name. Where they differ, hand-worked examples pin ours.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from transformers.audio_utils import resolve_language
from transformers.models.qwen3_asr import processing_qwen3_asr as upstream

from audiomask.llm.parse import (
    ASR_TEXT_TAG,
    LANGUAGE_CODE_TO_NAME,
    LANGUAGES,
    MAX_PATTERN_LENGTH,
    REPETITION_THRESHOLD,
    fix_repetitions,
    fix_repetitions_many,
    language_name,
    parse_output,
    parse_outputs,
)

# What the model writes, what a decoder stuck in a loop writes, and what breaks parsers.
PIECES = [
    "language English",
    "language None",
    "language none",
    "LANGUAGE chinese",
    "language ",
    "language",
    ASR_TEXT_TAG,
    "\n",
    " ",
    "\r\n",
    "\t",
    "Hello world.",
    "ha",
    "a",
    "你好",
    "ß",
]
piece = st.sampled_from(PIECES) | st.text(max_size=4)
# Repeated around the threshold, so both collapsing rules fire and just miss.
repeated = st.builds(
    lambda p, n: p * n,
    st.sampled_from(PIECES) | st.text(min_size=1, max_size=MAX_PATTERN_LENGTH + 2),
    st.integers(REPETITION_THRESHOLD - 3, 2 * REPETITION_THRESHOLD + 3),
)
raw_output = st.lists(piece | repeated, max_size=12).map("".join)
blank = st.sampled_from(["", " ", "\n", " \n\t"])


def with_random_case(draw, word: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    return "".join(c.upper() if flip else c.lower() for c, flip in zip(word, flips))


@st.composite
def model_shaped(draw, case=lambda draw, name: name) -> tuple[str, str]:
    """``language <Name>[\\n]<asr_text><text>`` with blanks around it, and the name."""
    name = draw(st.sampled_from((*LANGUAGES, "None")))
    raw = (
        draw(blank)
        + "language "
        + case(draw, name)
        + draw(st.sampled_from(["", "\n"]))
        + ASR_TEXT_TAG
        + draw(raw_output)
        + draw(blank)
    )
    return raw, name


@given(raw_output)
def test_fix_repetitions_matches_upstream(text):
    assert fix_repetitions(text) == upstream._detect_and_fix_repetitions(text)


@given(st.lists(raw_output, max_size=8))
def test_texts_searched_together_are_fixed_as_each_alone_upstream(texts):
    """The texts of one search never reach into each other: each is fixed as upstream fixes it alone."""
    assert fix_repetitions_many(texts) == [upstream._detect_and_fix_repetitions(text) for text in texts]


@given(st.lists(raw_output | model_shaped().map(lambda pair: pair[0]), max_size=8), st.sampled_from([None, "German"]))
def test_outputs_parsed_together_are_parsed_as_each_alone(raws, language):
    assert parse_outputs(raws, language) == [parse_output(raw, language) for raw in raws]


@given(raw_output)
def test_text_matches_transformers(raw):
    assume("assistant\n" not in raw)  # transformers alone cuts a kept chat prompt
    assert parse_output(raw)[1] == upstream._parse_single_output(raw)["transcription"]


@given(model_shaped())
def test_language_matches_transformers_on_model_shaped_output(raw_and_name):
    raw, _ = raw_and_name
    theirs = upstream._parse_single_output(raw)
    assert parse_output(raw) == (theirs["language"] or "", theirs["transcription"])


@given(model_shaped(case=with_random_case))
def test_language_is_recased_to_the_canonical_name(raw_and_name):
    """transformers keeps the model's case; qwen-asr, and so ours, gives the canonical name."""
    raw, name = raw_and_name
    language, text = parse_output(raw)
    theirs = upstream._parse_single_output(raw)
    assert text == theirs["transcription"]
    if name == "None":
        assert language == ""
    else:
        assert language == name == language_name(theirs["language"])


@given(raw_output, st.sampled_from(LANGUAGES))
def test_forced_language_returns_it_with_the_fixed_output_as_text(raw, name):
    expected = (name, upstream._detect_and_fix_repetitions(raw.strip())) if raw.strip() else ("", "")
    assert parse_output(raw, language=name) == expected


@pytest.mark.parametrize(
    ("raw", "expected", "transformers_gives"),
    [
        ("language English<asr_text>Hello.", ("English", "Hello."), ("English", "Hello.")),
        (" \n ", ("", ""), (None, "")),
        ("language None<asr_text>", ("", ""), (None, "")),
        ("language None<asr_text> stray text ", ("", "stray text"), (None, "stray text")),
        ("language english\n<asr_text>hi", ("English", "hi"), ("english", "hi")),
        ("junk\nlanguage German<asr_text>Hallo", ("German", "Hallo"), ("junk", "Hallo")),
        ("language Nonesuch<asr_text>x", ("", "x"), ("Nonesuch", "x")),
        ("system\nassistant\nHello", ("", "system\nassistant\nHello"), (None, "Hello")),
        ("a<asr_text>b<asr_text>c", ("", "b<asr_text>c"), ("a", "b<asr_text>c")),
        ("language ja" + "哈" * 30 + "<asr_text>" + "ok, " * 25 + "done", ("Ja哈", "ok, done"), ("ja哈", "ok, done")),
    ],
)
def test_hand_worked_examples(raw, expected, transformers_gives):
    assert parse_output(raw) == expected
    theirs = upstream._parse_single_output(raw)
    assert (theirs["language"], theirs["transcription"]) == transformers_gives


def test_empty_output_wins_over_a_forced_language():
    assert parse_output("  ", language="English") == ("", "")
    assert parse_output("", language="English") == ("", "")


@pytest.mark.parametrize("before", [0, 1, 7])
@pytest.mark.parametrize("length", [1, 2, MAX_PATTERN_LENGTH, MAX_PATTERN_LENGTH + 1])
@pytest.mark.parametrize("copies", [REPETITION_THRESHOLD - 1, REPETITION_THRESHOLD, REPETITION_THRESHOLD + 1])
@pytest.mark.parametrize("after", [0, 1, 2 * REPETITION_THRESHOLD - 1, 2 * REPETITION_THRESHOLD])
def test_fix_repetitions_at_the_bounds_of_upstreams_search(before, length, copies, after):
    """A pattern at each bound: its length, its copies, and the characters left after it (upstream starts no
    pattern where fewer than twice the threshold remain), all shifted off position 0."""
    pattern = "".join(chr(0x61 + i % 26) if i % 7 else "\n" for i in range(length))
    text = "x" * before + pattern * copies + "".join(chr(0x4E00 + i) for i in range(after))
    assert fix_repetitions(text) == upstream._detect_and_fix_repetitions(text)


def test_a_long_run_of_repetitions_does_not_recurse():
    """Upstream recurses once per collapsed pattern, so 3,000 of them pass Python's recursion limit; ours loops."""
    chars = [chr(0x4E00 + i % 500) for i in range(3000)]
    text = "".join(c * REPETITION_THRESHOLD for c in chars)  # each run: a one-character pattern, collapsed ...
    assert fix_repetitions(text) == "".join(chars[:-1]) + chars[-1] * REPETITION_THRESHOLD  # ... but the last
    short = text[: 300 * REPETITION_THRESHOLD]
    assert fix_repetitions(short) == upstream._detect_and_fix_repetitions(short)


def test_language_table_is_transformers():
    assert LANGUAGE_CODE_TO_NAME == upstream.LANGUAGE_CODE_TO_NAME
    assert LANGUAGES == tuple(sorted(LANGUAGES)) == tuple(sorted(set(LANGUAGE_CODE_TO_NAME.values())))


@st.composite
def language_key(draw) -> str:
    code, name = draw(st.sampled_from(sorted(LANGUAGE_CODE_TO_NAME.items())))
    return with_random_case(draw, draw(st.sampled_from([code, name])))


@given(language_key(), blank, blank)
def test_language_name_resolves_codes_and_names_in_any_case(key, before, after):
    assert language_name(before + key + after) == resolve_language(key, LANGUAGE_CODE_TO_NAME, return_code=False)


@given(st.text(max_size=12))
def test_language_name_rejects_what_transformers_rejects(value):
    known = {k.lower() for item in LANGUAGE_CODE_TO_NAME.items() for k in item}
    assume(value.strip().lower() not in known)
    with pytest.raises(ValueError):
        resolve_language(value, LANGUAGE_CODE_TO_NAME)
    with pytest.raises(ValueError, match="^language=") as error:
        language_name(value)
    assert repr(value) in str(error.value)


@pytest.mark.parametrize("value", ["Klingon", "", "english!", "eng", None, 7])
def test_language_name_error_names_the_argument_the_value_and_some_names(value):
    with pytest.raises(ValueError) as error:
        language_name(value)
    message = str(error.value)
    assert message.startswith(f"language={value!r} ")
    assert "'English' or 'en'" in message and "LANGUAGES" in message


def test_texts_searched_in_groups_are_fixed_as_each_alone(monkeypatch):
    import audiomask.llm.parse as parse_module

    texts = [
        "ha" * 30 + "!",
        "",
        "So" + "o" * 25 + " good.",
        "x" * 45 + "ab" * 10,
        "ab" * 10 + "y" * 45,
        "no no no",
        "la " * 40 + "end",
        "short",
    ]
    expected = [upstream._detect_and_fix_repetitions(text) for text in texts]
    for rows in (1, 50, 120, 10_000):  # a text a group, a few, all in one
        monkeypatch.setattr(parse_module, "SEARCH_ROWS", rows)
        assert fix_repetitions_many(texts) == expected
