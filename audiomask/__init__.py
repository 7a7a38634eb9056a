"""audiomask: streaming masks and stall-free host-to-device transfer for speech encoders.

Importing :mod:`audiomask` or :mod:`audiomask.masks` does not import torch;
the torch-based stages (audio, features, transfer, models, streaming, asr) load on first
use of one of their names here.
"""

from __future__ import annotations

import importlib
from typing import Any

from audiomask.errors import AudioError

__version__ = "0.1.0"

# Public names that live in torch-based modules, loaded on first attribute access.
_LAZY = {
    "to_device": "audiomask.transfer",
    "PinnedRing": "audiomask.transfer",
    "sync_check": "audiomask.transfer",
    "is_dense": "audiomask.transfer",
    "load": "audiomask.audio",
    "iter_blocks": "audiomask.audio",
    "Phi4MMFrontend": "audiomask.features",
    "WhisperFrontend": "audiomask.features",
    "Phi4MMEncoder": "audiomask.models",
    "Qwen3ASREncoder": "audiomask.models",
    "from_pretrained": "audiomask.models",
    "open_slots": "audiomask.streaming",
    "ASRModel": "audiomask.asr.model",
    "StreamingRecognizer": "audiomask.asr.recognizer",
}

__all__ = ["AudioError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'audiomask' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
