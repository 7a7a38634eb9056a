"""Speech probabilities of many streams at once: one Silero network call per 32 ms window position.

A :class:`VoiceActivity` keeps each open stream's network state, its last
:data:`~audiomask.vad.silero.CONTEXT_SAMPLES` samples and the samples short of a
whole window. :meth:`VoiceActivity.score` takes the new samples of any number
of streams and scores every whole window they complete in one network call
(:class:`~audiomask.vad.silero.SileroVAD`), so scoring a block of audio for a
thousand streams costs one call, not a thousand. A stream's scores are those
Silero's own model gives it alone, window by window (the batch rows do not mix).

>>> import numpy as np
>>> activity = VoiceActivity()
>>> quiet, loud = activity.open(), activity.open()
>>> tone = 0.5 * np.sin(np.arange(16_000) * 0.2).astype(np.float32)
>>> scores = activity.score([(quiet, np.zeros(1_000, np.float32)), (loud, tone)])
>>> [len(s) for s in scores]   # 1,000 samples: one whole window; 16,000: 31, and 128 samples wait
[1, 31]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from audiomask.transfer import to_device, to_host
from audiomask.vad.silero import CONTEXT_SAMPLES, WINDOW_SAMPLES, WINDOW_SPAN, SileroVAD

__all__ = ["INITIAL_ROWS", "VoiceActivity"]

INITIAL_ROWS = 64  # rows of the state table at first (it doubles when full)


class _Stream:
    """One stream's place in the detector: its row of the state table, context and samples short of a window."""

    __slots__ = ("context", "rest", "row")

    def __init__(self, row: int) -> None:
        self.row = row  # its row of the detector's state table
        self.context = np.zeros(CONTEXT_SAMPLES, np.float32)
        self.rest = np.zeros(0, np.float32)


_CLOSED = _Stream(-1)  # what a key closed stands for in a call: no samples, no window


