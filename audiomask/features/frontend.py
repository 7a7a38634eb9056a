"""What every front end shares: argument checks, batched computation, streams.

A front end states its :class:`~audiomask.features.framing.Framing`, how a
block of frames becomes mel power (``_mel_power_into``, usually through
:class:`MelBands`) and how power becomes log (``_log_``, slab by slab while the
slab is in the cache, each frame's peak taken there where the front end asks
for it); Whisper adds a step across frames (its ``max - 8`` floor,
``_finish``, from those peaks). Everything else, here, is
common: the one-utterance call, the ragged batch, and streams, which all frame
through the same code and compute every frame of a call in one batched torch
computation (in slabs of :data:`SLAB_FRAMES` frames that keep the scratch
memory small), never in a loop over utterances or streams.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.features.framing import Framing, PackedFrames, StreamFramer, pack
from audiomask.ragged import ragged_index
from audiomask.samples import as_samples

__all__ = ["MEL_BLOCK_ROWS", "SLAB_FRAMES", "FeatureStream", "FeatureStreams", "Frontend", "MelBands"]

# Frames per slab of torch calls inside one computation: 2 MB of float64 FFT
# input at n_fft 512, small enough that the FFT's input and output stay in the
# cache (larger slabs are slower), where a 1-hour file in one slab would need
# 1.5 GB of scratch. Figures: docs/defaults.md.
SLAB_FRAMES = 512
# Frames of every mel filter product (a multiple of 16, so that whole blocks of a 64-byte aligned
# float32 array stay aligned): a slab's. Fewer rows cost more a frame: each product call per block and
# group has a fixed cost. Figures: docs/defaults.md.
MEL_BLOCK_ROWS = 512


class MelBands:
    """Triangular mel filters applied to a power spectrum in a few dense products.

    Each filter covers a narrow run of FFT bins, so the filter matrix is
    banded: splitting the filters into ``groups`` consecutive groups, each
    multiplied only with the bins it covers, does a fraction of the dense
    product's work (the split minimises bins x filters over all splits).

    A frame's mel power does not depend on how many frames share its call, by
    construction: every product multiplies a block of exactly
    :data:`MEL_BLOCK_ROWS` frames (a call's last, partial block is
    zero-padded to it in a buffer of the same layout) by the same filter
    block, so one GEMM kernel with one reduction order computes every frame
    whatever the call's frame count. A BLAS picks its kernel from the
    product's shape: products of the call's own frame count would round
    differently for different counts (MKL on AMD Zen 4: products of 1-3 rows
    against those of more; a few ulp). The FFT before it computes each frame
    on its own whatever the batch (tested across row counts).

    Args:
        weights: ``(bins, n_mels)`` float64 filter matrix, each column non-zero over one run of bins.
        groups: how many filter groups, ``>= 1``.
    """

    def __init__(self, weights: np.ndarray, groups: int) -> None:
        groups = check_int("groups", groups, minimum=1)
        bins, _ = weights.shape
        nonzero = weights != 0
        used = nonzero.any(axis=0)  # an all-zero filter spans no bins
        first = np.where(used, np.argmax(nonzero, axis=0), bins)
        end = np.where(used, bins - np.argmax(nonzero[::-1], axis=0), 0)
        dense = torch.from_numpy(weights.astype(np.float32))  # (bins, n_mels)
        self.bands = [
            (slice(bin_lo, bin_hi), slice(lo, hi), dense[bin_lo:bin_hi, lo:hi].contiguous())
            for lo, hi, bin_lo, bin_hi in _split(first, end, groups)
        ]

    def project_power(self, spectrum: torch.Tensor, power: torch.Tensor, out: torch.Tensor) -> None:
        """Mel power of a ``(n, bins)`` complex spectrum (complex64 or complex128) into ``(n, n_mels)`` float32 ``out``.

        The power ``re^2 + im^2`` is formed in the spectrum's precision (the
        spectrum is squared in place) and rounded once to float32 into
        ``power`` (``(n, bins)`` contiguous float32 scratch); the filters then
        multiply the power in blocks of :data:`MEL_BLOCK_ROWS` frames.
        ``out`` has contiguous rows.
        """
        squares = torch.view_as_real(spectrum).square_()
        torch.add(squares[..., 0], squares[..., 1], out=power)
        _banded_product(power, self.bands, out)


def _banded_product(rows: torch.Tensor, bands: list, out: torch.Tensor) -> None:
    """``rows`` ``(n, k)`` contiguous float32 times the banded filters into ``(n, n_mels)`` ``out``.

    Every product is one block of :data:`MEL_BLOCK_ROWS` rows: the whole
    blocks are views of ``rows`` and ``out``; the rest of the rows are copied
    into a zero-padded block of the same row stride (and, like every torch
    allocation, the same 64-byte alignment as ``rows``' blocks when ``rows``
    is one), computed, and copied out.
    """
    n = len(rows)
    whole = n - n % MEL_BLOCK_ROWS
    for start in range(0, whole, MEL_BLOCK_ROWS):
        _block_product(rows[start : start + MEL_BLOCK_ROWS], bands, out[start : start + MEL_BLOCK_ROWS])
    if whole < n:
        padded = rows.new_zeros(MEL_BLOCK_ROWS, rows.shape[1])
        padded[: n - whole] = rows[whole:]
        product = out.new_empty(MEL_BLOCK_ROWS, out.shape[1])
        _block_product(padded, bands, product)
        out[whole:] = product[: n - whole]


def _block_product(rows: torch.Tensor, bands: list, out: torch.Tensor) -> None:
    """One block: ``rows`` ``(MEL_BLOCK_ROWS, k)`` times each group's filters into its columns of ``out``."""
    for columns, filters, weights in bands:
        torch.matmul(rows[:, columns], weights, out=out[:, filters])


