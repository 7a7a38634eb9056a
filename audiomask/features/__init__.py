"""CPU audio front ends: log-mel features for the Phi-4MM and Whisper / Qwen3-ASR encoders.

- :class:`Phi4MMFrontend`: 80 kaldi-mel log filterbanks, ``(T, 80)``.
- :class:`WhisperFrontend`: the Whisper / Qwen3-ASR log-mel, ``(n_mels, T)``
  (:meth:`WhisperFrontend.qwen3_asr` for Qwen3-ASR's padding rules).

Each takes 16 kHz float32 samples and offers one utterance
(``frontend(samples)``), a ragged batch (``frontend.batch(signals)`` ->
padded features and lengths), one stream (``frontend.stream()``: ``push`` /
``flush``) and many streams pushed together (``frontend.streams(count)``).
Every call computes all its frames in one batched torch computation.

>>> import numpy as np
>>> from audiomask.features import Phi4MMFrontend, WhisperFrontend
>>> signals = [np.zeros(16000, np.float32), np.zeros(8000, np.float32)]
>>> features, lengths = Phi4MMFrontend().batch(signals)
>>> features.shape, lengths.tolist()
((2, 98, 80), [98, 48])
>>> features, lengths = WhisperFrontend(n_mels=128).batch(signals)
>>> features.shape, lengths.tolist()
((2, 128, 100), [100, 50])
"""

from __future__ import annotations

from audiomask.features.frontend import FeatureStream, FeatureStreams, Frontend
from audiomask.features.phi4mm import Phi4MMFrontend
from audiomask.features.whisper import WhisperFrontend

__all__ = ["FeatureStream", "FeatureStreams", "Frontend", "Phi4MMFrontend", "WhisperFrontend"]
