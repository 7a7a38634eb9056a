"""A stream's samples not yet taken, arriving in pieces: appending copies nothing, reading joins them once.

A server feeds each stream a few times per chunk (whatever its client sent since the last look); joining every
piece onto the buffered samples at once would copy the chunk's samples again with each piece.

>>> import numpy as np
>>> pending = PendingSamples()
>>> for piece in (np.ones(3, np.float32), np.zeros(2, np.float32)):
...     pending.append(piece)
>>> len(pending), pending.take(4).tolist(), pending.joined().tolist()
(5, [1.0, 1.0, 1.0, 0.0], [0.0])
"""

from __future__ import annotations

import numpy as np

__all__ = ["PendingSamples"]


class PendingSamples:
    """1-D float32 samples in arrival order: :meth:`append` pieces, :meth:`take` from the front, ``len`` all."""

    __slots__ = ("_joined", "_pieces", "_size")

    def __init__(self) -> None:
        self._joined = np.zeros(0, np.float32)  # the samples as of the last read
        self._pieces: list[np.ndarray] = []  # arrived since
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, samples: np.ndarray) -> None:
        """Add ``samples`` ``(n,)`` float32 at the end (kept, not copied: the caller leaves them unchanged)."""
        if len(samples):
            self._pieces.append(samples)
            self._size += len(samples)

    def joined(self) -> np.ndarray:
        """All the samples ``(len(self),)`` float32, in order."""
        if self._pieces:
            self._joined = np.concatenate((self._joined, *self._pieces))
            self._pieces = []
        return self._joined

    def take(self, count: int) -> np.ndarray:
        """The first ``count`` samples (at most :func:`len`), removed."""
        joined = self.joined()
        taken, self._joined = joined[:count], joined[count:]
        self._size = len(self._joined)
        return taken
