"""Speech encoders that consume audiomask's masks, load transformers checkpoints, and stream chunk by chunk.

- :class:`Phi4MMEncoder` (:mod:`audiomask.models.phi4mm`): the Phi-4-multimodal
  audio Conformer; ``encoder(features (B, T, 80), lengths, *, chunk_size,
  left_chunk, mask_mode) -> (outputs (B, L, D), output_lengths)``;
  ``encoder.stream(...)`` for cache-aware chunk-by-chunk encoding.
- :class:`Qwen3ASREncoder` (:mod:`audiomask.models.qwen3_asr`): the
  Qwen3-ASR audio encoder; ``encoder(features (B, 128, T), lengths) ->
  (outputs (B, N_max, D), output_lengths)``; ``encoder.stream()``.
- :func:`from_pretrained`: either encoder from a local transformers checkpoint.
- :mod:`audiomask.models.attention`: the mask-convention converters
  (``may_attend_to_additive_bias``, ``may_attend_to_compat_bias``).

Parameter names and shapes equal transformers' ``Phi4MultimodalAudioModel``
and ``Qwen3ASREncoder``: their ``state_dict`` loads with ``load_state_dict``.
"""

from __future__ import annotations

from audiomask.models.attention import MASK_MODES, MaskMode
from audiomask.models.phi4mm import Phi4MMAudioConfig, Phi4MMEncoder
from audiomask.models.pretrained import from_pretrained
from audiomask.models.qwen3_asr import Qwen3ASRConfig, Qwen3ASREncoder
from audiomask.streaming.streams import Phi4MMStream, Qwen3ASRStream

__all__ = [
    "MASK_MODES",
    "MaskMode",
    "Phi4MMAudioConfig",
    "Phi4MMEncoder",
    "Phi4MMStream",
    "Qwen3ASRConfig",
    "Qwen3ASREncoder",
    "Qwen3ASRStream",
    "from_pretrained",
]