class VoiceActivity:
    """Silero speech probabilities of many streams, batched (see the module docstring).

    Args:
        model: the network (default: :meth:`SileroVAD.from_package`), moved to ``device``.
        device: where the network runs (a server's recognizer's device: its GPU where it has one); the windows
            go there through :func:`audiomask.transfer.to_device`.

    The streams' recurrent states are rows of one table on ``device`` (rows of closed streams are reused, the
    table doubles when full), gathered and scattered once per call. Thread-safe: calls of :meth:`score` run one
    at a time; :meth:`open` and :meth:`close` never wait for one (a server's event loop calls them): they hand
    out and take back keys and rows under a lock of their own, held for a few lines: a new stream's row is
    zeroed (the table grown) by the next call, a closed stream's row read by the call in flight is free once
    it is over. On a GPU every call runs on a CUDA stream of the detector's own, of high priority: a call
    waits for its own few kernels, not for the work other threads have queued on the device (a recognizer's
    step), and its kernels go first.
    """

    def __init__(self, model: SileroVAD | None = None, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(self.device, priority=-1) if self.device.type == "cuda" else None
        with torch.cuda.stream(self._stream):  # the state table is only ever touched on that stream
            self.model = (model if model is not None else SileroVAD.from_package()).to(self.device)
            self._states = self.model.initial_state(INITIAL_ROWS, self.device)  # (2, rows, HIDDEN_SIZE)
        self._lock = threading.Lock()  # one call at a time: the state table and the streams' samples
        self._book = threading.Lock()  # the keys, rows and the lists below; never held across the device
        self._streams: dict[int, _Stream] = {}
        self._next_key = 0
        self._rows = 0  # rows ever handed out: rows 0 .. _rows - 1 are held or free
        self._free: list[int] = []  # rows no stream holds and no call in flight reads
        self._opened: list[int] = []  # rows handed to new streams since the last call began: zeroed by the next
        self._reading: set[int] = set()  # rows of the call in flight
        self._closed: list[int] = []  # rows of those whose streams closed meanwhile: free once it is over

    def open(self) -> int:
        """A new stream, which has heard nothing: its key for :meth:`score` and :meth:`close`."""
        with self._book:
            if self._free:
                row = self._free.pop()
            else:
                row, self._rows = self._rows, self._rows + 1
            self._opened.append(row)
            key, self._next_key = self._next_key, self._next_key + 1
            self._streams[key] = _Stream(row)
            return key

    def close(self, key: int) -> None:
        """Forget stream ``key`` (a key closed already is ignored)."""
        with self._book:
            stream = self._streams.pop(key, None)
            if stream is not None:
                (self._closed if stream.row in self._reading else self._free).append(stream.row)

    def score(self, pieces: Sequence[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        """Each stream's new samples ``(n,)`` float32 at 16 kHz, full scale +-1, in: for each, the speech
        probabilities ``(w,)`` float32 of the ``w`` whole windows they complete, in order. A stream may appear
        once per call; one closed (its connection gone while a pass fed it) scores nothing."""
        with self._lock:
            with self._book:
                streams = [self._streams.get(key, _CLOSED) for key, _ in pieces]
                opened, self._opened, rows = self._opened, [], self._rows
                self._reading = {stream.row for stream in streams}
            try:
                self._prepare(opened, rows)
                return self._score(pieces, streams)
            finally:
                with self._book:
                    self._free += self._closed
                    self._closed, self._reading = [], set()

    def _score(self, pieces: Sequence[tuple[int, np.ndarray]], streams: list[_Stream]) -> list[np.ndarray]:
        """:meth:`score` of ``pieces`` by the streams ``streams`` (:data:`_CLOSED` for a closed one)."""
        if len({key for key, _ in pieces}) != len(pieces):
            raise ValueError("score: a stream appears twice in one call")
        if not pieces:
            return []
        # Row r's span (its context, its samples short of a window, its new samples) is flat[starts[r]:
        # ends[r]]; its windows start every WINDOW_SAMPLES from starts[r]: all gathered in one indexing, so that
        # the Python a call runs (under the interpreter lock, on a server's feeder thread) is little per stream.
        parts = []
        for stream, (_, samples) in zip(streams, pieces):
            parts += (stream.context, stream.rest, np.asarray(samples, np.float32))
        lengths = np.array([len(part) for part in parts], np.int64).reshape(-1, 3)
        flat = np.concatenate(parts)
        ends = np.cumsum(lengths.sum(axis=1))
        starts = ends - lengths.sum(axis=1)
        counts = (lengths[:, 1] + lengths[:, 2]) // WINDOW_SAMPLES
        counts[[row for row, stream in enumerate(streams) if stream is _CLOSED]] = 0
        for row, stream in enumerate(streams):
            if stream is not _CLOSED:
                used = starts[row] + counts[row] * WINDOW_SAMPLES  # its next window's context starts here
                stream.context = flat[used : used + CONTEXT_SAMPLES].copy()
                stream.rest = flat[used + CONTEXT_SAMPLES : ends[row]].copy()
        scored = np.flatnonzero(counts)
        scores = [np.zeros(0, np.float32) for _ in pieces]
        if not len(scored):
            return scores
        depth = int(counts.max())
        offsets = np.arange(depth) * WINDOW_SAMPLES
        present = offsets[None, :] < counts[scored, None] * WINDOW_SAMPLES  # (B, depth): a whole window
        spans = np.lib.stride_tricks.sliding_window_view(flat, WINDOW_SPAN)  # a view: span i is flat[i:i + SPAN]
        windows = spans[np.where(present, starts[scored, None] + offsets[None, :], 0)]  # (B, depth, SPAN)
        windows[~present] = 0.0
        heard = self._run(windows, [streams[row].row for row in scored], counts[scored].tolist())
        for index, row in enumerate(scored.tolist()):
            scores[row] = heard[index, : counts[row]]
        return scores

    @torch.inference_mode()
    def _prepare(self, opened: list[int], rows: int) -> None:
        """The state table holding ``rows`` rows at least (doubled until it does), ``opened`` rows zeroed."""
        with torch.cuda.stream(self._stream):
            size = self._states.shape[1]
            if rows > size:
                grown = max(2 * size, rows)
                self._states = torch.cat((self._states, self.model.initial_state(grown - size, self.device)), dim=1)
            if opened:
                self._states[:, to_device(np.asarray(opened, np.int64), self.device)] = 0

    @torch.inference_mode()
    def _run(self, windows: np.ndarray, rows: list[int], counts: list[int]) -> np.ndarray:
        """Scores ``(B, depth)`` of ``windows`` ``(B, depth, WINDOW_SPAN)`` (each stream's first ``count``) in
        one network call, from and into the state table's ``rows`` (on the detector's CUDA stream)."""
        with torch.cuda.stream(self._stream):
            index = to_device(np.asarray(rows, np.int64), self.device)
            heard, state = self.model(
                to_device(windows, self.device), torch.tensor(counts), self._states.index_select(1, index)
            )
            self._states.index_copy_(1, index, state)
            host, copied = to_host(heard)
        if copied is not None:
            copied.synchronize()
        return host.numpy()
