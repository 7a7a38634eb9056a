"""Qwen3-ASR's raw output parsed as upstream parses it: ``language <Name><asr_text><text>``.

The model writes its language first, then the tag, then the transcription;
on silence it writes ``language None<asr_text>``. When the language is forced,
the prompt already ends in ``language <Name><asr_text>`` and the model writes
the text alone. Before any parsing, upstream collapses the runaway repetitions
a decoder can fall into (:func:`fix_repetitions`).

>>> parse_output("language English<asr_text>Hello world.")
('English', 'Hello world.')
>>> parse_output("language None<asr_text>")
('', '')
>>> parse_output("Hello world.", language=language_name("en"))
('English', 'Hello world.')

The recipe is qwen-asr 0.0.6's ``parse_asr_output`` and
``detect_and_fix_repetitions`` (``qwen_asr/inference/utils.py``, the official
package). transformers 5.25 ports it to ``Qwen3ASRProcessor.parse_output``
(``_parse_single_output`` in ``processing_qwen3_asr.py``) with the same
repetition fix but a parser that differs; this module follows qwen-asr:

- no language is ``""`` here and in qwen-asr, ``None`` in transformers (which
  returns a dict ``{"language", "transcription"}``);
- transformers first drops everything up to the first ``"assistant\\n"`` (a
  decode that kept the chat prompt); qwen-asr does not;
- transformers has no forced language; qwen-asr returns the forced language
  and the whole (repetition-fixed) output as text, tag or not;
- silence: qwen-asr takes ``language none`` anywhere before the tag, in any
  case; transformers only a prefix that is exactly that, stripped;
- the language: qwen-asr reads the first line before the tag that starts with
  ``language `` and recases its value (``"ENGLISH"`` -> ``"English"``), or
  gives ``""``; transformers reads the first non-empty line only, keeps the
  value's case, and takes a line without ``language `` whole as the language.

:func:`language_name` resolves a name in any case or a code, as transformers'
``resolve_language`` does for the processor; it ignores surrounding spaces, as
qwen-asr's ``normalize_language_name`` does. Standard library only: no torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

__all__ = [
    "ASR_TEXT_TAG",
    "LANGUAGES",
    "LANGUAGE_CODE_TO_NAME",
    "LANGUAGE_PREFIX",
    "MAX_PATTERN_LENGTH",
    "NO_SPEECH",
    "REPETITION_THRESHOLD",
    "fix_repetitions",
    "fix_repetitions_many",
    "language_name",
    "parse_output",
    "parse_outputs",
]

ASR_TEXT_TAG = "<asr_text>"  # ends the model's metadata; the transcription follows
LANGUAGE_PREFIX = "language "  # starts the metadata line that names the language
NO_SPEECH = "language none"  # the metadata (lowercased) on silence: no language, empty text
REPETITION_THRESHOLD = 20  # a character or pattern repeated this often (a character: more) collapses to one copy
MAX_PATTERN_LENGTH = 20  # the longest repeated pattern, in characters, that the fix looks for

# The names the model was trained with (the forced-language suffix "language <Name><asr_text>" and
# what it writes itself), keyed by ISO code: transformers 5.25's LANGUAGE_CODE_TO_NAME, the same 30
# names as qwen-asr 0.0.6's SUPPORTED_LANGUAGES.
LANGUAGE_CODE_TO_NAME: dict[str, str] = {
    "ar": "Arabic",
    "yue": "Cantonese",
    "zh": "Chinese",
    "cs": "Czech",
    "da": "Danish",
    "nl": "Dutch",
    "en": "English",
    "fil": "Filipino",
    "fi": "Finnish",
    "fr": "French",
    "de": "German",
    "el": "Greek",
    "hi": "Hindi",
    "hu": "Hungarian",
    "id": "Indonesian",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "mk": "Macedonian",
    "ms": "Malay",
    "fa": "Persian",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "es": "Spanish",
    "sv": "Swedish",
    "th": "Thai",
    "tr": "Turkish",
    "vi": "Vietnamese",
}
LANGUAGES: tuple[str, ...] = tuple(LANGUAGE_CODE_TO_NAME.values())  # the canonical names, alphabetical
_BY_KEY = {key.lower(): name for code, name in LANGUAGE_CODE_TO_NAME.items() for key in (code, name)}


def language_name(language: str) -> str:
    """The model's name for ``language``, given as a name in any case or an ISO code.

    >>> language_name("en"), language_name("english"), language_name(" YUE ")
    ('English', 'English', 'Cantonese')
    >>> language_name("Klingon")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: language='Klingon' is not one Qwen3-ASR was trained with: give a name or an ISO code, such as ...
    """
    name = _BY_KEY.get(language.strip().lower()) if isinstance(language, str) else None
    if name is None:
        raise ValueError(
            f"language={language!r} is not one Qwen3-ASR was trained with: give a name or an ISO code, such as "
            f"'English' or 'en', 'Chinese' or 'zh', 'Spanish' or 'es' (all {len(LANGUAGES)}: {__name__}.LANGUAGES)"
        )
    return name


# A character followed by REPETITION_THRESHOLD or more copies of itself: a run longer than the threshold (matched
# whole, greedily, from its first character; a shorter run never matches, nor does any part of it).
_LONG_RUN = re.compile(rf"(.)\1{{{REPETITION_THRESHOLD},}}", re.DOTALL)
# Pattern lengths the fix looks for, and how many characters each pattern's repetitions span past its first copy.
_PATTERN_LENGTHS = np.arange(1, MAX_PATTERN_LENGTH + 1)
_COPIES_SPAN = (REPETITION_THRESHOLD - 1) * _PATTERN_LENGTHS
# Characters of texts searched together: one search's arrays take a few hundred bytes a character, and larger
# groups outgrow the processor's cache (figures: docs/defaults.md).
SEARCH_ROWS = 16384


def _repetitions(texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`_repetitions_together` of the texts, in consecutive groups of about :data:`SEARCH_ROWS` characters
    (a group's arrays stay in the processor's cache)."""
    found: list[tuple[np.ndarray, np.ndarray]] = []
    group: list[str] = []
    rows = 0
    for text in texts:
        if group and rows + len(text) > SEARCH_ROWS:
            found += _repetitions_together(group)
            group, rows = [], 0
        group.append(text)
        rows += len(text) + MAX_PATTERN_LENGTH
    return found + _repetitions_together(group)


