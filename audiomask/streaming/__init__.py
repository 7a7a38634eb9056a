"""Cache-aware chunk-by-chunk encoding: one stream class per encoder family, many stream slots per batch.

- :class:`EncoderStream` (:mod:`audiomask.streaming.protocol`): the chunk-step
  protocol every family implements and drivers rely on (slots,
  ``reset_slots``, ``step``, chunk geometry, the family's front end).
- :class:`Phi4MMStream` (:mod:`audiomask.streaming.phi4mm`): outputs equal
  the whole-utterance forward with ``mask_mode="hard"``.
- :class:`Qwen3ASRStream` (:mod:`audiomask.streaming.qwen3_asr`): outputs of
  completed attention windows equal the offline forward.
- :class:`ChunkPlan` (:mod:`audiomask.streaming.plan`): a configuration's
  sizes (chunk, tokens, blocks of samples, state bytes), made once by its family.
- :func:`chunk_plan` / :func:`open_stream` / :func:`default_frontend`: the
  plan, the stream and the front end of an encoder's family, for code that
  takes any encoder.

Every stream takes a fixed batch of ``B`` slots with preallocated caches;
the masks a step needs are built in numpy on the host and moved with
:func:`audiomask.transfer.to_device`.
"""

from __future__ import annotations

from audiomask.streaming.families import chunk_plan, default_frontend, open_stream
from audiomask.streaming.phi4mm import Phi4MMStream
from audiomask.streaming.plan import ChunkPlan
from audiomask.streaming.protocol import EncoderStream, as_lanes
from audiomask.streaming.qwen3_asr import Qwen3ASRStream

__all__ = [
    "ChunkPlan",
    "EncoderStream",
    "Phi4MMStream",
    "Qwen3ASRStream",
    "as_lanes",
    "chunk_plan",
    "default_frontend",
    "open_stream",
]