def _split(first: np.ndarray, end: np.ndarray, groups: int) -> list[tuple[int, int, int, int]]:
    """Cut filters into at most ``groups`` consecutive runs minimising the sum of (bins spanned x filters).

    Filter ``m`` covers bins ``[first[m], end[m])`` (``first >= end``: none). Returns
    ``(lo, hi, bin_lo, bin_hi)`` per run. Dynamic programming over the cut points,
    vectorised over the previous cut.
    """
    n = len(first)
    # work[lo, hi]: bins spanned by filters lo..hi-1 times their count (inf where hi <= lo).
    work = np.full((n + 1, n + 1), np.inf)
    for lo in range(n):
        span = np.maximum(np.maximum.accumulate(end[lo:]) - np.minimum.accumulate(first[lo:]), 0)
        work[lo, lo + 1 :] = span * np.arange(1, n - lo + 1)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    cuts = []
    for _ in range(min(groups, n)):
        totals = best[:, None] + work  # (previous cut, this cut)
        cuts.append(np.argmin(totals, axis=0))
        best = totals.min(axis=0)
        best[0] = 0.0  # fewer groups stay allowed
    bounds = [n]
    for cut in reversed(cuts):
        if bounds[-1] == 0:
            break
        bounds.append(int(cut[bounds[-1]]))
    bounds.reverse()
    runs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        bin_lo, bin_hi = int(first[lo:hi].min()), int(end[lo:hi].max())
        runs.append((lo, hi, min(bin_lo, bin_hi), bin_hi))
    return runs


