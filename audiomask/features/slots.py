"""A driver's front-end stage: each encoder slot's framer and state, and one batched front-end call per cycle.

Every cycle the driver hands over the next block of samples of each occupied
slot; :class:`SlotFeatures` frames them with the slot's own
:class:`~audiomask.features.framing.StreamFramer` (the overlap between blocks
carried per slot, and the reflection at each end for centred framings),
computes the frames of all slots in one front-end call with each slot's own
streaming state (Whisper's running floor), and lays them out as one chunk
batch in the front end's layout: ``(B, chunk_frames, n_mels)`` or
``(B, n_mels, chunk_frames)``. It holds per-slot state, so one owner calls it,
in cycle order: the driver's worker thread, or the process of
:class:`~audiomask.features.process.FeatureProcess`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from audiomask.features.framing import StreamFramer, pack
from audiomask.features.frontend import Frontend

__all__ = ["SlotFeatures"]


class SlotFeatures:
    """Per-slot framers and front-end state of ``batch_size`` encoder slots, and the batched front end over them.

    Each slot's frames, concatenated over the cycles of its stream, equal the
    front end's streamed features of the whole signal (for Whisper: with the
    running floor).

    Args:
        frontend: the front end.
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
        self._state = frontend._new_state(batch_size)  # per slot (None: the front end keeps none)

    @property
    def shape(self) -> tuple[int, int, int]:
        """The shape of a cycle's features: ``(B, chunk_frames, n_mels)``, or ``(B, n_mels, chunk_frames)``
        for a front end whose time axis is 1."""
        if self.frontend.time_axis == 0:
            return (self.batch_size, self.chunk_frames, self.frontend.n_mels)
        return (self.batch_size, self.frontend.n_mels, self.chunk_frames)

    def compute(
        self,
        slots: np.ndarray,
        blocks: Sequence[np.ndarray],
        final: np.ndarray,
        joins: np.ndarray,
        out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One cycle: ``(features, counts)``, float32 :attr:`shape` (zero past each count) and int64 ``(B,)``.

        ``slots`` ``(S,)``: the occupied slots, distinct; ``blocks[i]``: slot
        ``slots[i]``'s new samples; ``final[i]``: its stream's last block (its
        framer is flushed); ``joins``: the slots whose stream starts this
        cycle (their framers and state start afresh). ``out``: the array to
        write the features into.
        """
        frontend = self.frontend
        framing = frontend.framing
        for slot in joins:
            self._framers[slot] = StreamFramer(framing)
        if self._state is not None and len(joins):
            self._state[joins] = frontend._new_state(len(joins))
        segments, counts, owners = [], [], []
        for slot, block, last in zip(slots, blocks, final):
            framer = self._framers[slot]
            segment, count = framer.push(block)  # type: ignore[union-attr]
            if last:  # one segment per slot: its state takes its frames in order
                tail, more = framer.flush(frontend.min_samples)  # type: ignore[union-attr]
                if more:  # the flush's frames start `count` hops after the push's, in the same padded signal
                    segment = np.concatenate((segment[: framing.hop * count], tail)) if count else tail
                    count += more
            if count > self.chunk_frames:
                raise RuntimeError(f"slot {slot} got more than one chunk of frames in a cycle (a bug)")
            if count:
                segments.append(segment)
                counts.append(count)
                owners.append(slot)
        batch = np.zeros(self.shape, np.float32) if out is None else out
        if out is not None:
            batch.fill(0.0)
        frames = np.zeros(self.batch_size, np.int64)
        if owners:
            state = None if self._state is None else self._state[owners]
            packed = pack(segments, counts, framing)
            features = frontend._features(packed, max(counts), state)  # one call, in the front end's layout
            if state is not None:
                self._state[owners] = state
            time_major = batch if frontend.time_axis == 0 else batch.transpose(0, 2, 1)
            if frontend.time_axis == 1:
                features = features.transpose(0, 2, 1)
            for row, (slot, count) in enumerate(zip(owners, counts)):
                time_major[slot, :count] = features[row, :count]
                frames[slot] = count
        return batch, frames
