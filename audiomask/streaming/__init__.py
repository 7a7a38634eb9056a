"""Cache-aware chunk-by-chunk encoding: one slots class per encoder family, a batch of slots in each.

- :class:`EncoderSlots` (:mod:`audiomask.streaming.protocol`): the chunk-step
  protocol every family implements and drivers rely on (slots,
  ``reset_slots``, ``step``, chunk geometry, the family's front end).
- :class:`Phi4MMSlots` (:mod:`audiomask.streaming.phi4mm`): outputs equal
  the whole-utterance forward with ``mask_mode="hard"``.
- :class:`Qwen3ASRSlots` (:mod:`audiomask.streaming.qwen3_asr`): outputs of
  completed attention windows equal the offline forward.
- :class:`ChunkPlan` (:mod:`audiomask.streaming.plan`): a configuration's
  sizes (chunk, tokens, blocks of samples, state bytes), made once by its family.
- :func:`chunk_plan` / :func:`open_slots` / :func:`default_frontend`: the
  plan, the slots and the front end of an encoder's family, for code that
  takes any encoder.

An encoder's slots are a fixed batch of ``B`` rows with preallocated caches,
each encoding one utterance at a time; the masks a step needs are built in numpy on the host and moved with
:func:`audiomask.transfer.to_device`.
"""

from __future__ import annotations

from audiomask.streaming.families import chunk_plan, default_frontend, open_slots
from audiomask.streaming.phi4mm import Phi4MMSlots
from audiomask.streaming.plan import ChunkPlan
from audiomask.streaming.protocol import EncoderSlots, as_lanes, share_graph_memory
from audiomask.streaming.qwen3_asr import Qwen3ASRSlots

__all__ = [
    "ChunkPlan",
    "EncoderSlots",
    "Phi4MMSlots",
    "Qwen3ASRSlots",
    "as_lanes",
    "chunk_plan",
    "default_frontend",
    "open_slots",
    "share_graph_memory",
]