def _repetitions_together(texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each text, every position where a pattern of 1 to :data:`MAX_PATTERN_LENGTH` characters is followed
    by ``REPETITION_THRESHOLD - 1`` copies of itself, ascending, and the shortest such pattern's length there.

    Upstream tries each position and at each the lengths from 1 up, in Python; a regular expression of the
    same search (``(.{1,20}?)\\1{19}``) costs ~20 tries a character, ~0.2 ms on a 240-character answer. Here:
    ``L`` characters repeat ``R`` times from ``i`` exactly when ``text[j] == text[j + L]`` for every ``j`` in
    ``i .. i + (R - 1) L - 1``, so one comparison of the text with itself shifted by each length, and the
    length of the run of equal pairs from each position, decide every position at once; the texts go in one
    search (a streaming update parses hundreds), each followed by :data:`MAX_PATTERN_LENGTH` code points that
    equal nothing (distinct negatives), so that no comparison reaches past a text's end.
    """
    none = np.zeros(0, np.int64)
    sizes = np.array([len(text) for text in texts], np.int64)
    if not len(texts) or sizes.max() < REPETITION_THRESHOLD:  # too short for any pattern's copies
        return [(none, none) for _ in texts]
    begins = np.concatenate(([0], np.cumsum(sizes + MAX_PATTERN_LENGTH)[:-1]))  # each text's first row
    total = int(begins[-1] + sizes[-1] + MAX_PATTERN_LENGTH)
    codes = -np.arange(1, total + MAX_PATTERN_LENGTH + 1, dtype=np.int64)  # past every text: equal to nothing
    joined = "".join(texts).encode("utf-32-le", "surrogatepass")
    codes[np.arange(int(sizes.sum())) + np.repeat(begins - np.cumsum(sizes) + sizes, sizes)] = np.frombuffer(
        joined, "<u4"
    )
    shifted = np.lib.stride_tricks.sliding_window_view(codes, MAX_PATTERN_LENGTH + 1)
    equal = shifted[:total, 1:] == shifted[:total, :1]  # equal[j, L - 1]: codes[j] == codes[j + L]
    # A repetition needs a run of at least REPETITION_THRESHOLD - 1 equal pairs (pattern length 1): most texts
    # have none, found by halving the run in a few ands.
    runs, width = equal, 1
    while width < REPETITION_THRESHOLD - 1:
        step = min(width, REPETITION_THRESHOLD - 1 - width)
        runs, width = runs[:-step] & runs[step:], width + step
    if not runs.any():
        return [(none, none) for _ in texts]
    positions = np.arange(total)[:, None]
    unequal_from = np.minimum.accumulate(np.where(equal, total, positions)[::-1], axis=0)[::-1]
    repeats = unequal_from - positions >= _COPIES_SPAN  # (total, lengths)
    starts = np.flatnonzero(repeats.any(axis=1))
    lengths = _PATTERN_LENGTHS[repeats[starts].argmax(axis=1)]
    cuts = np.searchsorted(starts, np.append(begins, total)).tolist()  # text t's starts: cuts[t] .. cuts[t + 1]
    return [(starts[cuts[t] : cuts[t + 1]] - begins[t], lengths[cuts[t] : cuts[t + 1]]) for t in range(len(texts))]


def _fix_pattern_repeats(text: str, starts: np.ndarray, lengths: np.ndarray) -> str:
    """Upstream's ``fix_pattern_repeats`` given :func:`_repetitions` of ``text``: left to right, the first repeated
    pattern becomes one copy (every further copy taken), and the search goes on after them; its tail recursion
    made a loop (no recursion limit on long outputs). Upstream starts no pattern where fewer than twice the
    threshold of characters remain."""
    out: list[str] = []
    start = 0  # where upstream's recursive call on the rest would begin
    last = len(text) - 2 * REPETITION_THRESHOLD
    while (found := int(np.searchsorted(starts, start))) < len(starts) and starts[found] <= last:
        where, length = int(starts[found]), int(lengths[found])
        pattern, end = text[where : where + length], where + REPETITION_THRESHOLD * length
        while text.startswith(pattern, end):  # upstream takes every further copy
            end += length
        out += (text[start:where], pattern)  # what came before, and one copy of the pattern
        start = end
    out.append(text[start:])
    return "".join(out)


def fix_repetitions(text: str) -> str:
    """``text`` with runaway repetitions collapsed, as upstream does before parsing (one text of
    :func:`fix_repetitions_many`).

    First a character repeated more than :data:`REPETITION_THRESHOLD` times in a
    row becomes one; then, left to right, the first pattern of up to
    :data:`MAX_PATTERN_LENGTH` characters repeated at least that many times
    becomes one copy, and the rest is fixed the same way. Upstream only starts
    a pattern where at least twice the threshold of characters remain, so a
    repetition near the end survives. Same output as qwen-asr's
    ``detect_and_fix_repetitions`` and transformers' ``_detect_and_fix_repetitions``.

    >>> fix_repetitions("ha" * 30 + "!")
    'ha!'
    >>> fix_repetitions("So" + "o" * 25 + " good.")
    'So good.'
    >>> fix_repetitions("no no no")
    'no no no'
    """
    return fix_repetitions_many([text])[0]


def fix_repetitions_many(texts: Sequence[str]) -> list[str]:
    """:func:`fix_repetitions` of each text, the patterns of all of them searched at once.

    >>> fix_repetitions_many(["ha" * 30 + "!", "no no no"])
    ['ha!', 'no no no']
    """
    collapsed = [_LONG_RUN.sub(r"\1", text) for text in texts]
    return [
        _fix_pattern_repeats(text, starts, lengths) if len(starts) else text  # no pattern repeated: nothing to fix
        for text, (starts, lengths) in zip(collapsed, _repetitions(collapsed), strict=True)
    ]


def parse_output(raw: str, language: str | None = None) -> tuple[str, str]:
    """``(language, text)`` of one raw Qwen3-ASR output, as qwen-asr's ``parse_asr_output``.

    ``raw`` is stripped and :func:`fix_repetitions` applied; empty, it gives
    ``("", "")``. A forced ``language`` (any non-empty string; pass the
    canonical :func:`language_name`, which is what the prompt held) comes back
    as given, with that fixed output as the text (tag or not, and not stripped
    again after the fix), as upstream does.
    Otherwise: without :data:`ASR_TEXT_TAG` the whole output is text and the
    language ``""``; with it, the text is what follows its first occurrence,
    stripped; ``language none`` before it (any case) means no language; else
    the first line before it that starts with ``language `` gives the
    language, recased to a capital and lowercase (``"ENGLISH"`` ->
    ``"English"``), ``""`` if there is none. The language is not checked
    against :data:`LANGUAGES`. The module docstring lists where transformers'
    parser differs.

    >>> parse_output("language english\\n<asr_text> Bonjour. ")
    ('English', 'Bonjour.')
    >>> parse_output("language None<asr_text>")
    ('', '')
    >>> parse_output("No tag at all")
    ('', 'No tag at all')
    >>> parse_output("Ja" + ", ja" * 25, language="German")
    ('German', 'Ja, ja')
    """
    return parse_outputs([raw], language)[0]


def parse_outputs(raws: Sequence[str], language: str | None = None) -> list[tuple[str, str]]:
    """:func:`parse_output` of each raw output, their repetitions fixed in one search
    (:func:`fix_repetitions_many`).

    >>> parse_outputs(["language English<asr_text>Hi.", "language None<asr_text>"])
    [('English', 'Hi.'), ('', '')]
    """
    stripped = [raw.strip() for raw in raws]
    fixed = iter(fix_repetitions_many([s for s in stripped if s]))
    return [_language_and_text(next(fixed), language) if s else ("", "") for s in stripped]


def _language_and_text(s: str, language: str | None) -> tuple[str, str]:
    """:func:`parse_output` of the stripped, repetition-fixed, non-empty output ``s``."""
    if language:
        return language, s
    if ASR_TEXT_TAG not in s:
        return "", s.strip()
    meta, text = s.split(ASR_TEXT_TAG, 1)
    text = text.strip()
    if NO_SPEECH in meta.lower():
        return "", text
    for line in meta.splitlines():
        line = line.strip()
        if line.lower().startswith(LANGUAGE_PREFIX):
            value = line[len(LANGUAGE_PREFIX) :].strip()
            return (value[:1].upper() + value[1:].lower() if value else ""), text
    return "", text