class Frontend(ABC):
    """A log-mel front end at 16 kHz: one utterance, a ragged batch, or streams.

    Subclasses set :attr:`framing`, :attr:`n_mels` and :attr:`time_axis`
    (0: features are ``(T, n_mels)``; 1: ``(n_mels, T)``) and implement
    ``_mel_power_into`` and ``_log_``. Utterances may be zero-extended to
    :attr:`min_samples` and their frame axis zero-padded to a multiple of
    :attr:`frame_multiple` (Qwen3-ASR's padding rules).
    """

    framing: Framing
    n_mels: int
    time_axis: int
    min_samples: int = 0
    frame_multiple: int = 1
    frame_peaks: bool = False  # ``_finish`` reads each frame's peak log value, which ``_log_`` records

    @abstractmethod
    def _mel_power_into(self, signal: torch.Tensor, frames: int, out: torch.Tensor) -> None:
        """Mel power of ``frames`` frames into ``(frames, n_mels)`` float32 ``out``.

        ``signal`` is 1-D float32 of ``hop * (frames - 1) + win`` samples;
        frame ``j`` is ``signal[hop * j : hop * j + win]``.
        """

    @abstractmethod
    def _log_(self, mel: torch.Tensor, peaks: torch.Tensor | None) -> None:
        """Clamp and take the log of ``(frames, n_mels)`` mel power in place.

        ``peaks``: ``(frames,)`` float32 to receive each frame's largest log
        value, before any scaling ``_log_`` applies after the log (given where
        :attr:`frame_peaks` is set, else None).
        """

    def _finish(  # noqa: B027 (a hook)
        self, batch: torch.Tensor, counts: np.ndarray, state: np.ndarray | None, peaks: torch.Tensor | None
    ) -> None:
        """Post-process a ``(S, width, n_mels)`` batch in place; row ``s`` holds ``counts[s]`` frames, zeros after.

        ``state`` is None for whole utterances, else the per-stream state from
        :meth:`_new_state`; ``peaks``: ``(S, width)`` float32, each frame's
        peak as ``_log_`` recorded it (where :attr:`frame_peaks` is set; any
        value past ``counts``). The zeros past ``counts`` must stay zeros.
        """

    def _new_state(self, count: int) -> np.ndarray | None:
        """Per-stream state carried between pushes (None when there is none)."""
        return None

    def num_frames(self, num_samples: int | np.ndarray) -> int | np.ndarray:
        """Valid feature frames of an utterance of ``num_samples`` samples (before ``frame_multiple`` padding).

        >>> from audiomask.features import Phi4MMFrontend, WhisperFrontend
        >>> Phi4MMFrontend().num_frames(16000), WhisperFrontend().num_frames(16000)
        (98, 100)
        """
        return self.framing.count(np.maximum(num_samples, self.min_samples))

    def _padded_frames(self, frames: int | np.ndarray) -> int | np.ndarray:
        """``frames`` rounded up to a multiple of :attr:`frame_multiple`."""
        return -(-frames // self.frame_multiple) * self.frame_multiple

    def _features(self, packed: PackedFrames, width: int, state: np.ndarray | None) -> np.ndarray:
        """Every segment's features, zero-padded to ``width`` frames, time on :attr:`time_axis`."""
        mel, peaks = self._log_mel(packed)
        batch = self._layout(mel, packed.counts, width)
        self._finish(batch, packed.counts, state, None if peaks is None else self._layout(peaks, packed.counts, width))
        if self.time_axis == 1:
            batch = batch.transpose(1, 2)
        return batch.contiguous().numpy()

    def _log_mel(self, packed: PackedFrames) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(K, n_mels)`` float32 log-mel of every segment's frames, in segment order, and their ``(K,)``
        peaks (None unless :attr:`frame_peaks`)."""
        total = packed.total_frames()
        mel = torch.empty((total, self.n_mels), dtype=torch.float32)
        peaks = torch.empty(total, dtype=torch.float32) if self.frame_peaks else None
        self._log_mel_into(packed.flat, mel, peaks)
        rows = packed.rows()
        if rows is None:
            return mel, peaks
        return mel.index_select(0, rows), None if peaks is None else peaks.index_select(0, rows)

    def _log_mel_into(self, flat: torch.Tensor, mel: torch.Tensor, peaks: torch.Tensor | None = None) -> None:
        """Log-mel of the first ``len(mel)`` frames of a flat float32 signal into ``(frames, n_mels)`` float32 ``mel``.

        Frame ``f`` is ``flat[hop * f : hop * f + win]``; the frames go through
        slabs of :data:`SLAB_FRAMES` counted from frame 0, each slab's log taken
        while it is in the cache. ``peaks``: ``(frames,)`` float32 for each
        frame's peak (see ``_log_``), where :attr:`frame_peaks` is set.
        """
        win, hop = self.framing.win, self.framing.hop
        total = len(mel)
        for start in range(0, total, SLAB_FRAMES):
            frames = min(SLAB_FRAMES, total - start)
            signal = flat[hop * start : hop * (start + frames - 1) + win]
            slab = mel[start : start + frames]
            self._mel_power_into(signal, frames, slab)
            self._log_(slab, None if peaks is None else peaks[start : start + frames])

    def _layout(self, features: torch.Tensor, counts: np.ndarray, width: int) -> torch.Tensor:
        """Scatter ``(K, ...)`` segment-ordered values of frames (features ``(K, n_mels)``, peaks ``(K,)``) into a
        zero-padded ``(S, width, ...)`` batch."""
        if len(counts) == 1 and width == len(features):
            return features[None]
        batch = torch.zeros((len(counts), width, *features.shape[1:]), dtype=torch.float32)
        row, col = ragged_index(counts)
        batch[torch.from_numpy(row), torch.from_numpy(col)] = features
        return batch

    def __call__(self, samples: object) -> np.ndarray:
        """Features of one utterance.

        Args:
            samples: ``(N,)`` float samples at 16 kHz in [-1, 1].

        Returns:
            float32 features, ``(T, n_mels)`` or ``(n_mels, T)`` per :attr:`time_axis`.
        """
        features, _ = self._batch([as_samples("samples", samples)])
        return features[0]

    def batch(self, signals: Sequence[object]) -> tuple[np.ndarray, np.ndarray]:
        """Features of several utterances of any lengths, computed together.

        Args:
            signals: ``B`` arrays of ``(N_b,)`` float samples at 16 kHz.

        Returns:
            ``(features, lengths)``: float32 features ``(B, T_max, n_mels)`` or
            ``(B, n_mels, T_max)`` (per :attr:`time_axis`), zero-padded; and
            ``(B,)`` int64 valid frames per row (:meth:`num_frames`). The first
            ``lengths[b]`` frames of row ``b`` equal ``self(signals[b])``'s;
            ``T_max`` is the longest of those single-utterance outputs.
        """
        if isinstance(signals, (np.ndarray, torch.Tensor)) and signals.ndim == 1:
            raise ValueError(f"signals must be a sequence of 1-D arrays, got one 1-D array of shape {signals.shape}")
        return self._batch([as_samples(f"signals[{index}]", signal) for index, signal in enumerate(signals)])

    def _batch(self, signals: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`batch` on checked float32 signals."""
        segments, counts = [], []
        for samples in signals:
            if len(samples) < self.min_samples:
                samples = np.concatenate((samples, np.zeros(self.min_samples - len(samples), np.float32)))
            frames = self.framing.count(len(samples))
            segments.append(self.framing.segment(self.framing.pad_signal(samples), frames))
            counts.append(frames)
        if not segments:
            raise ValueError("signals must hold at least one signal, got an empty sequence")
        packed = pack(segments, counts, self.framing)
        return self._features(packed, self._padded_frames(max(counts)), None), packed.counts

    def stream(self) -> FeatureStream:
        """A stream: ``push(samples)`` returns the frames now complete, ``flush()`` the rest."""
        return FeatureStream(self)

    def streams(self, count: int) -> FeatureStreams:
        """``count`` independent streams pushed together, each push computed in one batched call."""
        return FeatureStreams(self, count)


class FeatureStreams:
    """Independent streams that push and flush together, their frames computed in one batched call.

    Each stream's frames, concatenated over its pushes and its flush, equal
    the frontend's features of its whole signal (for Whisper: with the
    running floor, see :class:`~audiomask.features.WhisperFrontend`).

    Args:
        frontend: the front end whose features to compute.
        count: number of streams, ``>= 1``.

    >>> import numpy as np
    >>> from audiomask.features import Phi4MMFrontend
    >>> streams = Phi4MMFrontend().streams(3)
    >>> features, counts = streams.push([np.zeros(1600, np.float32), np.zeros(0, np.float32), np.zeros(560, np.float32)])
    >>> features.shape, counts.tolist()   # (S, T_max, 80): 8, 0 and 2 new frames
    ((3, 8, 80), [8, 0, 2])
    """

    def __init__(self, frontend: Frontend, count: int) -> None:
        count = check_int("count", count, minimum=1)
        self.frontend = frontend
        self._framers = [StreamFramer(frontend.framing) for _ in range(count)]
        self._state = frontend._new_state(count)
        self._flushed = False

    def __len__(self) -> int:
        return len(self._framers)

    def _emit(
        self,
        pieces: list[tuple[np.ndarray, int]],
        extra: np.ndarray | None = None,
        state: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        segments, counts = zip(*pieces)
        packed = pack(segments, counts, self.frontend.framing)
        counts = packed.counts if extra is None else packed.counts + extra
        return self.frontend._features(packed, int(counts.max()), self._state if state is None else state), counts

    def push(self, chunks: Sequence[object], indices: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Push one chunk per stream (any lengths, empty allowed), or one per stream of ``indices``.

        ``indices``: distinct stream indices; only those streams are pushed (the others cost nothing), row
        ``r`` of the result being stream ``indices[r]``'s.

        Returns:
            ``(features, counts)``: the frames now complete, zero-padded
            ``(S, T_max, n_mels)`` or ``(S, n_mels, T_max)``, and ``(S,)``
            int64 new frames per stream (``S``: the streams pushed).
        """
        if self._flushed:
            raise ValueError("push after flush: these streams have ended")
        if indices is None:
            rows = np.arange(len(self._framers))
        else:
            rows = np.asarray(indices, dtype=np.int64).reshape(-1)
            if len(rows) == 0 or rows.min() < 0 or rows.max() >= len(self._framers) or len(np.unique(rows)) < len(rows):
                raise ValueError(f"indices must be distinct stream indices below {len(self._framers)}, got {indices!r}")
        if len(chunks) != len(rows):
            raise ValueError(f"chunks must hold one chunk per stream ({len(rows)}), got {len(chunks)}")
        checked = [as_samples(f"chunks[{index}]", chunk) for index, chunk in enumerate(chunks)]  # all, before any push
        pieces = [self._framers[row].push(chunk) for row, chunk in zip(rows.tolist(), checked)]
        if indices is None or self._state is None:
            return self._emit(pieces)
        state = self._state[rows]  # the pushed streams' state, carried through the call and stored back
        result = self._emit(pieces, state=state)
        self._state[rows] = state
        return result

    def reset(self, index: int) -> None:
        """Start stream ``index`` over in place: a new signal, as a new stream's (the others unchanged)."""
        if self._flushed:
            raise ValueError("reset after flush: these streams have ended")
        index = check_int("index", index, minimum=0, maximum=len(self._framers) - 1)
        self._framers[index] = StreamFramer(self.frontend.framing)
        if self._state is not None:
            self._state[index] = self.frontend._new_state(1)[0]

    def flush(self) -> tuple[np.ndarray, np.ndarray]:
        """End every stream: the remaining frames, as :meth:`push` returns them.

        These include the frames that need the end of the signal and, with
        ``frame_multiple``, the zero frames that pad each stream's total.
        """
        if self._flushed:
            raise ValueError("flush called twice: these streams have already ended")
        self._flushed = True
        frontend = self.frontend
        pieces = [framer.flush(frontend.min_samples) for framer in self._framers]
        totals = np.array([framer.frames for framer in self._framers], dtype=np.int64)
        return self._emit(pieces, extra=frontend._padded_frames(totals) - totals)


class FeatureStream:
    """One stream of a front end: ``push(samples) -> frames``, ``flush() -> frames``.

    The frames of all pushes and the flush, concatenated along the time axis,
    equal the front end's features of the whole signal.
    """

    def __init__(self, frontend: Frontend) -> None:
        self._streams = FeatureStreams(frontend, 1)

    def push(self, samples: object) -> np.ndarray:
        """Features of the frames ``samples`` completes: ``(k, n_mels)`` or ``(n_mels, k)`` float32."""
        features, _ = self._streams.push([samples])
        return features[0]

    def flush(self) -> np.ndarray:
        """Features of the remaining frames, as :meth:`push` returns them."""
        features, _ = self._streams.flush()
        return features[0]
