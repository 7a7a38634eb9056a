"""WeNet-style chunk masks, and the block-band builder every mask here is made of.

Mirrors ``wenet/utils/mask.py`` (``subsequent_chunk_mask``, ``make_pad_mask``
with the polarity flipped to True = valid). Polarity: ``True`` = the query row
MAY attend to the key column. numpy only.

Every chunk mask in this package is a *block band*: the rows (queries) are cut
into consecutive chunks, and all rows of chunk ``k`` see the same half-open
column range ``[lo[k], hi[k])``. Two builders exploit that, never comparing
all ``T_q x T_k`` cells:

- ``_chunk_band`` (any chunk boundaries): one row
  pattern per chunk (``n_chunks x T_k``, itself gathered from a step template),
  then one ``np.take`` of rows into the output.
- ``_regular_band`` (equal chunks, the streaming hot path): the first batch
  row is one broadcast copy of a strided view of a tiny template, the other
  rows block copies of it.
"""

from __future__ import annotations

import numpy as np

from audiomask._validate import check_int, check_lengths, check_out

__all__ = ["padding_mask", "subsequent_chunk_mask"]

# Template of ones then zeros; row ``r`` of a stride-(1, 1) view is ``_STEP[r:r + width]``.
# Kept between calls (read-only, replaced when too short, never written) so a mask
# build allocates nothing but its result and the small per-chunk pattern.
_STEP = np.zeros(0, dtype=np.bool_)
_STEP_MIN_CAPACITY = 1024  # columns; the first call allocates at least this much


def _output(out: np.ndarray | None, shape: tuple[int, ...], dtype: type = np.bool_) -> np.ndarray:
    """A fresh array when ``out`` is None, else ``out`` once checked to take the result in place."""
    return np.empty(shape, dtype) if out is None else check_out(out, shape, dtype)


def _less_than_rows(bounds: np.ndarray, width: int) -> np.ndarray:
    """``(n, width)`` bool, row ``k`` = ``arange(width) < bounds[k]``; needs ``0 <= bounds <= width``.

    Each row is a copied window of the step template: a gather of ``n`` rows,
    with no comparison per cell.
    """
    global _STEP
    step = _STEP
    capacity = step.size // 2
    if capacity < width:
        capacity = max(width, 2 * capacity, _STEP_MIN_CAPACITY)
        step = np.concatenate([np.ones(capacity, np.bool_), np.zeros(capacity, np.bool_)])
        step.flags.writeable = False
        _STEP = step
    # Row r is step[r:r + width]: True where r + j < capacity, i.e. j < capacity - r.
    windows = np.ndarray((capacity + 1, width), np.bool_, step, 0, (1, 1))
    return windows[capacity - bounds]


def _chunk_band(
    bounds: np.ndarray,
    left: int,
    right: int,
    out: np.ndarray,
) -> np.ndarray:
    """Write a chunked band mask with arbitrary chunk boundaries into ``out`` and return it.

    ``bounds`` (int64, ``(n + 1,)``, non-decreasing, ``bounds[0] == 0``,
    ``bounds[-1] == T``) cuts the rows into chunks ``[bounds[k], bounds[k+1])``;
    empty chunks are allowed and count as chunks. Rows of chunk ``k`` see the
    columns ``[bounds[max(k - left, 0)], bounds[min(k + 1 + right, n)])``.
    ``out`` is ``(T, T)``.
    """
    n = bounds.size - 1
    width = out.shape[-1]
    left, right = min(left, n), min(right, n)  # beyond n chunks they change nothing; keeps int64 safe
    chunk = np.arange(n)
    lo_hi = np.concatenate([bounds[np.maximum(chunk - left, 0)], bounds[np.minimum(chunk + (right + 1), n)]])
    rows = _less_than_rows(lo_hi, width)  # one gather for both edges
    pattern = np.greater(rows[n:], rows[:n])  # (j < hi) & ~(j < lo)
    row_chunk = np.repeat(chunk, np.diff(bounds))
    # mode="clip": the default "raise" buffers `out` and copies it a second
    # time; row_chunk is in range by construction.
    return np.take(pattern, row_chunk, axis=0, out=out, mode="clip")


