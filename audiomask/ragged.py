"""Index arrays of a ragged batch: row ``b`` holds ``counts[b]`` items, flattened row after row. Numpy only.

One scatter or gather then moves every item of every row at once, whatever
the rows' lengths (features into a padded batch, frames into per-slot
buffers, a language model's inputs into its cache).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ragged_index"]


def ragged_index(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, offsets)``, int64 ``(sum(counts),)``: item ``k`` is item ``offsets[k]`` of row ``rows[k]``.

    ``counts`` ``(B,)`` non-negative ints; rows of count 0 hold no item.

    >>> rows, offsets = ragged_index(np.array([2, 0, 3]))
    >>> rows.tolist(), offsets.tolist()
    ([0, 0, 2, 2, 2], [0, 1, 0, 1, 2])
    """
    counts = np.asarray(counts, np.int64)
    rows = np.repeat(np.arange(len(counts)), counts)
    return rows, np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
