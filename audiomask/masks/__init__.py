"""Attention masks and lengths for streaming speech encoders, in numpy only (never torch).

Polarity everywhere: ``True`` = the query row MAY attend to the key column
(Phi-4MM / WeNet convention); shapes ``(B, T_q, T_k)``; masks are C-contiguous
``bool``, lengths ``int64``. Every builder takes ``out=`` to write in place
(e.g. into a numpy view of a pinned staging slot).

- :mod:`audiomask.masks.chunk`: WeNet-style ``subsequent_chunk_mask`` and ``padding_mask``.
- :mod:`audiomask.masks.phi4mm`: Phi-4-multimodal streaming and hidden-state masks.
- :mod:`audiomask.masks.qwen3_asr`: Qwen3-ASR chunk/token lengths, ``cu_seqlens``, window mask.
- :mod:`audiomask.masks.band`: the block-band builders they are all made of, and the allocation bound.

No builder allocates a result above :func:`max_mask_bytes` (1 GiB by default,
:func:`set_max_mask_bytes` to change): larger requests raise ``ValueError``
naming the arguments, before any allocation.

>>> from audiomask.masks import phi4mm
>>> phi4mm.streaming_mask(4, 2, chunk_size=2, left_chunk=0).shape
(2, 4, 4)
"""

from __future__ import annotations

from audiomask.masks import chunk, phi4mm, qwen3_asr
from audiomask.masks.band import DEFAULT_MAX_MASK_BYTES, max_mask_bytes, set_max_mask_bytes
from audiomask.masks.chunk import padding_mask, subsequent_chunk_mask

__all__ = [
    "DEFAULT_MAX_MASK_BYTES",
    "chunk",
    "max_mask_bytes",
    "padding_mask",
    "phi4mm",
    "qwen3_asr",
    "set_max_mask_bytes",
    "subsequent_chunk_mask",
]
