"""A driver's front-end stage: each encoder slot's framer, and one batched front-end call per cycle.

Every cycle the driver hands over the next block of samples of each occupied
slot; :class:`SlotFeatures` frames them with the slot's own
:class:`~audiomask.features.framing.StreamFramer` (the overlap between blocks
carried per slot), computes the frames of all slots in one front-end call, and
lays them out as a ``(B, chunk_frames, n_mels)`` batch. It holds per-slot
state, so one owner calls it, in cycle order: the driver's worker thread, or
the process of :class:`~audiomask.features.process.FeatureProcess`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from audiomask.features.framing import StreamFramer, pack
from audiomask.features.frontend import Frontend

__all__ = ["SlotFeatures"]


class SlotFeatures:
    """Per-slot framers of ``batch_size`` encoder slots and the batched front end over them.

    Args:
        frontend: a front end that frames without centring or padding (a
            :class:`~audiomask.features.Phi4MMFrontend`).
        batch_size: slots, ``B``.
        chunk_frames: frames each slot contributes per cycle at most (one encoder chunk).

    >>> import numpy as np
    >>> from audiomask.features import Phi4MMFrontend
    >>> stage = SlotFeatures(Phi4MMFrontend(), batch_size=2, chunk_frames=8)
    >>> block = np.zeros(8 * 160 + 240, np.float32)  # a first block: 8 frames
    >>> features, counts = stage.compute(np.array([1]), [block], np.array([False]), np.array([1]))
    >>> features.shape, counts.tolist()
    ((2, 8, 80), [0, 8])
    """

    def __init__(self, frontend: Frontend, batch_size: int, chunk_frames: int) -> None:
        self.frontend, self.batch_size, self.chunk_frames = frontend, batch_size, chunk_frames
        self._framers: list[StreamFramer | None] = [None] * batch_size

    def compute(
        self,
        slots: np.ndarray,
        blocks: Sequence[np.ndarray],
        final: np.ndarray,
        joins: np.ndarray,
        out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One cycle: ``(features, counts)``, float32 ``(B, chunk_frames, n_mels)`` (zero past each count) and int64 ``(B,)``.

        ``slots`` ``(S,)``: the occupied slots; ``blocks[i]``: slot ``slots[i]``'s
        new samples; ``final[i]``: its stream's last block (its framer is
        flushed); ``joins``: the slots whose stream starts this cycle (their
        framers start afresh). ``out``: the array to write the features into.
        """
        framing = self.frontend.framing
        for slot in joins:
            self._framers[slot] = StreamFramer(framing)
        segments, counts, owners = [], [], []
        for slot, block, last in zip(slots, blocks, final):
            framer = self._framers[slot]
            for segment, count in [framer.push(block)] + ([framer.flush(self.frontend.min_samples)] if last else []):  # type: ignore[union-attr]
                segments.append(segment)
                counts.append(count)
                owners.append(slot)
        batch = np.zeros((self.batch_size, self.chunk_frames, self.frontend.n_mels), np.float32) if out is None else out
        if out is not None:
            batch.fill(0.0)
        frames = np.zeros(self.batch_size, np.int64)
        if sum(counts):
            keep = [i for i, c in enumerate(counts) if c > 0]
            packed = pack([segments[i] for i in keep], [counts[i] for i in keep], framing)
            features = self.frontend._features(packed, max(counts), None)  # (S', width, mel), one call
            for row, i in enumerate(keep):
                slot, count = owners[i], counts[i]
                if frames[slot] + count > self.chunk_frames:
                    raise RuntimeError(f"slot {slot} got more than one chunk of frames in a cycle (a bug)")
                batch[slot, frames[slot] : frames[slot] + count] = features[row, :count]
                frames[slot] += count
        return batch, frames
