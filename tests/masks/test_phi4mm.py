"""audiomask.masks.phi4mm: worked examples, loop references, argument checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from audiomask.masks.phi4mm import (
    TIME_REDUCTION,
    adaptive_enc_mask,
    hs_mask,
    select_chunk_size,
    streaming_mask,
    subsampled_lengths,
)


def rows(text: str) -> np.ndarray:
    """'110 011' -> bool matrix, rows = queries."""
    return np.array([[c == "1" for c in row] for row in text.split()], dtype=bool)


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((6, [0, 2, 4]), {}, "110000 110000 001100 001100 000011 000011"),
        ((7, [0, 3, 6]), {"left_window": 1}, "1110000 1110000 1110000 1111110 1111110 1111110 0001111"),
        ((6, [0, 1, 4]), {"right_window": 1}, "111100 011111 011111 011111 000011 000011"),
        ((7, [2, 5]), {}, "1100000 1100000 0011100 0011100 0011100 0000011 0000011"),
    ],
)
def test_adaptive_enc_mask_worked_examples(args, kwargs, expected):
    np.testing.assert_array_equal(adaptive_enc_mask(*args, **kwargs), rows(expected))


def test_hidden_state_mask_worked_example():
    mask = hs_mask([40, 17], max_frames=40, chunk_size=2, left_chunk=1, time_reduction=8)
    assert mask.shape == (2, 5, 5)
    np.testing.assert_array_equal(mask[1], rows("11000 11000 11100 11100 00100"))
    np.testing.assert_array_equal(mask[0], streaming_mask(5, 1, 2, 1)[0])


def test_edge_cases():
    assert adaptive_enc_mask(0, []).shape == (0, 0)
    assert adaptive_enc_mask(0, [0]).shape == (0, 0)
    np.testing.assert_array_equal(adaptive_enc_mask(1, [0]), [[True]])
    assert adaptive_enc_mask(5, []).all()
    # A leading 0 only adds an empty first chunk: same mask as without it, for any window.
    for left, right in [(0, 0), (1, 0), (0, 1), (2, 2)]:
        np.testing.assert_array_equal(
            adaptive_enc_mask(9, [0, 3, 5], left, right), adaptive_enc_mask(9, [3, 5], left, right)
        )
    # A start at x_len makes an empty last chunk.
    np.testing.assert_array_equal(adaptive_enc_mask(4, [2, 4]), adaptive_enc_mask(4, [2]))
    assert streaming_mask(6, 2, -1, 18).all()
    assert streaming_mask(6, 2, 0, 0).all()
    assert streaming_mask(6, 2, 100, 0).all()
    assert streaming_mask(0, 3, 4, 1).shape == (3, 0, 0)
    assert streaming_mask(4, 0, 4, 1).shape == (0, 4, 4)
    assert hs_mask([], 16, 2, 1).shape == (0, 2, 2)
    assert hs_mask([0, 0], 0, 2, 1).shape == (2, 0, 0)
    assert not hs_mask([0], 9, 2, 1).any()
    assert TIME_REDUCTION == 8


@st.composite
def chunk_starts(draw):
    """(x_len, strictly increasing starts within [0, x_len]); may or may not include 0 or x_len."""
    x_len = draw(st.integers(0, 40))
    starts = draw(st.sets(st.integers(0, x_len), max_size=x_len + 1))
    return x_len, sorted(starts)


@given(case=chunk_starts(), left=st.integers(0, 6), right=st.integers(0, 6), as_array=st.booleans())
def test_adaptive_enc_mask_matches_loop(mask_reference, assert_builds, case, left, right, as_array):
    x_len, starts = case
    expected = mask_reference.adaptive_enc_mask(x_len, starts, left, right)
    cs = np.array(starts, dtype=np.int64) if as_array else starts
    assert_builds(lambda out=None: adaptive_enc_mask(x_len, cs, left, right, out=out), expected)


@given(
    seq_len=st.integers(0, 40),
    batch_size=st.integers(0, 3),
    chunk_size=st.integers(-2, 50),
    left_chunk=st.integers(0, 12) | st.just(10**9),
)
def test_streaming_mask_matches_loop(mask_reference, assert_builds, seq_len, batch_size, chunk_size, left_chunk):
    expected = mask_reference.streaming_mask(seq_len, batch_size, chunk_size, left_chunk)
    assert_builds(lambda out=None: streaming_mask(seq_len, batch_size, chunk_size, left_chunk, out=out), expected)


def test_streaming_mask_realistic_sizes(mask_reference):
    # Realistic sizes (Phi-4MM streaming config), every batch row written.
    for seq_len in (300, 1100):
        expected = mask_reference.subsequent_chunk_mask(seq_len, 16, 18)
        mask = streaming_mask(seq_len, 3, 16, 18)
        for b in range(3):
            np.testing.assert_array_equal(mask[b], expected)


@st.composite
def hs_cases(draw):
    lengths = draw(st.lists(st.integers(0, 120), max_size=4))
    max_frames = max(lengths, default=0) + draw(st.integers(0, 20))
    return lengths, max_frames


@given(
    case=hs_cases(),
    chunk_size=st.integers(-1, 20),
    left_chunk=st.integers(0, 6),
    time_reduction=st.integers(1, 10),
)
def test_hs_mask_matches_loop(mask_reference, assert_builds, case, chunk_size, left_chunk, time_reduction):
    lengths, max_frames = case
    expected = mask_reference.hs_mask(lengths, max_frames, chunk_size, left_chunk, time_reduction)
    assert_builds(
        lambda out=None: hs_mask(lengths, max_frames, chunk_size, left_chunk, time_reduction, out=out), expected
    )


@given(lengths=st.lists(st.integers(0, 10**6), max_size=6), time_reduction=st.integers(1, 16))
def test_subsampled_lengths_is_ceil(mask_reference, lengths, time_reduction):
    got = subsampled_lengths(lengths, time_reduction)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, mask_reference.subsampled_lengths(lengths, time_reduction))


def test_select_chunk_size_integers_pass_through():
    assert select_chunk_size(16, 18) == (16, 18)
    assert select_chunk_size(np.int64(-1), 0) == (-1, 0)
    assert all(type(v) is int for v in select_chunk_size(np.int32(8), np.int64(4)))


def test_select_chunk_size_lists_draw_one_aligned_pair():
    sizes, lefts = [6, 8, 12, 24], [12, 9, 6, 3]
    pairs = set(zip(sizes, lefts))
    drawn = [select_chunk_size(sizes, lefts, np.random.default_rng(seed)) for seed in range(64)]
    assert set(drawn) == pairs  # every pair reachable, never a mixed one
    # Reproducible with a seeded generator; numpy arrays and tuples work like lists.
    first = [select_chunk_size(sizes, lefts, np.random.default_rng(7)) for _ in range(3)]
    assert first == [first[0]] * 3
    assert select_chunk_size(np.array(sizes), tuple(lefts), np.random.default_rng(7)) == first[0]
    assert select_chunk_size([5], [2]) == (5, 2)


@pytest.mark.parametrize(
    ("call", "name", "value"),
    [
        (lambda: select_chunk_size([8, 16], [18]), "left_chunk", "[18]"),
        (lambda: select_chunk_size([8, 16], 18), "left_chunk", "18"),
        (lambda: select_chunk_size(8, [18]), "left_chunk", "[18]"),
        (lambda: select_chunk_size([], []), "chunk_size", "[]"),
        (lambda: select_chunk_size([8, 2.5], [1, 2]), "chunk_size[1]", "2.5"),
        (lambda: select_chunk_size([8], [-1]), "left_chunk[0]", "-1"),
        (lambda: select_chunk_size(8.0, 1), "chunk_size", "8.0"),
        (lambda: select_chunk_size("16", 1), "chunk_size", "'16'"),
        (lambda: select_chunk_size(8, -1), "left_chunk", "-1"),
        (lambda: select_chunk_size([8], [1], rng=np.random.RandomState(0)), "rng", "RandomState"),
        (lambda: adaptive_enc_mask(-1, []), "x_len", "-1"),
        (lambda: adaptive_enc_mask(6.0, [0]), "x_len", "6.0"),
        (lambda: adaptive_enc_mask(6, [0, 4, 2]), "chunk_start_idx", "4 then 2"),
        (lambda: adaptive_enc_mask(6, [0, 2, 2]), "chunk_start_idx", "2 then 2"),
        (lambda: adaptive_enc_mask(6, [0, 7]), "chunk_start_idx", "7"),
        (lambda: adaptive_enc_mask(6, [-1, 2]), "chunk_start_idx", "-1"),
        (lambda: adaptive_enc_mask(6, [0.0, 2.5]), "chunk_start_idx", "2.5"),
        (lambda: adaptive_enc_mask(6, [[0, 2]]), "chunk_start_idx", "(1, 2)"),
        (lambda: adaptive_enc_mask(6, [[0, 2], [4]]), "chunk_start_idx", "[[0, 2], [4]]"),
        (lambda: hs_mask([[4, 8], [16]], 32, 2, 1), "feature_lengths", "[[4, 8], [16]]"),
        (lambda: adaptive_enc_mask(6, [0, 2], left_window=-1), "left_window", "-1"),
        (lambda: adaptive_enc_mask(6, [0, 2], right_window=0.5), "right_window", "0.5"),
        (lambda: streaming_mask(-3, 1, 2, 1), "seq_len", "-3"),
        (lambda: streaming_mask(4, -1, 2, 1), "batch_size", "-1"),
        (lambda: streaming_mask(4, 1, 2.0, 1), "chunk_size", "2.0"),
        (lambda: streaming_mask(4, 1, 2, -1), "left_chunk", "-1"),
        (lambda: hs_mask([40, 17], 32, 2, 1), "feature_lengths", "40"),
        (lambda: hs_mask([4, -2], 32, 2, 1), "feature_lengths", "-2"),
        (lambda: hs_mask([4.5], 32, 2, 1), "feature_lengths", "4.5"),
        (lambda: hs_mask([4], -8, 2, 1), "max_frames", "-8"),
        (lambda: hs_mask([4], 8, 2, 1, time_reduction=0), "time_reduction", "0"),
        (lambda: hs_mask([4], 8, 2, -4), "left_chunk", "-4"),
        (lambda: hs_mask([4], 8, None, 1), "chunk_size", "None"),
        (lambda: subsampled_lengths([4], time_reduction=0), "time_reduction", "0"),
        (lambda: subsampled_lengths([4], time_reduction=2.0), "time_reduction", "2.0"),
        (lambda: subsampled_lengths([-4]), "feature_lengths", "-4"),
    ],
)
def test_bad_arguments_name_argument_and_value(call, name, value):
    with pytest.raises(ValueError, match=re.escape(name) + ".*" + re.escape(value)):
        call()