def _regular_band(size: int, chunk_size: int, left: int, out: np.ndarray) -> np.ndarray:
    """Write the band of equal chunks (WeNet ``subsequent_chunk_mask``) into ``out`` and return it.

    Rows of chunk ``k = i // chunk_size`` see columns
    ``[max((k - left) * chunk_size, 0), min((k + 1) * chunk_size, size))``;
    ``left < 0`` means no left limit. ``out`` is ``(size, size)`` or
    ``(B, size, size)`` (the same mask in every batch row).

    The hot path of streaming: with equal chunks every row is the same
    window of one small template, shifted by ``chunk_size`` per chunk, so the
    first batch row is one broadcast copy of a strided view (stride ``-chunk_size``
    over chunks, 0 over the rows of a chunk) that stays in L1 cache, and the
    other batch rows are block copies of it: no per-chunk pattern, no index
    array, one write of the output.
    """
    if out.size == 0:
        return out
    chunk_size = min(chunk_size, size)  # a longer chunk is one chunk all the same
    n_chunks = -(-size // chunk_size)
    # Ones over the visible span (left chunks + own chunk) of every row; more
    # left chunks than exist, or left < 0, reach back to column 0 from anywhere.
    span = (n_chunks if left < 0 else min(left + 1, n_chunks)) * chunk_size
    lead = n_chunks * chunk_size - span  # keeps the last chunk's window start >= 0
    template = np.zeros(lead + span - chunk_size + size, np.bool_)
    template[lead : lead + span] = True
    # Chunk k reads template[first - k * chunk_size + j]: True for (k+1)c - span <= j < (k+1)c.
    first = lead + span - chunk_size
    batched = out.reshape((-1, size, size))
    mask = batched[0]
    n_full = size // chunk_size
    full = np.ndarray((n_full, chunk_size, size), np.bool_, template, first, (-chunk_size, 0, 1))
    np.copyto(mask[: n_full * chunk_size].reshape((n_full, chunk_size, size)), full)
    if n_full < n_chunks:  # the shorter last chunk
        start = first - n_full * chunk_size
        mask[n_full * chunk_size :] = template[start : start + size]
    # Every batch row is the same mask: a contiguous block copy per row is
    # faster than re-reading the strided template row by row (~1.4x at L=375).
    batched[1:] = mask
    return out


def subsequent_chunk_mask(
    size: int,
    chunk_size: int,
    num_left_chunks: int = -1,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Chunk-causal self-attention mask, WeNet's ``subsequent_chunk_mask``.

    Query frame ``i`` lies in chunk ``c = i // chunk_size`` and may attend to
    key frames ``max((c - num_left_chunks) * chunk_size, 0) <= j <
    min((c + 1) * chunk_size, size)``: its own chunk, ``num_left_chunks``
    chunks before it, nothing after. ``num_left_chunks < 0`` means unlimited
    left context. A ``chunk_size`` larger than ``size`` gives one chunk (full
    attention); ``size == 0`` gives a ``(0, 0)`` mask.

    Args:
        size: sequence length ``T`` in frames (the unit of ``chunk_size``), ``>= 0``.
        chunk_size: frames per chunk, ``>= 1``.
        num_left_chunks: chunks of left context; ``< 0`` = unlimited.
        out: optional C-contiguous ``bool`` array of shape ``(T, T)`` to write into.

    Returns:
        ``(T_q, T_k) = (size, size)`` C-contiguous ``bool``; ``True`` = may attend.

    >>> subsequent_chunk_mask(5, 2).astype(int)
    array([[1, 1, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [1, 1, 1, 1, 0],
           [1, 1, 1, 1, 0],
           [1, 1, 1, 1, 1]])
    >>> subsequent_chunk_mask(5, 2, num_left_chunks=0).astype(int)
    array([[1, 1, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [0, 0, 1, 1, 0],
           [0, 0, 1, 1, 0],
           [0, 0, 0, 0, 1]])
    """
    size = check_int("size", size, minimum=0)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    num_left_chunks = check_int("num_left_chunks", num_left_chunks)
    return _regular_band(size, chunk_size, num_left_chunks, _output(out, (size, size)))


def padding_mask(
    lengths: object,
    max_len: int | None = None,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Validity of padded positions: ``mask[b, t] = t < lengths[b]``.

    WeNet's ``make_non_pad_mask`` (``~make_pad_mask``). Used as a key mask it
    reads "may attend to key ``t``".

    Args:
        lengths: ``(B,)`` non-negative integers, in frames (or tokens).
        max_len: padded length ``T``; defaults to ``max(lengths)`` (0 when
            ``B == 0``). A length above ``max_len`` is an error, not truncated.
        out: optional C-contiguous ``bool`` array of shape ``(B, T)`` to write into.

    Returns:
        ``(B, T)`` C-contiguous ``bool``; ``True`` = valid (not padding).

    >>> padding_mask([3, 1, 0], max_len=4).astype(int)
    array([[1, 1, 1, 0],
           [1, 0, 0, 0],
           [0, 0, 0, 0]])
    """
    if max_len is None:
        lengths = check_lengths("lengths", lengths)
        max_len = int(lengths.max()) if lengths.size else 0
    else:
        max_len = check_int("max_len", max_len, minimum=0)
        lengths = check_lengths("lengths", lengths, maximum=max_len, maximum_name="max_len")
    out = _output(out, (lengths.size, max_len))
    out[...] = _less_than_rows(lengths, max_len)
    return out
