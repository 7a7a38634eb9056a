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

from audiomask.vad.silero import CONTEXT_SAMPLES, WINDOW_SAMPLES, WINDOW_SPAN, SileroVAD

__all__ = ["VoiceActivity"]


class _Stream:
    """One stream's place in the detector: its network state, context and samples short of a window."""

    __slots__ = ("context", "rest", "state")

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state  # (2, HIDDEN_SIZE)
        self.context = np.zeros(CONTEXT_SAMPLES, np.float32)
        self.rest = np.zeros(0, np.float32)


class VoiceActivity:
    """Silero speech probabilities of many streams, batched (see the module docstring).

    Args:
        model: the network (default: :meth:`SileroVAD.from_package`, on the CPU).

    Thread-safe: one lock guards the streams; scoring holds it (callers score from one thread in practice).
    """

    def __init__(self, model: SileroVAD | None = None) -> None:
        self.model = model if model is not None else SileroVAD.from_package()
        self._streams: dict[int, _Stream] = {}
        self._next_key = 0
        self._lock = threading.Lock()

    def open(self) -> int:
        """A new stream, which has heard nothing: its key for :meth:`score` and :meth:`close`."""
        with self._lock:
            key, self._next_key = self._next_key, self._next_key + 1
            self._streams[key] = _Stream(self.model.initial_state(1)[:, 0])
            return key

    def close(self, key: int) -> None:
        """Forget stream ``key`` (a key closed already is ignored)."""
        with self._lock:
            self._streams.pop(key, None)

    def score(self, pieces: Sequence[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        """Each stream's new samples ``(n,)`` float32 at 16 kHz, full scale +-1, in: for each, the speech
        probabilities ``(w,)`` float32 of the ``w`` whole windows they complete, in order. A stream may appear
        once per call; ``KeyError`` for a key not open."""
        with self._lock:
            streams = [self._streams[key] for key, _ in pieces]
            if len({id(s) for s in streams}) != len(streams):
                raise ValueError("score: a stream appears twice in one call")
            spans = []
            for stream, (_, samples) in zip(streams, pieces):
                audio = np.concatenate((stream.rest, np.asarray(samples, np.float32)))
                whole = len(audio) // WINDOW_SAMPLES * WINDOW_SAMPLES
                spans.append(np.concatenate((stream.context, audio[:whole])))
                stream.rest = audio[whole:]
            counts = [(len(span) - CONTEXT_SAMPLES) // WINDOW_SAMPLES for span in spans]
            depth = max(counts, default=0)
            if depth == 0:
                return [np.zeros(0, np.float32) for _ in pieces]
            windows = np.zeros((len(spans), depth, WINDOW_SPAN), np.float32)
            for row, (span, count) in enumerate(zip(spans, counts)):
                if count:
                    windows[row, :count] = np.lib.stride_tricks.sliding_window_view(span, WINDOW_SPAN)[
                        ::WINDOW_SAMPLES
                    ][:count]
                    streams[row].context = span[-CONTEXT_SAMPLES:].copy()
            scores = self._run(streams, torch.from_numpy(windows), counts)
            return [scores[row, :count] for row, count in enumerate(counts)]

    @torch.inference_mode()
    def _run(self, streams: list[_Stream], windows: torch.Tensor, counts: list[int]) -> np.ndarray:
        """Scores ``(B, depth)`` of ``windows`` ``(B, depth, WINDOW_SPAN)``, each stream's first ``count`` in one
        network call (streams without a window are left out of it); their states move on."""
        scores = np.zeros(windows.shape[:2], np.float32)
        rows = [row for row, count in enumerate(counts) if count]
        state = torch.stack([streams[row].state for row in rows], dim=1)
        lengths = torch.tensor([counts[row] for row in rows])
        heard, state = self.model(windows[rows], lengths, state)
        scores[rows] = heard.numpy()
        for index, row in enumerate(rows):
            streams[row].state = state[:, index].clone()
        return scores
