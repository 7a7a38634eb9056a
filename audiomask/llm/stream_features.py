"""The front end of many streams of an LLM recogniser, on threads: :class:`StreamFeatures`.

One :class:`~audiomask.features.frontend.FeatureStreams` holds a stream per
slot. An update pushes its due streams' chunks in one batched call a
front-end thread, a share of the streams each (torch's kernels let go of the
interpreter lock); while the update's encoder and decoder run on the device,
the threads take what the other streams have buffered of their next chunks
(:meth:`StreamFeatures.push_ahead`), so that their updates push only what came
since. A stream's frames do not depend on how its samples are split between
pushes, nor on which streams share a call: each frame is computed alone.

Threads share the interpreter lock with the thread that drives the device:
every torch call of the front end hands it over and takes it back, so while
that thread runs Python a push costs many times its time alone.
:class:`ProcessStreamFeatures` computes the pushes in processes of their own
instead (:class:`~audiomask.features.process.FeatureProcess`, the encoder
driver's front-end stage, each process owning a share of the slots): the
update's push is the due streams' chunks written into shared rings, one cycle
submitted, their rows read back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from audiomask.checks import check_int
from audiomask.features.frontend import FeatureStreams, Frontend
from audiomask.features.process import FeatureProcess, default_workers
from audiomask.features.slots import SlotCycle, SlotSamples

__all__ = [
    "DEFAULT_FRONTEND_THREADS",
    "FRONTEND_SHARE",
    "ProcessStreamFeatures",
    "StreamFeatures",
    "default_frontend_workers",
    "joined",
]

# Front-end threads: one per four cores, at most 4; on a host of under 8 cores, one (the calling thread). More
# threads make a push slower on the 16-core H200 host: their Python takes turns on the interpreter lock.
DEFAULT_FRONTEND_THREADS = max(1, min(4, (os.cpu_count() or 1) // 4))
FRONTEND_SHARE = 16  # fewest streams a front-end thread is given


def default_frontend_workers(device: str, slots: int) -> int:
    """Front-end processes for ``slots`` streams of an LLM recogniser on ``device`` when none are asked for: none
    on the CPU (threads), on CUDA :func:`~audiomask.features.process.default_workers` (one per four cores):
    there threads share the interpreter lock with the thread that drives the GPU, and a server's threads.

    >>> default_frontend_workers("cpu", 64), default_frontend_workers("cuda:0", 2) <= 2
    (0, True)
    """
    return default_workers(slots) if device.startswith("cuda") else 0


def joined(batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Offline front-end batches ``(features, lengths)`` as one, rows in order, zero-padded to the longest: what
    one :meth:`~audiomask.features.frontend.Frontend.batch` call over all their signals gives (each row is
    computed alone)."""
    shape = np.max([features.shape for features, _ in batches], axis=0)
    features = np.zeros((sum(len(part) for part, _ in batches), *shape[1:]), np.float32)
    start = 0
    for part, _ in batches:
        features[start : start + len(part), : part.shape[1], : part.shape[2]] = part
        start += len(part)
    return features, np.concatenate([lengths for _, lengths in batches])


