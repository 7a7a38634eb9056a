"""The block-band builders every mask here is made of, and the bound on what a builder allocates.

Every chunk mask in :mod:`audiomask.masks` is a *block band*: the rows
(queries) are cut into consecutive chunks, and all rows of chunk ``k`` see the
same half-open column range ``[lo[k], hi[k])``. Two builders exploit that,
never comparing all ``T_q x T_k`` cells:

- :func:`chunk_band` (any chunk boundaries): block by block of rows, one row
  pattern per chunk of the block (gathered from a step template), then one
  ``np.take`` of those rows into the block.
- :func:`regular_band` (equal chunks, the streaming hot path): the first batch
  row is one broadcast copy of a strided view of a tiny template, the other
  rows block copies of it.

Polarity: ``True`` = the query row MAY attend to the key column. numpy only.

Allocation bound: a builder refuses, before allocating, a result larger than
:func:`max_mask_bytes` (default :data:`DEFAULT_MAX_MASK_BYTES`, 1 GiB), with a
``ValueError`` naming the arguments that set its size, so hostile or mistaken
lengths cannot exhaust memory. Temporaries are a few blocks of rows
(:data:`BAND_BLOCK_BYTES` each) plus ``O(T + n_chunks)`` indices, whatever
the result's size, so the peak is the result plus a few MiB, and with
``out=`` only those few MiB. Raise the bound with :func:`set_max_mask_bytes`,
or pass ``out=`` (the caller's own array is never refused).

These are the building blocks of the mask modules; the package exports only
the bound (``audiomask.masks.max_mask_bytes`` and ``set_max_mask_bytes``).
"""

from __future__ import annotations

import math

import numpy as np

from audiomask.checks import check_int, check_out

__all__ = [
    "BAND_BLOCK_BYTES",
    "DEFAULT_MAX_MASK_BYTES",
    "check_alloc",
    "chunk_band",
    "less_than_rows",
    "max_mask_bytes",
    "regular_band",
    "result_array",
    "set_max_mask_bytes",
    "write_less_than_rows",
]

# A (32768, 32768) bool mask: full attention over 44 minutes of Phi-4MM tokens (80 ms each), or
# a batch of 477 masks of 1,500 tokens (2 minutes). Larger is a bug or a hostile length.
DEFAULT_MAX_MASK_BYTES = 2**30
_max_mask_bytes = DEFAULT_MAX_MASK_BYTES

# Template of ones then zeros; row ``r`` of a stride-(1, 1) view is ``_STEP[r:r + width]``.
# Kept between calls (read-only, replaced when too short, never written) so a mask
# build allocates nothing but its result and the small per-chunk pattern.
_STEP = np.zeros(0, dtype=np.bool_)
_STEP_MIN_CAPACITY = 1024  # columns; the first call allocates at least this much
# Widths up to this are served from the kept template; wider rows (rare: a padding mask
# of over 2^20 frames) get a template of their own, so no hostile width stays allocated.
_STEP_MAX_KEPT = 2**20
# Rows of a block band are written this many bytes at a time (at least one row): the per-chunk
# patterns of a block stay in cache, and a build's temporaries stay a few blocks whatever its size.
BAND_BLOCK_BYTES = 2**20


def max_mask_bytes() -> int:
    """The largest result, in bytes, a mask builder allocates (``out=`` arrays are not bounded).

    >>> max_mask_bytes() == DEFAULT_MAX_MASK_BYTES
    True
    """
    return _max_mask_bytes


def set_max_mask_bytes(limit: int) -> int:
    """Set the bound :func:`max_mask_bytes` (bytes, ``>= 0``) for every builder; return the previous one.

    Process-wide, like numpy's print options.

    >>> previous = set_max_mask_bytes(100)
    >>> check_alloc("size", (11, 11))
    Traceback (most recent call last):
    ...
    ValueError: size gives a (11, 11) bool array of 121 bytes, more than max_mask_bytes() = 100; pass out= or raise the bound with audiomask.masks.set_max_mask_bytes
    >>> set_max_mask_bytes(previous)
    100
    """
    global _max_mask_bytes
    previous = _max_mask_bytes
    _max_mask_bytes = check_int("limit", limit, minimum=0)
    return previous


def check_alloc(names: str, shape: tuple[int, ...], dtype: type = np.bool_) -> None:
    """Refuse, before allocating, an array of ``shape`` and ``dtype`` larger than :func:`max_mask_bytes`.

    ``names``: the arguments that set ``shape``, quoted in the ``ValueError``.
    Sizes are Python integers, so no product overflows.
    """
    itemsize = np.dtype(dtype).itemsize
    nbytes = math.prod(shape) * itemsize
    # An empty array is refused too when its other dimensions alone exceed the bound: numpy
    # refuses (0, 2^32, 2^32) itself ("array is too big"), and one more row would be refused here.
    span = math.prod(max(n, 1) for n in shape) * itemsize
    if nbytes > _max_mask_bytes or span > _max_mask_bytes:
        size = f"{nbytes:,} bytes" if nbytes else f"0 bytes, but {span:,} bytes with one element on its empty axes"
        raise ValueError(
            f"{names} gives a {shape} {np.dtype(dtype)} array of {size}, more than "
            f"max_mask_bytes() = {_max_mask_bytes:,}; pass out= or raise the bound with "
            "audiomask.masks.set_max_mask_bytes"
        )


def result_array(out: np.ndarray | None, shape: tuple[int, ...], names: str, dtype: type = np.bool_) -> np.ndarray:
    """The array a builder writes its result into: ``out`` once checked, else a fresh one within the bound.

    Args:
        out: the caller's array (C-contiguous, writeable, exactly ``shape`` and
            ``dtype``; never bounded), or ``None``.
        shape: the result's shape.
        names: the arguments that set ``shape``, quoted when the bound refuses it.
        dtype: the result's dtype.

    Returns:
        ``out``, or an uninitialised ``np.empty(shape, dtype)``.
    """
    if out is not None:
        return check_out(out, shape, dtype)
    check_alloc(names, shape, dtype)
    return np.empty(shape, dtype)


