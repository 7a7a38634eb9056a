"""Cutting samples into analysis frames: offline, streamed, and packed for one batched call.

Both front ends frame the same way (a ``win``-sample window every ``hop``
samples) and differ only in their edges: Phi-4MM takes the frames that fit in
the signal; Whisper centres them, reflect-padding ``win // 2`` samples on each
side, and drops the last. :class:`Framing` states that rule once;
:class:`StreamFramer` produces the same frames from a stream of chunks by
carrying the overlap between pushes; :func:`pack` lays the frames of many
utterances or streams out in one flat signal so that a single ``unfold`` (a
strided view, no copy) yields all of them for one batched computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_EMPTY = np.empty(0, dtype=np.float32)  # shared: holds nothing, so nothing can write to it


def reflect_index(index: np.ndarray, n: int) -> np.ndarray:
    """Map indices into ``[0, n)`` by mirroring at both ends without repeating the edge sample.

    The indexing behind ``numpy.pad(x, pad, mode="reflect")`` for any ``pad``,
    also when ``pad >= n`` (the reflection repeats with period ``2 * (n - 1)``).

    >>> reflect_index(np.arange(-3, 7), 4).tolist()
    [3, 2, 1, 0, 1, 2, 3, 2, 1, 0]
    """
    if n == 1:
        return np.zeros_like(index)
    period = 2 * (n - 1)
    folded = np.abs(index) % period
    return np.where(folded > n - 1, period - folded, folded)


@dataclass(frozen=True)
class Framing:
    """Where the frames of an ``n``-sample signal lie.

    Frame ``t`` covers samples ``[hop * t - pad, hop * t - pad + win)`` of the
    signal reflect-padded by ``pad`` samples on each side; there are
    ``(n + 2 * pad - win) // hop + 1`` of them (none when that is below 1),
    minus the last when ``drop_last``.

    >>> Framing(win=400, hop=160, pad=0, drop_last=False).count(16000)   # Phi-4MM, 1 s
    98
    >>> Framing(win=400, hop=160, pad=200, drop_last=True).count(16000)  # Whisper, 1 s
    100
    """

    win: int
    hop: int
    pad: int
    drop_last: bool

    def count(self, n: int | np.ndarray) -> int | np.ndarray:
        """Frames of an ``n``-sample signal (``n`` an int or an int64 array)."""
        padded = np.asarray(n) + 2 * self.pad
        frames = np.where(padded >= self.win, (padded - self.win) // self.hop + 1, 0)
        frames = np.maximum(frames - int(self.drop_last), 0)
        return int(frames) if frames.ndim == 0 else frames.astype(np.int64)

    def head(self, samples: np.ndarray) -> np.ndarray:
        """The left reflection, ``samples[pad:0:-1]``; needs ``len(samples) > pad``."""
        return samples[self.pad : 0 : -1]

    def tail(self, samples: np.ndarray) -> np.ndarray:
        """The right reflection, ``samples[-2:-pad-2:-1]``; needs ``len(samples) > pad``."""
        return samples[-2 : -self.pad - 2 : -1] if self.pad else _EMPTY

    def pad_signal(self, samples: np.ndarray) -> np.ndarray:
        """``samples`` reflect-padded by ``pad`` on each side (``samples`` itself when ``pad`` is 0)."""
        if self.pad == 0 or len(samples) == 0:
            return samples
        if len(samples) > self.pad:
            return np.concatenate((self.head(samples), samples, self.tail(samples)))
        return samples[reflect_index(np.arange(-self.pad, len(samples) + self.pad), len(samples))]

    def segment(self, padded: np.ndarray, frames: int) -> np.ndarray:
        """The first ``frames`` frames' span of a padded signal: ``hop * (frames - 1) + win`` samples."""
        return padded[: self.hop * (frames - 1) + self.win] if frames > 0 else _EMPTY


