"""WeNet-style chunk masks: ``subsequent_chunk_mask`` and the padding mask.

Mirrors ``wenet/utils/mask.py`` (``subsequent_chunk_mask``, ``make_pad_mask``
with the polarity flipped to True = valid). Polarity: ``True`` = the query row
MAY attend to the key column. numpy only. Built on :mod:`audiomask.masks.band`,
whose allocation bound (:func:`max_mask_bytes`) applies here too.
"""

from __future__ import annotations

import numpy as np

from audiomask.checks import check_int, check_lengths
from audiomask.masks.band import (
    DEFAULT_MAX_MASK_BYTES,
    max_mask_bytes,
    regular_band,
    result_array,
    set_max_mask_bytes,
    write_less_than_rows,
)

__all__ = ["DEFAULT_MAX_MASK_BYTES", "max_mask_bytes", "padding_mask", "set_max_mask_bytes", "subsequent_chunk_mask"]


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
    return regular_band(size, chunk_size, num_left_chunks, result_array(out, (size, size), "size"))


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
    out = result_array(out, (lengths.size, max_len), "lengths and max_len")
    if out.size:  # (0, T) or (B, 0): no template of T columns for nothing
        write_less_than_rows(lengths, out)
    return out