def less_than_rows(bounds: np.ndarray, width: int) -> np.ndarray:
    """``(n, width)`` bool, row ``k`` = ``arange(width) < bounds[k]``; needs ``0 <= bounds <= width``.

    Each row is a copied window of the step template: a gather of ``n`` rows,
    with no comparison per cell.

    >>> less_than_rows(np.array([0, 2, 3]), 3).astype(int)
    array([[0, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    global _STEP
    step = _STEP
    capacity = step.size // 2
    if capacity < width:
        capacity = max(width, 2 * capacity, _STEP_MIN_CAPACITY)
        step = np.concatenate([np.ones(capacity, np.bool_), np.zeros(capacity, np.bool_)])
        step.flags.writeable = False
        if capacity <= _STEP_MAX_KEPT:
            _STEP = step
    # Row r is step[r:r + width]: True where r + j < capacity, i.e. j < capacity - r.
    windows = np.ndarray((capacity + 1, width), np.bool_, step, 0, (1, 1))
    return windows[capacity - bounds]


def _block_rows(width: int) -> int:
    """Rows of ``width`` bool columns in one block of :data:`BAND_BLOCK_BYTES` (at least one)."""
    return max(BAND_BLOCK_BYTES // max(width, 1), 1)


def write_less_than_rows(bounds: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write :func:`less_than_rows` ``(bounds, width)`` into ``out`` (bool ``(n, width)``) and return it.

    Written in blocks of about :data:`BAND_BLOCK_BYTES` of rows, so nothing
    but ``out`` and one block is allocated.

    >>> write_less_than_rows(np.array([1, 0]), np.empty((2, 2), bool)).astype(int)
    array([[1, 0],
           [0, 0]])
    """
    block_rows = _block_rows(out.shape[1])
    for start in range(0, bounds.size, block_rows):
        out[start : start + block_rows] = less_than_rows(bounds[start : start + block_rows], out.shape[1])
    return out


def chunk_band(bounds: np.ndarray, left: int, right: int, out: np.ndarray) -> np.ndarray:
    """Write a chunked band mask with arbitrary chunk boundaries into ``out`` and return it.

    ``bounds`` (int64, ``(n + 1,)``, non-decreasing, ``bounds[0] == 0``,
    ``bounds[-1] == T``) cuts the rows into chunks ``[bounds[k], bounds[k+1])``;
    empty chunks are allowed and count as chunks. Rows of chunk ``k`` see the
    columns ``[bounds[max(k - left, 0)], bounds[min(k + 1 + right, n)])``:
    ``left`` chunks back and ``right`` ahead, ``>= 0``. ``out`` is ``(T_q, T_k) = (T, T)`` bool.

    Written in blocks of about :data:`BAND_BLOCK_BYTES` of rows: the row
    patterns of the chunks a block spans, then one ``np.take`` of them into the
    block. Besides ``out`` it allocates ``O(n + T)`` indices and a few blocks.

    >>> chunk_band(np.array([0, 2, 3]), 0, 0, np.empty((3, 3), bool)).astype(int)
    array([[1, 1, 0],
           [1, 1, 0],
           [0, 0, 1]])
    """
    n = bounds.size - 1
    size, width = out.shape
    left, right = min(left, n), min(right, n)  # beyond n chunks they change nothing; keeps int64 safe
    chunk = np.arange(n)
    lo = bounds[np.maximum(chunk - left, 0)]
    hi = bounds[np.minimum(chunk + (right + 1), n)]
    row_chunk = np.repeat(chunk, np.diff(bounds))
    block_rows = _block_rows(width)
    for start in range(0, size, block_rows):
        stop = min(start + block_rows, size)
        first, last = int(row_chunk[start]), int(row_chunk[stop - 1]) + 1  # the chunks this block spans
        pattern = less_than_rows(lo[first:last], width)
        np.greater(less_than_rows(hi[first:last], width), pattern, out=pattern)  # (j < hi) & ~(j < lo)
        # mode="clip": the default "raise" buffers the block and copies it a
        # second time; the indices are in range by construction.
        np.take(pattern, row_chunk[start:stop] - first, axis=0, out=out[start:stop], mode="clip")
    return out


def regular_band(size: int, chunk_size: int, left: int, out: np.ndarray) -> np.ndarray:
    """Write the band of equal chunks (WeNet ``subsequent_chunk_mask``) into ``out`` and return it.

    Rows of chunk ``k = i // chunk_size`` (``chunk_size >= 1``) see columns
    ``[max((k - left) * chunk_size, 0), min((k + 1) * chunk_size, size))``;
    ``left < 0`` means no left limit. ``out`` is bool ``(T_q, T_k) = (size, size)``
    or ``(B, size, size)`` (the same mask in every batch row).

    The hot path of streaming: with equal chunks every row is the same
    window of one small template, shifted by ``chunk_size`` per chunk, so the
    first batch row is one broadcast copy of a strided view (stride ``-chunk_size``
    over chunks, 0 over the rows of a chunk) that stays in L1 cache, and the
    other batch rows are block copies of it: no per-chunk pattern, no index
    array, one write of the output.

    >>> regular_band(3, 2, 0, np.empty((3, 3), bool)).astype(int)
    array([[1, 1, 0],
           [1, 1, 0],
           [0, 0, 1]])
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
    # faster than re-reading the strided template row by row (figures:
    # docs/defaults.md).
    batched[1:] = mask
    return out