class StreamFramer:
    """The frames of one stream, chunk by chunk: the same frames as :class:`Framing` on the whole signal.

    ``push`` returns every frame whose samples have all arrived (a frame
    needing the right-edge reflection waits for ``flush``); the samples a later
    frame still needs are kept, at most ``win - 1`` of them, plus up to ``pad``
    before the left reflection can be made. Both return ``(segment, frames)``:
    frame ``j`` is ``segment[hop * j : hop * j + win]``.
    """

    def __init__(self, framing: Framing) -> None:
        self.framing = framing
        # Before the left reflection is made (pad > 0 and at most pad samples
        # seen) this holds raw samples; afterwards, the padded signal from the
        # first sample of the next frame on.
        self._held = _EMPTY
        self._started = framing.pad == 0
        self.samples = 0  # raw samples pushed
        self.frames = 0  # frames returned

    @classmethod
    def resumed(cls, framing: Framing, held: np.ndarray, samples: int, frames: int) -> StreamFramer:
        """The framer that has taken ``samples`` samples, returned ``frames`` frames and holds ``held``.

        ``held`` (float32, :attr:`held` of that framer; kept, not copied) is
        at most ``win - 1`` samples, or ``pad`` while ``samples <= pad``.

        >>> framing = Framing(win=400, hop=160, pad=0, drop_last=False)
        >>> framer = StreamFramer(framing)
        >>> _, frames = framer.push(np.zeros(1000, np.float32))
        >>> twin = StreamFramer.resumed(framing, framer.held.copy(), framer.samples, framer.frames)
        >>> framer.push(np.ones(500, np.float32))[1], twin.push(np.ones(500, np.float32))[1]
        (3, 3)
        """
        framer = cls(framing)
        framer._held, framer.samples, framer.frames = held, samples, frames
        framer._started = framing.pad == 0 or samples > framing.pad  # what every push leaves
        return framer

    @property
    def held(self) -> np.ndarray:
        """The samples kept for later frames: raw while the left reflection waits, else padded signal."""
        return self._held

    def push(self, samples: np.ndarray) -> tuple[np.ndarray, int]:
        f = self.framing
        self.samples += len(samples)
        held = np.concatenate((self._held, samples)) if len(self._held) else samples
        if not self._started:
            if self.samples <= f.pad:
                self._held = held
                return _EMPTY, 0
            held = np.concatenate((f.head(held), held))
            self._started = True
        frames = (len(held) - f.win) // f.hop + 1 if len(held) >= f.win else 0
        self._held = held[f.hop * frames :]
        self.frames += frames
        return f.segment(held, frames), frames

    def flush(self, min_samples: int = 0) -> tuple[np.ndarray, int]:
        """The frames that need the end of the signal, zero-extended to ``min_samples`` first."""
        f = self.framing
        zeros = np.zeros(max(min_samples - self.samples, 0), dtype=np.float32)
        total = f.count(self.samples + len(zeros))
        if self._started:
            held = np.concatenate((self._held, zeros))
            padded = np.concatenate((held, f.tail(held)))
        else:  # the whole signal is still here (at most pad samples, or zero-extended)
            padded = f.pad_signal(np.concatenate((self._held, zeros)))
        self._held = _EMPTY
        frames = total - self.frames
        self.frames = total
        return f.segment(padded, frames), frames


