"""Where speech starts and stops in a stream, from Silero's speech probabilities. Numpy only (no torch).

An :class:`Endpointer` reads one stream's window scores (:mod:`audiomask.vad.silero`,
one per 32 ms window) and says where speech starts (a window scoring at least
``threshold``) and where it stops: at the start of the first quiet window (below
``threshold - HYSTERESIS``: Silero's own rule, so that a dip between words does
not count) once ``silence_ms`` of quiet windows have followed it. The stop is
known ``silence_ms`` after it, which is the delay a segment's end costs.
``prefix_padding_ms`` is how much audio before the start an utterance keeps
(OpenAI's server VAD reports the same three settings).

>>> endpointer = Endpointer(VADSettings(threshold=0.5, silence_ms=96, prefix_padding_ms=0))
>>> endpointer.push(np.array([0.1, 0.9, 0.9, 0.1, 0.2, 0.1, 0.1]))   # 32 ms windows
[SpeechStarted(sample=512), SpeechStopped(sample=1536, at=3072)]
>>> endpointer.speaking
False
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from audiomask.checks import check_int
from audiomask.constants import SAMPLE_RATE

__all__ = [
    "DEFAULT_PREFIX_PADDING_MS",
    "DEFAULT_SILENCE_MS",
    "DEFAULT_THRESHOLD",
    "HYSTERESIS",
    "VAD_WINDOW_SAMPLES",
    "Endpointer",
    "SpeechStarted",
    "SpeechStopped",
    "VADSettings",
]

VAD_WINDOW_SAMPLES = 512  # samples per scored window (32 ms at 16 kHz): audiomask.vad.silero.WINDOW_SAMPLES
MS_PER_S = 1000
# Defaults for conversation, as OpenAI's server VAD has them: a turn ends after half a second of silence.
DEFAULT_THRESHOLD = 0.5  # speech probability at which speech starts
DEFAULT_SILENCE_MS = 500  # quiet after speech that ends it
DEFAULT_PREFIX_PADDING_MS = 300  # audio before the start that an utterance keeps
HYSTERESIS = 0.15  # once speaking, a window is quiet only below threshold - HYSTERESIS (Silero's VADIterator)


@dataclass(frozen=True)
class VADSettings:
    """Voice-activity endpointing: ``threshold`` in (0, 1), ``silence_ms`` and ``prefix_padding_ms`` >= 0, ms."""

    threshold: float = DEFAULT_THRESHOLD
    silence_ms: int = DEFAULT_SILENCE_MS
    prefix_padding_ms: int = DEFAULT_PREFIX_PADDING_MS

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)):
            raise TypeError(f"threshold must be a number in (0, 1), got {self.threshold!r}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        check_int("silence_ms", self.silence_ms, minimum=0)
        check_int("prefix_padding_ms", self.prefix_padding_ms, minimum=0)

    @property
    def silence_samples(self) -> int:
        """``silence_ms`` in samples at 16 kHz."""
        return self.silence_ms * SAMPLE_RATE // MS_PER_S

    @property
    def prefix_padding_samples(self) -> int:
        """``prefix_padding_ms`` in samples at 16 kHz."""
        return self.prefix_padding_ms * SAMPLE_RATE // MS_PER_S


@dataclass(frozen=True)
class SpeechStarted:
    """Speech starts at ``sample`` of the stream (the start of its first speech window)."""

    sample: int


@dataclass(frozen=True)
class SpeechStopped:
    """Speech stopped at ``sample`` of the stream (the start of its first quiet window); known ``at`` sample
    (the end of the window that made the quiet last ``silence_ms``)."""

    sample: int
    at: int


class Endpointer:
    """One stream's speech starts and stops, from its window scores in order (see the module docstring)."""

    def __init__(self, settings: VADSettings) -> None:
        self.settings = settings
        self.speaking = False
        self._windows = 0  # windows scored so far
        self._quiet_since: int | None = None  # first window of the quiet run while speaking

    @property
    def heard(self) -> int:
        """Samples scored so far (whole windows)."""
        return self._windows * VAD_WINDOW_SAMPLES

    @property
    def stop_due(self) -> int | None:
        """While speech has gone quiet: the sample whose window, if quiet too, stops it (``None`` otherwise)."""
        if not self.speaking or self._quiet_since is None:
            return None
        return (self._quiet_since + self._silence_windows) * VAD_WINDOW_SAMPLES

    @property
    def _silence_windows(self) -> int:
        """Quiet windows that stop speech: the silence setting, rounded up to whole windows (one at least)."""
        return max(1, -(-self.settings.silence_samples // VAD_WINDOW_SAMPLES))

    def push(self, scores: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        """Read the next windows' scores ``(n,)`` (probabilities of speech); the starts and stops they show."""
        settings = self.settings
        silence_windows = self._silence_windows
        events: list[SpeechStarted | SpeechStopped] = []
        for score in np.asarray(scores, np.float64).tolist():
            window = self._windows
            self._windows += 1
            if not self.speaking:
                if score >= settings.threshold:
                    self.speaking, self._quiet_since = True, None
                    events.append(SpeechStarted(window * VAD_WINDOW_SAMPLES))
                continue
            if score >= settings.threshold - HYSTERESIS:
                self._quiet_since = None
                continue
            if self._quiet_since is None:
                self._quiet_since = window
            if self._windows - self._quiet_since >= silence_windows:
                self.speaking = False
                events.append(SpeechStopped(self._quiet_since * VAD_WINDOW_SAMPLES, self.heard))
                self._quiet_since = None
        return events
