"""Peak memory of the mask builders, traced with tracemalloc (numpy reports its allocations to it).

A builder allocates its result (unless given ``out=``) plus a few MiB of
row blocks and ``O(T)`` indices, never ``O(T_q * T_k)`` temporaries: one-token
chunks or windows (one chunk per row, the most a band can have) must not
cost more than regular ones.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from audiomask.masks import chunk, phi4mm, qwen3_asr

TOKENS = 4000  # a (4000, 4000) bool mask holds 16 MB
EXTRA_BYTES = 4 * 2**20  # what a build may allocate besides its result: a few blocks of rows and the indices


def traced_peak(build: Callable[[], np.ndarray]) -> tuple[np.ndarray, int]:
    """``build()``'s result and the peak bytes it allocated, as tracemalloc traced them."""
    tracemalloc.start()
    try:
        result = build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def one_token_chunks(out: np.ndarray | None) -> np.ndarray:
    """Every token its own chunk, seeing one chunk back: ``T`` chunks of one row."""
    return phi4mm.adaptive_enc_mask(TOKENS, np.arange(1, TOKENS), left_window=1, out=out)


def one_token_windows(out: np.ndarray | None) -> np.ndarray:
    """Qwen3-ASR windows of one token: 2-frame conv chunks of 1 token, windows of one chunk."""
    return qwen3_asr.window_mask([2 * TOKENS], n_window=1, n_window_infer=2, out=out)


def one_row_band() -> np.ndarray:
    """The expected ``one_token_chunks`` mask: row ``i`` sees ``[i - 1, i]``."""
    return np.eye(TOKENS, dtype=bool) | np.eye(TOKENS, k=-1, dtype=bool)


@pytest.mark.parametrize(
    ("build", "expected"),
    [(one_token_chunks, one_row_band), (one_token_windows, lambda: np.eye(TOKENS, dtype=bool))],
    ids=["adaptive_enc_mask", "window_mask"],
)
def test_one_token_chunks_allocate_no_cell_sized_temporaries(build, expected):
    out = np.zeros((TOKENS, TOKENS), np.bool_)
    written, peak_in_place = traced_peak(lambda: build(out))
    assert written is out
    np.testing.assert_array_equal(out, expected())
    result, peak = traced_peak(lambda: build(None))
    np.testing.assert_array_equal(result, out)
    assert peak_in_place < EXTRA_BYTES
    assert peak < result.nbytes + EXTRA_BYTES


def test_padding_mask_allocates_its_result_only():
    lengths = np.arange(TOKENS)
    result, peak = traced_peak(lambda: chunk.padding_mask(lengths, TOKENS))
    assert result[TOKENS - 1, TOKENS - 2] and not result[TOKENS - 1, TOKENS - 1] and not result[0].any()
    assert peak < result.nbytes + EXTRA_BYTES
