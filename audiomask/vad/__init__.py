"""Voice-activity detection: where speech starts and stops in each stream, for endpointing.

- :mod:`~audiomask.vad.silero`: Silero VAD's network (the ``silero-vad`` package's weights) with its state
  explicit, so that one call scores a window of every stream;
- :mod:`~audiomask.vad.detector`: :class:`VoiceActivity`, the speech probabilities of many streams, batched;
- :mod:`~audiomask.vad.endpoints`: :class:`Endpointer`, one stream's speech starts and stops from its
  probabilities, by :class:`VADSettings` (threshold, silence, prefix padding). Numpy only.

Silero VAD over WebRTC's VAD: it ships its model inside a registry package (no download at run time), scores
32 ms windows with far fewer false starts in noise, and, rebuilt here with its state explicit, batches over
streams, so that a server's thousand connections cost one network call per window position. Needs the
``serve`` extra (``silero-vad``).
"""
