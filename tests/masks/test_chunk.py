"""audiomask.masks.chunk against WeNet's loops, plus its argument checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from audiomask.masks.chunk import padding_mask, subsequent_chunk_mask

sizes = st.integers(0, 40)


def test_wenet_example_limited_left_context(mask_reference):
    # WeNet's docstring example: subsequent_chunk_mask(4, 2) -> two chunks, unlimited left.
    expected = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(subsequent_chunk_mask(4, 2), expected)
    np.testing.assert_array_equal(subsequent_chunk_mask(7, 3, 1), mask_reference.subsequent_chunk_mask(7, 3, 1))


def test_edge_sizes():
    assert subsequent_chunk_mask(0, 3).shape == (0, 0)
    np.testing.assert_array_equal(subsequent_chunk_mask(1, 3), [[True]])
    # A chunk longer than the sequence is one chunk: full attention.
    assert subsequent_chunk_mask(5, 100, 0).all()
    # More left chunks than exist (even absurdly many) means unlimited, without a huge allocation.
    np.testing.assert_array_equal(subsequent_chunk_mask(9, 2, 10**18), subsequent_chunk_mask(9, 2, -1))
    assert padding_mask([]).shape == (0, 0)
    assert padding_mask([], max_len=3).shape == (0, 3)
    np.testing.assert_array_equal(padding_mask([0, 0]), np.zeros((2, 0), dtype=bool))


@given(size=sizes, chunk_size=st.integers(1, 50), num_left_chunks=st.integers(-3, 12))
def test_subsequent_chunk_mask_matches_loop(mask_reference, assert_builds, size, chunk_size, num_left_chunks):
    expected = mask_reference.subsequent_chunk_mask(size, chunk_size, num_left_chunks)
    assert_builds(lambda out=None: subsequent_chunk_mask(size, chunk_size, num_left_chunks, out=out), expected)


@given(lengths=st.lists(st.integers(0, 30), max_size=6), extra=st.none() | st.integers(0, 5))
def test_padding_mask_matches_loop(mask_reference, assert_builds, lengths, extra):
    max_len = None if extra is None else max(lengths, default=0) + extra
    expected = mask_reference.padding_mask(lengths, max_len)
    assert_builds(lambda out=None: padding_mask(np.array(lengths, dtype=np.int32), max_len, out=out), expected)


@pytest.mark.parametrize(
    ("call", "name", "value"),
    [
        (lambda: subsequent_chunk_mask(-1, 2), "size", "-1"),
        (lambda: subsequent_chunk_mask(2.5, 2), "size", "2.5"),
        (lambda: subsequent_chunk_mask(True, 2), "size", "True"),
        (lambda: subsequent_chunk_mask(4, 0), "chunk_size", "0"),
        (lambda: subsequent_chunk_mask(4, -2), "chunk_size", "-2"),
        (lambda: subsequent_chunk_mask(4, "2"), "chunk_size", "'2'"),
        (lambda: subsequent_chunk_mask(4, 2, 1.5), "num_left_chunks", "1.5"),
        (lambda: padding_mask([3, -1]), "lengths", "-1"),
        (lambda: padding_mask([1.5]), "lengths", "1.5"),
        (lambda: padding_mask([[1, 2]]), "lengths", "(1, 2)"),
        (lambda: padding_mask([[1, 2], [3]]), "lengths", "[[1, 2], [3]]"),
        (lambda: padding_mask([5, 2], max_len=4), "lengths", "5"),
        (lambda: padding_mask([1], max_len=-1), "max_len", "-1"),
        (lambda: padding_mask([1], max_len=2.0), "max_len", "2.0"),
    ],
)
def test_bad_arguments_name_argument_and_value(call, name, value):
    with pytest.raises(ValueError, match=re.escape(name) + ".*" + re.escape(value)):
        call()
