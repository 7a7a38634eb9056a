"""Speech encoders that consume audiomask's masks and load transformers checkpoints.

- :class:`Phi4MMEncoder` (:mod:`audiomask.models.phi4mm`, its layers in
  :mod:`audiomask.models.conformer`): the Phi-4-multimodal audio Conformer;
  ``encoder(features (B, T, 80), lengths, *, chunk_size, left_chunk,
  mask_mode, mask) -> (outputs (B, L, D), output_lengths)``.
- :class:`Qwen3ASREncoder` (:mod:`audiomask.models.qwen3_asr`): the
  Qwen3-ASR audio encoder; ``encoder(features (B, 128, T), lengths) ->
  (outputs (B, N, D), output_lengths)``.
- :class:`Phi4MMAudioConfig`, :class:`Qwen3ASRConfig` (:mod:`audiomask.models.config`):
  their architectures.
- :func:`from_pretrained`: either encoder from a local transformers checkpoint.
- :class:`~audiomask.models.ctc.CTCHead`: encoder outputs to CTC log-probabilities.
- :mod:`audiomask.models.attention`: the mask-convention converters
  (``may_attend_to_additive_bias``, ``may_attend_to_compat_bias``).

Lengths may be on the host (the masks are built there) or already on the
encoder's device (then nothing is read back). Chunk-by-chunk encoding with
caches is :mod:`audiomask.streaming`'s. Parameter names and shapes equal
transformers' ``Phi4MultimodalAudioModel`` and ``Qwen3ASREncoder``: their
``state_dict`` loads with ``load_state_dict``.
"""

from __future__ import annotations

from audiomask.models.attention import MASK_MODES, MaskMode
from audiomask.models.config import Phi4MMAudioConfig, Qwen3ASRConfig
from audiomask.models.phi4mm import Phi4MMEncoder
from audiomask.models.pretrained import from_pretrained
from audiomask.models.qwen3_asr import Qwen3ASREncoder

__all__ = [
    "MASK_MODES",
    "MaskMode",
    "Phi4MMAudioConfig",
    "Phi4MMEncoder",
    "Qwen3ASRConfig",
    "Qwen3ASREncoder",
    "from_pretrained",
]
