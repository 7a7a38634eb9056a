"""Cache-aware chunk-by-chunk encoding: one stream class per encoder family, many stream slots per batch.

- :class:`EncoderStream` (:mod:`audiomask.streaming.protocol`): the chunk-step
  protocol every family implements and drivers rely on (slots,
  ``reset_slots``, ``step``, chunk geometry, the family's front end).
- :class:`Phi4MMStream` (:mod:`audiomask.streaming.phi4mm`): outputs equal
  the whole-utterance forward with ``mask_mode="hard"``.
- :class:`Qwen3ASRStream` (:mod:`audiomask.streaming.qwen3_asr`): outputs of
  completed attention windows equal the offline forward.
- :func:`open_stream` / :func:`default_frontend`: the stream and the front end
  of an encoder's family, for code that takes any encoder.

Every stream takes a fixed batch of ``B`` slots with preallocated caches;
the masks a step needs are built in numpy on the host and moved with
:func:`audiomask.transfer.to_device`.
"""

from __future__ import annotations

from audiomask.streaming.families import default_frontend, open_stream
from audiomask.streaming.phi4mm import Phi4MMStream
from audiomask.streaming.protocol import EncoderStream, as_lanes
from audiomask.streaming.qwen3_asr import Qwen3ASRStream

__all__ = ["EncoderStream", "Phi4MMStream", "Qwen3ASRStream", "as_lanes", "default_frontend", "open_stream"]
