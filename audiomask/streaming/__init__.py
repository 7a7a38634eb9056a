"""Cache-aware chunk-by-chunk encoding: one stream object per encoder family, many streams per batch."""

from __future__ import annotations

from audiomask.streaming.streams import Phi4MMStream, Qwen3ASRStream

__all__ = ["Phi4MMStream", "Qwen3ASRStream"]
