"""A driver's front-end stage: each encoder slot's samples, framer and state, and one batched front-end call per cycle.

Every cycle the driver hands over the next block of samples of each slot
that advances (an occupied slot whose block has not arrived sits the cycle
out, its state kept); :class:`SlotFeatures` frames them with the slot's own
:class:`~audiomask.features.framing.StreamFramer` (the overlap between blocks
carried per slot, and the reflection at each end for centred framings),
computes the frames of all slots in one front-end call with each slot's own
streaming state (Whisper's running floor), and lays them out as one chunk
batch in the front end's layout: ``(B, chunk_frames, n_mels)`` or
``(B, n_mels, chunk_frames)``. It holds per-slot state, so one owner calls it,
in cycle order: the driver's worker thread, or a process of
:class:`~audiomask.features.process.FeatureProcess` (which gives each of its
processes a fixed slice of the slots, a :class:`SlotFeatures` of its own).

The samples wait in :class:`SlotSamples`, one ring per slot, written by the
driver as they arrive and read by the stage; :class:`SlotCycle` names each
slot's block in its ring, per slot, so that the driver describes a cycle with
a few ``(B,)`` arrays and never copies samples per slot.

A frame's features do not depend on which other frames share its
computation: every frame goes through the same batched products (see
:meth:`SlotFeatures.compute`), so any split of the slots computes the same
features bit for bit, given the same torch threads (with many threads a
BLAS may split one product's sums across them, differently for different
sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from audiomask.features.framing import StreamFramer, pack
from audiomask.features.frontend import SLAB_FRAMES, Frontend

__all__ = ["SlotCycle", "SlotFeatures", "SlotSamples"]


class SlotSamples:
    """Each slot's samples in a ring: ``memory`` ``(B, capacity)`` float32, written and read at sample positions.

    A position counts the samples written to the slot's ring since it was
    made (it never wraps; the ring index is ``position % capacity``). The
    writer keeps track of which positions still hold unread samples: a ring
    holds ``capacity`` samples at most.

    >>> ring = SlotSamples(np.zeros((2, 4), np.float32))
    >>> ring.write(1, 3, np.array([1, 2, 3], np.float32))  # positions 3, 4, 5: ring indices 3, 0, 1
    >>> ring.read(1, 3, 3).tolist(), ring.memory[1].tolist()
    ([1.0, 2.0, 3.0], [2.0, 3.0, 0.0, 1.0])
    """

    def __init__(self, memory: np.ndarray) -> None:
        if memory.ndim != 2 or memory.dtype != np.float32:
            raise ValueError(f"memory must be a (B, capacity) float32 array, got {memory.dtype} {memory.shape}")
        self.memory = memory
        self.capacity = memory.shape[1]

    def write(self, slot: int, position: int, samples: np.ndarray) -> None:
        """Write ``samples`` (at most ``capacity``) into ``slot``'s ring from ``position`` on."""
        row, start = self.memory[slot], position % self.capacity
        head = min(len(samples), self.capacity - start)
        row[start : start + head] = samples[:head]
        row[: len(samples) - head] = samples[head:]

    def read(self, slot: int, position: int, length: int) -> np.ndarray:
        """A copy of ``length`` samples of ``slot``'s ring from ``position`` on.

        A copy: the ring is written again once the writer has moved on, and a reader may keep what it read
        (a framer keeps a block's tail for the next one).
        """
        row, start = self.memory[slot], position % self.capacity
        if start + length <= self.capacity:
            return row[start : start + length].copy()
        return np.concatenate((row[start:], row[: start + length - self.capacity]))


@dataclass
class SlotCycle:
    """One cycle's blocks, per slot: each ``(B,)``, indexed by slot.

    ``active``: the slot advances in this cycle: its stream has a block
    (possibly empty, when it ends). An inactive slot, free or occupied by a
    stream whose next block has not arrived, is left as it was: its framer
    and front-end state are untouched, its features zero and its count 0, so
    its stream goes on where it stopped in a later cycle;
    ``final``: that block is its stream's last (its framer is flushed);
    ``join``: its stream starts this cycle (framer and state start afresh);
    ``start``, ``length``: where the block lies in the slot's ring
    (:class:`SlotSamples` positions) and its samples (0 where not active).
    """

    active: np.ndarray  # bool
    final: np.ndarray  # bool
    join: np.ndarray  # bool
    start: np.ndarray  # int64
    length: np.ndarray  # int64

    def rows(self) -> np.ndarray:
        """The cycle as one ``(5, B)`` int64 array (what crosses to a process)."""
        return np.stack((self.active, self.final, self.join, self.start, self.length)).astype(np.int64, copy=False)

    @classmethod
    def from_rows(cls, rows: np.ndarray) -> SlotCycle:
        """The cycle of :meth:`rows` (or of a slice of its columns: those slots only)."""
        active, final, join, start, length = rows
        return cls(active.astype(bool), final.astype(bool), join.astype(bool), start, length)


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

    def compute_cycle(
        self, samples: SlotSamples, cycle: SlotCycle, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`compute` of the blocks that ``cycle`` names in ``samples`` (both over this stage's slots)."""
        slots = np.flatnonzero(cycle.active)
        blocks = [
            samples.read(slot, start, length)
            for slot, start, length in zip(slots.tolist(), cycle.start[slots].tolist(), cycle.length[slots].tolist())
        ]
        return self.compute(slots, blocks, cycle.final[slots], np.flatnonzero(cycle.join), out)

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
            # A one-frame product takes BLAS's matrix-vector kernel, which rounds differently from the
            # matrix-matrix kernel every other frame goes through: a frame's features would then depend on
            # which frames share its computation. So no computation ends in a one-frame slab: such a cycle
            # takes a one-frame zero segment more (its own state row), dropped after.
            extended = packed.total_frames() % SLAB_FRAMES == 1
            if extended:
                packed = pack([*segments, np.zeros(framing.win, np.float32)], [*counts, 1], framing)
                state = None if state is None else np.concatenate((state, frontend._new_state(1)))
            features = frontend._features(packed, max(counts), state)  # one call, in the front end's layout
            if extended:
                features = features[:-1]
                state = None if state is None else state[:-1]
            if state is not None:
                self._state[owners] = state
            time_major = batch if frontend.time_axis == 0 else batch.transpose(0, 2, 1)
            if frontend.time_axis == 1:
                features = features.transpose(0, 2, 1)
            for row, (slot, count) in enumerate(zip(owners, counts)):
                time_major[slot, :count] = features[row, :count]
                frames[slot] = count
        return batch, frames
