"""audiomask.masks.qwen3_asr: worked examples, loop references, argument checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from audiomask.masks.qwen3_asr import (
    CHUNK_FRAMES,
    TOKENS_PER_CHUNK,
    WINDOW_TOKENS,
    chunk_lengths,
    cu_seqlens,
    output_lengths,
    padded_mask_after_cnn,
    window_mask,
)


def test_constants():
    assert CHUNK_FRAMES == 100
    assert output_lengths([CHUNK_FRAMES]).tolist() == [TOKENS_PER_CHUNK] == [13]  # 100 -> 50 -> 25 -> 13
    assert WINDOW_TOKENS == 104


@pytest.mark.parametrize(("frames", "tokens"), [(50, 7), (130, 17), (250, 33), (1000, 130), (100, 13), (0, 0)])
def test_output_lengths_worked_examples(frames, tokens):
    got = output_lengths([frames])
    assert got.dtype == np.int64
    assert got.tolist() == [tokens]


@pytest.mark.parametrize(
    ("feature_lens", "expected"),
    [([250], [0, 33]), ([250, 1000], [0, 33, 137, 163]), ([3000], [0, 104, 208, 312, 390])],
)
def test_cu_seqlens_worked_examples(feature_lens, expected):
    got = cu_seqlens(feature_lens)
    assert got.dtype == np.int32
    assert got.tolist() == expected


def test_window_mask_is_block_diagonal():
    mask = window_mask([250, 1000])
    assert mask.shape == (163, 163)
    for lo, hi in [(0, 33), (33, 137), (137, 163)]:
        assert mask[lo:hi, lo:hi].all()
        assert mask[lo:hi].sum() == (hi - lo) ** 2  # nothing outside its own window


def test_edge_cases():
    assert chunk_lengths([]).shape == (0,)
    assert chunk_lengths([0, 0]).shape == (0,)
    assert chunk_lengths([250, 0, 100]).tolist() == [100, 100, 50, 100]
    assert cu_seqlens([]).tolist() == [0]
    assert cu_seqlens([0, 0]).tolist() == [0]  # upstream divides by zero here
    assert window_mask([0]).shape == (0, 0)
    assert padded_mask_after_cnn([0]).shape == (0, 0)
    assert padded_mask_after_cnn([1]).tolist() == [[True]]
    assert padded_mask_after_cnn([50]).shape == (1, 7)  # width = longest chunk's tokens


feature_lens = st.lists(st.integers(0, 1000), max_size=5)


@st.composite
def windows(draw):
    """Small chunks and windows, so that dense masks stay small: (n_window, n_window_infer)."""
    n_window = draw(st.integers(1, 12))
    return n_window, 2 * n_window * draw(st.integers(1, 4))


@given(lens=feature_lens, n_window=st.integers(1, 80))
def test_lengths_match_loop(mask_reference, lens, n_window):
    chunks = chunk_lengths(np.array(lens, dtype=np.int32), n_window)
    assert chunks.dtype == np.int64
    np.testing.assert_array_equal(chunks, mask_reference.qwen_chunk_lengths(lens, n_window))
    tokens = output_lengths(lens, n_window)
    assert tokens.dtype == np.int64
    np.testing.assert_array_equal(tokens, mask_reference.qwen_output_lengths(lens, n_window))


@given(lens=feature_lens, n_window=st.integers(1, 80))
def test_padded_mask_after_cnn_matches_loop(mask_reference, assert_builds, lens, n_window):
    expected = mask_reference.qwen_padded_mask_after_cnn(lens, n_window)
    assert_builds(lambda out=None: padded_mask_after_cnn(lens, n_window, out=out), expected)
    # Row-major valid cells are the packed tokens: per utterance they add up to output_lengths.
    assert expected.sum() == output_lengths(lens, n_window).sum()


@given(lens=feature_lens, nw=windows())
def test_cu_seqlens_matches_loop(mask_reference, assert_builds, lens, nw):
    n_window, n_window_infer = nw
    expected = mask_reference.qwen_cu_seqlens(lens, n_window, n_window_infer)
    assert_builds(lambda out=None: cu_seqlens(lens, n_window, n_window_infer, out=out), expected)


@given(lens=st.lists(st.integers(0, 300), max_size=4), nw=windows())
def test_window_mask_matches_loop(mask_reference, assert_builds, lens, nw):
    n_window, n_window_infer = nw
    expected = mask_reference.qwen_window_mask(lens, n_window, n_window_infer)
    assert_builds(lambda out=None: window_mask(lens, n_window, n_window_infer, out=out), expected)


def test_window_mask_full_size_utterance():
    cu = cu_seqlens([3000, 470])
    mask = window_mask([3000, 470])
    assert mask.shape == (cu[-1], cu[-1])
    window_of = np.repeat(np.arange(cu.size - 1), np.diff(cu))
    np.testing.assert_array_equal(mask, window_of[:, None] == window_of[None, :])


@pytest.mark.parametrize(
    ("call", "name", "value"),
    [
        (lambda: output_lengths([100, -1]), "feature_lens", "-1"),
        (lambda: output_lengths([10.5]), "feature_lens", "10.5"),
        (lambda: chunk_lengths([[100]]), "feature_lens", "(1, 1)"),
        (lambda: output_lengths([[100, 200], [300]]), "feature_lens", "[[100, 200], [300]]"),
        (lambda: chunk_lengths([100], n_window=0), "n_window", "0"),
        (lambda: padded_mask_after_cnn([100], n_window=2.5), "n_window", "2.5"),
        (lambda: cu_seqlens([100], n_window_infer=0), "n_window_infer", "0"),
        (lambda: cu_seqlens([100], n_window_infer=150), "n_window_infer", "150"),
        (lambda: window_mask([100], n_window=50, n_window_infer=50), "n_window_infer", "50"),
        (lambda: cu_seqlens([100], n_window_infer=800.0), "n_window_infer", "800.0"),
        (lambda: cu_seqlens([2**40]), "feature_lens", "int32"),
    ],
)
def test_bad_arguments_name_argument_and_value(call, name, value):
    with pytest.raises(ValueError, match=re.escape(name) + ".*" + re.escape(value)):
        call()