class StreamFeatures:
    """``slots`` streams of ``frontend``, pushed over ``threads`` front-end threads (1: on the calling thread).

    :meth:`push` gives the frames a chunk completes (after those taken ahead of it), :meth:`push_ahead`
    starts taking the next samples of idle streams on the threads and :meth:`wait` waits for them;
    :meth:`ahead` is how many samples of a stream's next chunk are taken. One thread calls these; only the
    jobs :meth:`push_ahead` starts run beside it, each on slots no other call touches until :meth:`wait`.
    ``push_s``: wall seconds spent in :meth:`push`, over all calls (what is taken ahead is not in it).
    """

    def __init__(self, frontend: Frontend, slots: int, threads: int) -> None:
        self.frontend = frontend
        self.streams: FeatureStreams = frontend.streams(slots)
        self._time_major = frontend.time_axis == 0  # its frames (B, T, bins): given out as (B, bins, T)
        self.threads = check_int("frontend_threads", threads, minimum=1)
        self._pool = ThreadPoolExecutor(self.threads, "audiomask-frontend") if self.threads > 1 else None
        # Slot s's stream has taken the first _ahead[s] samples of its next chunk; their frames wait in _early[s].
        self._ahead = np.zeros(slots, np.int64)
        self._early: list[list[np.ndarray]] = [[] for _ in range(slots)]
        self._jobs: list[Future] = []
        self.push_s = 0.0

    def reset(self, slot: int) -> None:
        """Start slot ``slot``'s stream over (a new signal), anything taken ahead dropped."""
        self.streams.reset(slot)
        self._ahead[slot], self._early[slot] = 0, []

    @property
    def takes_ahead(self) -> bool:
        """Whether :meth:`push_ahead` takes anything (it needs threads)."""
        return self._pool is not None

    def ahead(self, slot: int) -> int:
        """Samples of slot ``slot``'s next chunk already taken (their frames come with its :meth:`push`)."""
        return int(self._ahead[slot])

    def push(self, chunks: Sequence[np.ndarray], slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The frames of ``chunks`` (each the whole next chunk of the stream of ``slots[r]``, its first
        :meth:`ahead` samples included): ``(B, bins, T)`` float32 whatever the front end's time axis, zeros after
        each row's ``(B,)`` counts."""
        began = time.perf_counter()
        try:
            return self._push_after_ahead(chunks, slots)
        finally:
            self.push_s += time.perf_counter() - began

    def _push_after_ahead(self, chunks: Sequence[np.ndarray], slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        taken = self._ahead[slots]
        new, added = self._push_shared([chunk[skip:] for chunk, skip in zip(chunks, taken.tolist())], slots)
        if not taken.any():
            return new, added
        pieces = [self._early[slot] + [new[row, :, : added[row]]] for row, slot in enumerate(slots.tolist())]
        counts = np.array([sum(piece.shape[1] for piece in row) for row in pieces], np.int64)
        frames = np.zeros((len(slots), new.shape[1], max(1, int(counts.max()))), np.float32)
        for row, slot in enumerate(slots.tolist()):
            frames[row, :, : counts[row]] = np.concatenate(pieces[row], axis=1)
            self._ahead[slot], self._early[slot] = 0, []
        return frames, counts

    def _push_shared(self, chunks: list[np.ndarray], slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_push_one` over the threads, a share each."""
        shares = len(slots) // FRONTEND_SHARE
        if self._pool is None or shares < 2:
            return self._push_one(chunks, slots)
        parts = np.array_split(np.arange(len(slots)), min(shares, self.threads))
        futures = [self._pool.submit(self._push_one, [chunks[row] for row in part], slots[part]) for part in parts]
        pushed = [future.result() for future in futures]
        added = np.concatenate([counts for _, counts in pushed])
        new = np.zeros((len(slots), pushed[0][0].shape[1], max(1, int(added.max()))), np.float32)
        for part, (frames, _) in zip(parts, pushed, strict=True):
            new[part[0] : part[-1] + 1, :, : frames.shape[2]] = frames
        return new, added

    def _push_one(self, chunks: Sequence[np.ndarray], slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``self.streams.push(chunks, indices=slots)``, its frames ``(B, bins, T)``."""
        frames, counts = self.streams.push(chunks, indices=slots)
        return (frames.transpose(0, 2, 1) if self._time_major else frames), counts

    def batch(self, signals: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The front end's offline :meth:`~audiomask.features.frontend.Frontend.batch` of whole utterances
        ``signals`` (1-D float32 samples each), split over the threads in runs of consecutive signals of about
        equal samples: the same ``(features, lengths)`` as one call (each row is computed alone, zero-padded to the
        longest row's frames)."""
        parts = min(len(signals), self.threads if self._pool is not None else 1)
        if parts < 2:
            return self.frontend.batch(signals)
        ends = np.cumsum([len(signal) for signal in signals])
        cuts = np.searchsorted(ends, ends[-1] * np.arange(1, parts) / parts, side="right")
        bounds = [0, *sorted(set(cuts.tolist()) - {0, len(signals)}), len(signals)]
        futures = [self._pool.submit(self.frontend.batch, signals[a:b]) for a, b in zip(bounds, bounds[1:])]
        return joined([future.result() for future in futures])

    def batch_later(self, signals: Sequence[np.ndarray]) -> Future:
        """The front end's offline ``batch(signals)`` started on a front-end thread now, beside whatever the
        caller does next (without threads: computed now); its future. Several such batches join into the one
        batch of all their signals (:func:`joined`)."""
        if self._pool is None:
            future: Future = Future()
            future.set_result(self.frontend.batch(signals))
            return future
        return self._pool.submit(self.frontend.batch, signals)

    def push_ahead(self, pieces: Sequence[np.ndarray], slots: Sequence[int]) -> None:
        """Start taking ``pieces[r]``, the samples of slot ``slots[r]``'s next chunk after its :meth:`ahead`
        ones, on the threads, a share each; returns at once. Without threads, nothing is taken."""
        if self._pool is None or not len(slots):
            return
        slots = np.asarray(slots, np.int64)
        for part in np.array_split(np.arange(len(slots)), max(1, min(len(slots) // FRONTEND_SHARE, self.threads))):
            self._jobs.append(self._pool.submit(self._take, [pieces[row] for row in part], slots[part]))

    def _take(self, pieces: list[np.ndarray], slots: np.ndarray) -> None:
        new, added = self._push_one(pieces, slots)
        for row, slot in enumerate(slots.tolist()):
            self._early[slot].append(new[row, :, : added[row]])
            self._ahead[slot] += len(pieces[row])

    def wait(self) -> None:
        """Wait for every job :meth:`push_ahead` started, then raise the first one's error, if any."""
        jobs, self._jobs = self._jobs, []
        wait(jobs)
        for job in jobs:
            job.result()

    def close(self) -> None:
        """Stop the threads (after their jobs). Idempotent."""
        if self._pool is not None:
            self.wait()
            self._pool.shutdown()
            self._pool = None


class ProcessStreamFeatures(StreamFeatures):
    """:class:`StreamFeatures` whose :meth:`push` runs in ``workers`` processes, a share of the slots each.

    Each slot's frames are those of the front end's stream of its samples (each frame computed alone, as on the
    threads); ``chunk_samples``: the most samples one push gives a slot (a ring's size). Nothing is taken
    ahead (:attr:`takes_ahead` is false: the push runs beside nothing of this process's Python). ``threads``:
    threads for :meth:`batch` (the offline front end of whole utterances), as :class:`StreamFeatures`'.
    Starting the processes takes seconds (an interpreter and torch's import each); :meth:`close` stops them.
    """

    def __init__(self, frontend: Frontend, slots: int, threads: int, workers: int, chunk_samples: int) -> None:
        super().__init__(frontend, slots, threads)
        workers = check_int("frontend_workers", workers, minimum=1, maximum=slots)
        self.chunk_samples = check_int("chunk_samples", chunk_samples, minimum=1)
        hop = frontend.framing.hop
        # A push of n samples completes at most ceil(n / hop) frames: the framer holds under a frame's samples.
        self._process = FeatureProcess(frontend, slots, -(-chunk_samples // hop), chunk_samples, workers=workers)
        self._rings = SlotSamples(self._process.samples)
        self._joining = np.ones(slots, bool)  # the slot's next push starts its stream afresh

    @property
    def takes_ahead(self) -> bool:
        return False

    def reset(self, slot: int) -> None:
        """Start slot ``slot``'s stream over (a new signal) at its next push."""
        self._joining[slot] = True

    def push_ahead(self, pieces: Sequence[np.ndarray], slots: Sequence[int]) -> None:
        """Nothing: the processes take a stream's samples with its :meth:`push`."""

    def _push_after_ahead(self, chunks: Sequence[np.ndarray], slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.array([len(chunk) for chunk in chunks], np.int64)
        if len(lengths) and lengths.max() > self.chunk_samples:
            raise ValueError(f"a chunk holds {int(lengths.max())} samples, over chunk_samples={self.chunk_samples}")
        # One cycle at a time, its result taken before the next: each chunk is written at the start of its ring.
        for slot, chunk in zip(slots.tolist(), chunks, strict=True):
            self._rings.write(slot, 0, chunk)
        size = len(self._joining)
        cycle = SlotCycle(*(np.zeros(size, bool) for _ in range(3)), np.zeros(size, np.int64), np.zeros(size, np.int64))
        cycle.active[slots], cycle.join[slots], cycle.length[slots] = True, self._joining[slots], lengths
        self._joining[slots] = False
        self._process.submit(cycle)
        result = self._process.result()
        counts = result.counts[slots]
        width = max(1, int(counts.max(initial=0)))
        if self._time_major:  # (B, chunk_frames, bins)
            return np.ascontiguousarray(result.features[slots, :width].transpose(0, 2, 1)), counts
        return result.features[slots, :, :width], counts  # a copy (the rows picked): (S, bins, T)

    def close(self) -> None:
        """Stop the processes and the threads. Idempotent."""
        self._process.close()
        super().close()
