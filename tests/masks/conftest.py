"""Fixtures of the mask tests: plain-loop references, the ``out=`` contract check, allocation bounds.

All are session-scoped factories or namespaces (hypothesis runs each
property many times inside one test call).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from audiomask.masks import set_max_mask_bytes

# ---- plain-loop references, written from the specification ----
# Slow on purpose: one Python statement per cell or per chunk, transcribed from WeNet's
# ``mask.py`` and upstream's definitions, so that a test compares the vectorised builders
# against something obviously right. Polarity: True = may attend / valid.


def _adaptive_enc_mask(x_len, chunk_start_idx, left_window=0, right_window=0):
    cs = [int(c) for c in chunk_start_idx]
    starts = [0] + cs
    ends = cs + [x_len]
    n = len(cs)
    mask = np.zeros((x_len, x_len), dtype=bool)
    for i in range(x_len):
        k = next(k for k in range(n + 1) if starts[k] <= i < ends[k])
        lo = starts[max(k - left_window, 0)]
        hi = ends[min(k + right_window, n)]
        for j in range(x_len):
            mask[i, j] = lo <= j < hi
    return mask


def _subsequent_chunk_mask(size, chunk_size, num_left_chunks=-1):
    """WeNet's loop, verbatim in numpy."""
    mask = np.zeros((size, size), dtype=bool)
    for i in range(size):
        if num_left_chunks < 0:
            start = 0
        else:
            start = max((i // chunk_size - num_left_chunks) * chunk_size, 0)
        ending = min((i // chunk_size + 1) * chunk_size, size)
        mask[i, start:ending] = True
    return mask


def _padding_mask(lengths, max_len=None):
    lengths = [int(n) for n in lengths]
    if max_len is None:
        max_len = max(lengths, default=0)
    mask = np.zeros((len(lengths), max_len), dtype=bool)
    for b, n in enumerate(lengths):
        for t in range(max_len):
            mask[b, t] = t < n
    return mask


def _streaming_mask(seq_len, batch_size, chunk_size, left_chunk):
    if chunk_size <= 0:
        one = np.ones((seq_len, seq_len), dtype=bool)
    else:
        one = _adaptive_enc_mask(seq_len, list(range(0, seq_len, chunk_size)), left_window=left_chunk)
    mask = np.zeros((batch_size, seq_len, seq_len), dtype=bool)
    for b in range(batch_size):
        mask[b] = one
    return mask


def _subsampled_lengths(feature_lengths, time_reduction=8):
    return np.array([math.ceil(int(n) / time_reduction) for n in feature_lengths], dtype=np.int64)


def _hs_mask(feature_lengths, max_frames, chunk_size, left_chunk, time_reduction=8):
    seq_len = math.ceil(max_frames / time_reduction)
    stream = _streaming_mask(seq_len, len(feature_lengths), chunk_size, left_chunk)
    valid = _subsampled_lengths(feature_lengths, time_reduction)
    for b in range(len(feature_lengths)):
        for j in range(seq_len):
            if j >= valid[b]:
                stream[b, :, j] = False
    return stream


# Qwen3-ASR: chunks of 2 * n_window frames, each through three k=3 s=2 p=1 convs.


def _conv_length(frames):
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def _qwen_chunk_lengths(feature_lens, n_window=50):
    chunk = 2 * n_window
    pieces = []
    for total in feature_lens:
        total = int(total)
        while total > 0:
            pieces.append(min(chunk, total))
            total -= chunk
    return np.array(pieces, dtype=np.int64)


def _qwen_output_lengths(feature_lens, n_window=50):
    """Tokens the encoder packs: the sum of the conv lengths of the utterance's chunks."""
    return np.array(
        [sum(_conv_length(c) for c in _qwen_chunk_lengths([n], n_window)) for n in feature_lens], dtype=np.int64
    )


def _qwen_padded_mask_after_cnn(feature_lens, n_window=50):
    return _padding_mask([_conv_length(c) for c in _qwen_chunk_lengths(feature_lens, n_window)])


def _qwen_window_lengths(feature_lens, n_window=50, n_window_infer=800):
    window = _conv_length(2 * n_window) * (n_window_infer // (2 * n_window))
    windows = []
    for tokens in _qwen_output_lengths(feature_lens, n_window):
        tokens = int(tokens)
        while tokens > 0:
            windows.append(min(window, tokens))
            tokens -= window
    return windows


def _qwen_cu_seqlens(feature_lens, n_window=50, n_window_infer=800):
    cu = [0]
    for w in _qwen_window_lengths(feature_lens, n_window, n_window_infer):
        cu.append(cu[-1] + w)
    return np.array(cu, dtype=np.int32)


def _qwen_window_mask(feature_lens, n_window=50, n_window_infer=800):
    window_of = []
    for k, w in enumerate(_qwen_window_lengths(feature_lens, n_window, n_window_infer)):
        window_of += [k] * w
    n = len(window_of)
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(n):
            mask[i, j] = window_of[i] == window_of[j]
    return mask


@pytest.fixture(scope="session")
def mask_reference() -> SimpleNamespace:
    """The plain-loop references, named as the builders they check (Qwen3-ASR's with a ``qwen_`` prefix)."""
    return SimpleNamespace(
        adaptive_enc_mask=_adaptive_enc_mask,
        subsequent_chunk_mask=_subsequent_chunk_mask,
        padding_mask=_padding_mask,
        streaming_mask=_streaming_mask,
        subsampled_lengths=_subsampled_lengths,
        hs_mask=_hs_mask,
        qwen_chunk_lengths=_qwen_chunk_lengths,
        qwen_output_lengths=_qwen_output_lengths,
        qwen_padded_mask_after_cnn=_qwen_padded_mask_after_cnn,
        qwen_cu_seqlens=_qwen_cu_seqlens,
        qwen_window_mask=_qwen_window_mask,
    )


# ---- the out= contract ----


def _assert_builds(build: Callable[..., np.ndarray], expected: np.ndarray) -> None:
    """``build(out=None)`` and ``build(out=...)`` both give ``expected`` exactly, as the contract says.

    Checks dtype, shape, C-contiguity and values of a fresh result; then that
    ``out=`` is written in place (poisoned first with values differing from
    ``expected`` in every cell, so a cell left unwritten shows) and returned;
    then that an ``out`` of the wrong shape, dtype, layout or writeability
    raises ``ValueError`` naming ``out``.
    """
    got = build()
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.flags.c_contiguous and got.flags.writeable  # a dense array, not a broadcast view
    np.testing.assert_array_equal(got, expected)

    out = np.empty_like(expected)
    out[...] = ~expected if expected.dtype == np.bool_ else expected + 1
    assert build(out=out) is out
    np.testing.assert_array_equal(out, expected)

    wrong_shape = np.empty(expected.shape[:-1] + (expected.shape[-1] + 1,), expected.dtype)
    wrong_dtype = np.empty(expected.shape, np.uint8 if expected.dtype == np.bool_ else np.int64)
    read_only = np.empty_like(expected)
    read_only.flags.writeable = False
    bad_outs = [wrong_shape, wrong_dtype, read_only, list(expected)]
    if expected.size > 1:  # a strided view of fewer elements is still contiguous
        bad_outs.append(np.empty(expected.shape[:-1] + (2 * expected.shape[-1],), expected.dtype)[..., ::2])
    for bad in bad_outs:
        with pytest.raises(ValueError, match="out"):
            build(out=bad)


@pytest.fixture(scope="session")
def assert_builds() -> Callable[[Callable[..., np.ndarray], np.ndarray], None]:
    """``assert_builds(build, expected)``: ``build(out=None)`` and ``build(out=...)`` both give ``expected``."""
    return _assert_builds


# ---- allocation bounds ----


@contextlib.contextmanager
def _mask_bound(limit: int) -> Iterator[None]:
    previous = set_max_mask_bytes(limit)
    try:
        yield
    finally:
        set_max_mask_bytes(previous)


@pytest.fixture(scope="session")
def mask_bound() -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """``with mask_bound(limit):`` the builders' allocation bound is ``limit`` bytes, then restored."""
    return _mask_bound
