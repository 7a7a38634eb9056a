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
