"""A driver's front-end stage: each encoder slot's samples, framer and state, and one batched front-end call per cycle.

Every cycle the driver hands over the next block of samples of each slot
that advances (an occupied slot whose block has not arrived sits the cycle
out, its state kept); :class:`SlotFeatures` frames them as each slot's own
stream (:class:`~audiomask.features.framing.SlotFramers`: the overlap
between blocks carried per slot, and the reflection at each end for centred
framings), computes the frames of all slots in one front-end call with each
slot's own streaming state (Whisper's running floor), and lays them out as
one chunk batch in the front end's layout: ``(B, chunk_frames, n_mels)`` or
``(B, n_mels, chunk_frames)``. It holds per-slot state, so one owner calls it,
in cycle order: the driver's worker thread, or a process of
:class:`~audiomask.features.process.FeatureProcess` (which gives each of its
processes a fixed slice of the slots, a :class:`SlotFeatures` of its own).

The samples wait in :class:`SlotSamples`, one ring per slot, written by the
driver as they arrive and read by the stage; :class:`SlotCycle` names each
slot's block in its ring, per slot, so that the driver describes a cycle with
a few ``(B,)`` arrays and never copies samples per slot. The slots in the
middle of their stream (a whole block after whole ones) are read, framed and
laid out with a few array operations whatever their number; Python runs per
slot only for the others (a stream's first and last blocks, blocks of
another length).

A frame's features do not depend on which other frames share its
computation: every frame goes through the same batched computation (see
:meth:`SlotFeatures.compute_cycle`): elementwise operations, an FFT that
transforms each frame on its own, and mel products that always multiply
blocks of exactly :data:`~audiomask.features.frontend.MEL_BLOCK_ROWS` frames
(see :class:`~audiomask.features.frontend.MelBands`), so one BLAS kernel
computes every frame whatever a call's frame count. Any split of the slots
therefore computes the same features bit for bit, given the same torch
threads (a BLAS may share out one product's work over its threads
differently for different thread counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from audiomask.features.framing import SlotFramers
from audiomask.features.frontend import Frontend

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
        if memory.ndim != 2 or memory.dtype != np.float32 or memory.strides[1] != memory.itemsize:
            raise ValueError(
                f"memory must be a (B, capacity) float32 array with contiguous rows, got {memory.dtype} "
                f"{memory.shape} strides {memory.strides}"
            )
        self.memory = memory
        self.capacity = memory.shape[1]
        # Each ring as a flat buffer: a write is a memcpy that keeps the interpreter lock. numpy releases it
        # for copies of a few hundred values or more, and a thread that releases it in a busy server waits up
        # to a switch interval (5 ms) to take it back: once per stream and chunk, such waits bound a server's load.
        self._rings = [memoryview(row) for row in memory]

    def write(self, slot: int, position: int, samples: np.ndarray) -> None:
        """Write ``samples`` ``(n,)`` float32 (``n <= capacity``) into ``slot``'s ring from ``position`` on."""
        ring, start = self._rings[slot], position % self.capacity
        samples = np.ascontiguousarray(samples, np.float32)
        head = min(len(samples), self.capacity - start)
        source = memoryview(samples)
        ring[start : start + head] = source[:head]
        ring[: len(samples) - head] = source[head:]

    def read(self, slot: int, position: int, length: int) -> np.ndarray:
        """A copy of ``length`` samples of ``slot``'s ring from ``position`` on.

        A copy: the ring is written again once the writer has moved on, and a reader may keep what it read
        (a framer keeps a block's tail for the next one).
        """
        row, start = self.memory[slot], position % self.capacity
        if start + length <= self.capacity:
            return row[start : start + length].copy()
        return np.concatenate((row[start:], row[: start + length - self.capacity]))

    def read_into(self, slots: np.ndarray, positions: np.ndarray, out: torch.Tensor) -> None:
        """:meth:`read` of many slots at once: row ``i`` of ``out`` from ``slots[i]``'s ring at ``positions[i]``.

        ``out``: ``(S, length)`` float32 on the CPU, any strides (rows
        distinct). The blocks that lie whole in their ring are one gather
        straight into ``out``, whatever ``S``; a block that wraps around its
        ring's end is two slice copies (its part up to the end, then the rest
        from the ring's start).

        >>> import torch
        >>> ring, out = SlotSamples(np.arange(8, dtype=np.float32).reshape(2, 4)), torch.empty(2, 2)
        >>> ring.read_into(np.array([1, 0]), np.array([1, 3]), out)  # slot 0 wraps: indices 3, 0
        >>> out.tolist()
        [[5.0, 6.0], [3.0, 0.0]]
        """
        capacity, length = self.capacity, out.shape[1]
        if length > capacity:
            raise ValueError(f"out's rows hold {length} samples, more than a ring's capacity={capacity}")
        offsets = positions % capacity
        last = capacity - length  # the last offset from which a block lies whole
        memory = torch.from_numpy(self.memory)
        row = memory.stride(0)
        windows = memory.as_strided((row * (len(memory) - 1) + last + 1, length), (1, 1))  # from every sample on
        # A wrapping block takes its ring's last window here, and its samples below.
        torch.index_select(windows, 0, torch.from_numpy(slots * row + np.minimum(offsets, last)), out=out)
        wrapped = np.flatnonzero(offsets > last)
        if len(wrapped):
            rows = out.numpy()
            for index, slot, offset in zip(wrapped.tolist(), slots[wrapped].tolist(), offsets[wrapped].tolist()):
                ring, head = self.memory[slot], capacity - offset  # the block's samples up to the ring's end
                rows[index, :head] = ring[offset:]
                rows[index, head:] = ring[: length - head]


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

    A cycle costs a few array operations for the slots in the middle of
    their stream (a whole block after whole ones: :meth:`SlotFramers.steady
    <audiomask.features.framing.SlotFramers.steady>`), whatever their
    number, plus the front end's batched computation; Python runs per slot
    only for a stream's first and last block, a block of another length, and
    a slot whose stream has not passed its left reflection yet.

    The frames of a cycle lie in one flat signal, each slot's from a multiple
    of ``hop`` on, in slot order (the layout of
    :func:`~audiomask.features.framing.pack`), and go through the front end's
    slabs from its first frame; the scratch this takes (a few times the
    cycle's samples and features) is allocated at the first cycle and kept.

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
        framing = frontend.framing
        self._framers = SlotFramers(framing, batch_size)
        self._state = frontend._new_state(batch_size)  # per slot (None: the front end keeps none)
        self._streaming = np.zeros(batch_size, bool)  # a stream has joined the slot and not ended
        self._block = chunk_frames * framing.hop  # a steady push: one chunk of frames
        self._segment = self._framers.carry + self._block  # its frames' span
        # Hops a segment takes in the flat signal, at most (one of chunk_frames frames).
        self._segment_hops = -(-self._segment // framing.hop)
        # Scratch reused cycle after cycle: allocated once, at the largest size a cycle needs (fresh
        # megabytes each cycle cost page faults comparable to the arithmetic).
        self._flat: np.ndarray | None = None  # float32: every segment at a multiple of hop
        self._mel: torch.Tensor | None = None  # float32 (frames, n_mels): log-mel of every frame of _flat
        self._peaks: torch.Tensor | None = None  # float32 (frames,): their peaks, where the front end records them
        self._gathered: torch.Tensor | None = None  # float32: the owners' frames, (S, width, n_mels)

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
        """One cycle: the blocks ``cycle`` names in ``samples`` (both over this stage's slots).

        Returns ``(features, counts)``: float32 :attr:`shape` (zero past each
        count) and int64 ``(B,)`` frames per slot. ``out``: the array to write
        the features into (default: a new one).
        """
        joins = np.flatnonzero(cycle.join)
        self._framers.restart(joins)
        if self._state is not None and len(joins):
            self._state[joins] = self.frontend._new_state(len(joins))
        self._streaming[joins] = True
        slots = np.flatnonzero(cycle.active)
        strays = slots[~self._streaming[slots]]
        if len(strays):
            raise ValueError(
                f"cycle.active names slots without a stream (none joined since the last one's final block): "
                f"{strays.tolist()}"
            )
        final = cycle.final[slots]
        self._streaming[slots[final]] = False
        steady = self._framers.steady(slots, cycle.length[slots], self._block) & ~final
        counts = np.zeros(self.batch_size, np.int64)
        counts[slots[steady]] = self.chunk_frames
        segments: dict[int, np.ndarray] = {}  # the other slots' segments, by slot
        others = slots[~steady]
        for slot, start, length, last in zip(
            others.tolist(), cycle.start[others].tolist(), cycle.length[others].tolist(), final[~steady].tolist()
        ):
            segment, counts[slot] = self._push(slot, samples.read(slot, start, length), last)
            if counts[slot]:
                segments[slot] = segment
        return self._emit(samples, cycle.start, slots[steady], segments, counts, out)

    def compute(
        self,
        slots: np.ndarray,
        blocks: Sequence[np.ndarray],
        final: np.ndarray,
        joins: np.ndarray,
        out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`compute_cycle` of blocks given as arrays.

        ``slots`` ``(S,)``: the slots that advance, distinct; ``blocks[i]``:
        slot ``slots[i]``'s new float32 samples; ``final[i]``: its stream's
        last block (its framer is flushed); ``joins``: the slots whose stream
        starts this cycle (their framers and state start afresh); ``out``: as
        for :meth:`compute_cycle`.
        """
        slots = np.asarray(slots, np.int64).reshape(-1)
        lengths = np.zeros(self.batch_size, np.int64)
        lengths[slots] = [len(block) for block in blocks]
        rings = SlotSamples(np.zeros((self.batch_size, max(int(lengths.max(initial=0)), 1)), np.float32))
        for slot, block in zip(slots.tolist(), blocks):
            rings.write(slot, 0, block)
        cycle = SlotCycle(*(np.zeros(self.batch_size, bool) for _ in range(3)), np.zeros_like(lengths), lengths)
        cycle.active[slots], cycle.final[slots], cycle.join[np.asarray(joins, np.int64)] = True, final, True
        return self.compute_cycle(rings, cycle, out)

    def _push(self, slot: int, block: np.ndarray, last: bool) -> tuple[np.ndarray, int]:
        """Push ``block`` through ``slot``'s framer (and flush it when ``last``): its segment and frames."""
        framing = self.frontend.framing
        framer = self._framers.framer(slot)
        segment, count = framer.push(block)
        if last:  # one segment per slot: its state takes its frames in order
            tail, more = framer.flush(self.frontend.min_samples)
            if more:  # the flush's frames start `count` hops after the push's, in the same padded signal
                segment = np.concatenate((segment[: framing.hop * count], tail)) if count else tail
                count += more
        self._framers.keep(slot, framer)
        if count > self.chunk_frames:
            raise RuntimeError(f"slot {slot} got more than one chunk of frames in a cycle (a bug)")
        return segment, count

    def _emit(
        self,
        samples: SlotSamples,
        starts: np.ndarray,
        steady: np.ndarray,
        segments: dict[int, np.ndarray],
        counts: np.ndarray,
        out: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The features of every slot with frames: the ``steady`` ones' blocks read from ``samples``, the
        others' ``segments``; ``counts`` ``(B,)`` their frames."""
        frontend, hop = self.frontend, self.frontend.framing.hop
        batch = np.zeros(self.shape, np.float32) if out is None else out
        owners = np.flatnonzero(counts)
        if not len(owners):
            if out is not None:
                batch.fill(0.0)
            return batch, counts
        # The flat signal: every owner's segment, in slot order, from a multiple of hop on (the layout of
        # framing.pack, whose frames the slabs then take exactly as they take a packed batch's).
        sizes = np.full(len(owners), self._segment, np.int64)
        rows = np.searchsorted(owners, list(segments))  # the owners with a segment of their own
        sizes[rows] = [len(segment) for segment in segments.values()]
        hops = -(-sizes // hop)
        first = np.cumsum(hops) - hops
        used = int(hops.sum())
        frames = self._total_frames(used)
        flat, mel, peaks, gathered = self._scratch()
        for row, segment in zip(rows.tolist(), segments.values()):
            at = int(first[row]) * hop
            flat[at : at + len(segment)] = segment
            flat[at + len(segment) : at + int(hops[row]) * hop] = 0.0
        if len(steady):
            self._place_steady(flat, samples, starts, steady, first[np.searchsorted(owners, steady)])
        frontend._log_mel_into(
            torch.from_numpy(flat[: used * hop]), mel[:frames], None if peaks is None else peaks[:frames]
        )
        # Each owner's frames, a window of mel from its first frame; zero past its count. Straight into the
        # batch when every slot has frames and one has a whole chunk (a full cycle), else into scratch.
        owned = counts[owners]
        width = int(owned.max())
        windows = mel.as_strided((frames, width, frontend.n_mels), (frontend.n_mels, frontend.n_mels, 1))
        target = torch.from_numpy(batch)
        time_major = target if frontend.time_axis == 0 else target.transpose(1, 2)  # (B, chunk_frames, n_mels)
        direct = len(owners) == self.batch_size and width == self.chunk_frames
        if direct:
            features = time_major
        else:
            features = gathered[: len(owners) * width * frontend.n_mels].view(len(owners), width, frontend.n_mels)
        torch.index_select(windows, 0, torch.from_numpy(first), out=features)
        padding = np.arange(width) >= owned[:, None]  # (S, width)
        if padding.any():
            features.masked_fill_(torch.from_numpy(padding)[:, :, None], 0.0)
        owned_peaks = None
        if peaks is not None:  # each owner's frames' peaks, as its features' window
            owned_peaks = torch.index_select(peaks.as_strided((frames, width), (1, 1)), 0, torch.from_numpy(first))
        state = None if self._state is None else self._state[owners]
        frontend._finish(features, owned, state, owned_peaks)
        if state is not None:
            self._state[owners] = state
        if not direct:
            owners_index = torch.from_numpy(owners)
            time_major[:, :width].index_copy_(0, owners_index, features)
            if out is not None:
                rest = np.ones(self.batch_size, bool)
                rest[owners] = False
                batch[rest] = 0.0
                if width < self.chunk_frames:
                    time_major[:, width:].index_fill_(0, owners_index, 0.0)
        return batch, counts

    def _place_steady(
        self, flat: np.ndarray, samples: SlotSamples, starts: np.ndarray, slots: np.ndarray, first: np.ndarray
    ) -> None:
        """The steady ``slots``' segments into ``flat`` (the scratch), at hops ``first``, and their framers on."""
        hop, carry = self.frontend.framing.hop, self._framers.carry
        span = self._segment_hops * hop
        spans = np.lib.stride_tricks.as_strided(  # row h: the samples from hop h on, one segment and its gap
            flat, (len(flat) // hop - self._segment_hops, span), (flat.itemsize * hop, flat.itemsize)
        )
        # Blocks straight from the rings into the flat signal, a regular array of rows per run of steady
        # slots that lie one after the other there (runs end at the other slots' segments).
        flat_tensor = torch.from_numpy(flat)
        cuts = [0, *(np.flatnonzero(np.diff(first) != self._segment_hops) + 1).tolist(), len(first)]
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            rows = flat_tensor.as_strided((hi - lo, self._block), (span, 1), int(first[lo]) * hop + carry)
            samples.read_into(slots[lo:hi], starts[slots[lo:hi]], rows)
        self._framers.push_steady(slots, spans[:, : self._segment], first)
        spans[first, self._segment :] = 0.0

    def _total_frames(self, hops: int) -> int:
        """Frames of a flat signal of ``hops`` hops (the last ones straddle no segment: never counted)."""
        win, hop = self.frontend.framing.win, self.frontend.framing.hop
        return (hops * hop - win) // hop + 1 if hops * hop >= win else 0

    def _scratch(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The flat signal, log-mel, frame peaks (None unless the front end records them) and gathered frames'
        scratch, allocated at the first cycle."""
        if self._flat is None:
            hop, n_mels = self.frontend.framing.hop, self.frontend.n_mels
            hops = self.batch_size * self._segment_hops
            self._flat = np.empty((hops + self._segment_hops) * hop, np.float32)  # and one span past the end
            self._mel = torch.empty((hops + self.chunk_frames, n_mels), dtype=torch.float32)  # and one window
            if self.frontend.frame_peaks:
                self._peaks = torch.empty(hops + self.chunk_frames, dtype=torch.float32)
            self._gathered = torch.empty(self.batch_size * self.chunk_frames * n_mels, dtype=torch.float32)
        return self._flat, self._mel, self._peaks, self._gathered  # type: ignore[return-value]