class SlotFramers:
    """The :class:`StreamFramer` state of ``count`` slots in arrays, indexed by slot.

    Each slot's framer is ``framer(slot)``, a :class:`StreamFramer` made from
    its row and stored back with :meth:`keep`. The push a stream makes in
    every cycle but its first and last (:meth:`steady` says which slots make
    it) runs for all those slots at once in :meth:`push_steady`: a slot that
    holds exactly :attr:`carry` samples completes ``block // hop`` frames
    with a block of ``block`` samples (a multiple of ``hop``), and holds
    :attr:`carry` samples again.

    >>> framing = Framing(win=400, hop=160, pad=0, drop_last=False)
    >>> framers = SlotFramers(framing, 2)
    >>> framer = framers.framer(1)
    >>> framer.push(np.zeros(1040, np.float32))[1]  # 5 frames: 240 samples held
    5
    >>> framers.keep(1, framer)
    >>> framers.steady(np.array([0, 1]), np.array([800, 800]), block=800).tolist()
    [False, True]
    """

    def __init__(self, framing: Framing, count: int) -> None:
        self.framing = framing
        self.carry = framing.win - framing.hop  # held after a push that ends on a whole hop
        self.held = np.zeros((count, max(framing.win - 1, framing.pad)), np.float32)
        self.held_len = np.zeros(count, np.int64)
        self.samples = np.zeros(count, np.int64)  # raw samples pushed
        self.frames = np.zeros(count, np.int64)  # frames returned

    def restart(self, slots: np.ndarray) -> None:
        """``slots`` ``(J,)`` start new streams."""
        self.held_len[slots] = self.samples[slots] = self.frames[slots] = 0

    def framer(self, slot: int) -> StreamFramer:
        """``slot``'s framer (its held samples copied)."""
        held = self.held[slot, : self.held_len[slot]].copy()
        return StreamFramer.resumed(self.framing, held, int(self.samples[slot]), int(self.frames[slot]))

    def keep(self, slot: int, framer: StreamFramer) -> None:
        """Store ``framer``'s state as ``slot``'s."""
        held = framer.held
        self.held[slot, : len(held)] = held
        self.held_len[slot], self.samples[slot], self.frames[slot] = len(held), framer.samples, framer.frames

    def steady(self, slots: np.ndarray, lengths: np.ndarray, block: int) -> np.ndarray:
        """``(S,)`` bool: which of ``slots`` can push their next ``lengths`` samples with :meth:`push_steady`.

        Those past their left reflection that hold :attr:`carry` samples and push ``block`` samples.
        """
        started = self.samples[slots] > self.framing.pad if self.framing.pad else np.ones(len(slots), bool)
        return started & (self.held_len[slots] == self.carry) & (lengths == block)

    def push_steady(self, slots: np.ndarray, segments: np.ndarray, rows: np.ndarray) -> None:
        """Push, for each of the steady ``slots`` ``(S,)``, the block in ``segments[rows[i], carry:]``.

        ``segments`` ``(N, carry + block)`` float32; its first :attr:`carry`
        samples of each of those rows are written here (the held ones), so
        that the row is the push's segment: frame ``j`` is
        ``row[hop * j : hop * j + win]``, for ``block // hop`` frames.
        """
        carry = self.carry
        segments[rows, :carry] = self.held[slots, :carry]
        self.held[slots, :carry] = segments[rows, -carry:]
        self.samples[slots] += segments.shape[1] - carry
        self.frames[slots] += (segments.shape[1] - carry) // self.framing.hop


@dataclass
class PackedFrames:
    """The frames of several segments in one flat signal.

    Frame ``f`` of the flat signal is ``flat[hop * f : hop * f + win]``; frame
    ``j`` of segment ``s`` is frame ``first[s] + j``. Each segment starts at a
    multiple of ``hop`` samples, so every segment's frames are frames of the
    flat signal (a strided view, no copy), with a couple of frames straddling
    two segments in between; :meth:`rows` picks the real ones.
    """

    flat: torch.Tensor  # (L,) float32
    first: np.ndarray  # (S,) int64, index of each segment's first frame among the flat signal's
    counts: np.ndarray  # (S,) int64, frames per segment
    win: int
    hop: int

    def total_frames(self) -> int:
        """Frames of the flat signal: every segment's, plus those straddling two segments."""
        return (len(self.flat) - self.win) // self.hop + 1 if len(self.flat) >= self.win else 0

    def rows(self) -> torch.Tensor | None:
        """``(K,)`` int64 indices of the real frames among all frames, segment by segment; None if all are."""
        total = int(self.counts.sum())
        if len(self.counts) == 1 or total == self.total_frames():
            return None
        starts = np.repeat(self.first - np.cumsum(self.counts) + self.counts, self.counts)
        return torch.from_numpy(starts + np.arange(total))


def pack(segments: Sequence[np.ndarray], counts: Sequence[int], framing: Framing) -> PackedFrames:
    """Lay segments (as :class:`StreamFramer` returns them) end to end at multiples of ``hop``."""
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    if len(segments) == 1:  # nothing to align: frame the segment in place
        flat = torch.from_numpy(np.ascontiguousarray(segments[0], dtype=np.float32))
        return PackedFrames(flat, np.zeros(1, np.int64), counts, framing.win, framing.hop)
    hop = framing.hop
    sizes = np.array([len(s) for s in segments], dtype=np.int64)
    slots = -(-sizes // hop)  # hops per segment, rounded up
    first = np.cumsum(slots) - slots
    flat = np.zeros(int(slots.sum()) * hop, dtype=np.float32)
    for segment, start in zip(segments, first * hop):
        flat[start : start + len(segment)] = segment
    return PackedFrames(torch.from_numpy(flat), first, counts, framing.win, hop)
