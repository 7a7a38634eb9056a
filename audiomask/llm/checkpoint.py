"""Load an LLM recogniser from a local checkpoint directory (no network): :func:`load`, :func:`describe`.

Supported (``model_type`` of config.json -> family):

- ``qwen3_asr``: transformers' ``Qwen3ASRForConditionalGeneration``, and the
  original Qwen3-ASR layout that ``qwen-asr`` and vLLM load (``thinker_config``;
  converted on reading) -> :mod:`audiomask.llm.qwen3_asr`.
- ``phi4_multimodal``: transformers' ``Phi4MultimodalForCausalLM``, its
  ``speech-lora/`` adapter merged on reading -> :mod:`audiomask.llm.phi4mm`.

The directory holds ``config.json``, the weights and the tokenizer with its
chat template (:class:`~audiomask.llm.files.CheckpointFiles`). What is
missing, or a weight the config does not give, is one ``ValueError`` naming
it, raised before any weight is loaded into a model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from audiomask.llm import phi4mm, qwen3_asr
from audiomask.llm.files import CheckpointFiles
from audiomask.llm.model import AudioLM

__all__ = ["FAMILIES", "describe", "is_llm_checkpoint", "load"]

# model_type -> the family's builder: (files, device, dtype) -> AudioLM
FAMILIES: dict[str, Callable[[CheckpointFiles, torch.device | str, torch.dtype], AudioLM]] = {
    "qwen3_asr": qwen3_asr.build,
    "phi4_multimodal": phi4mm.build,
}


def is_llm_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory whose config.json names a supported LLM recogniser."""
    try:
        return CheckpointFiles(path).model_type in FAMILIES
    except ValueError:
        return False


def _files(path: str | Path) -> CheckpointFiles:
    files = CheckpointFiles(path)
    if files.model_type not in FAMILIES:
        raise ValueError(
            f"model {str(path)!r}: model_type must be one of {sorted(FAMILIES)} (an LLM recogniser), got "
            f"{files.model_type!r}"
        )
    return files


def load(path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> AudioLM:
    """The LLM recogniser of the checkpoint directory ``path``, on ``device`` in ``dtype``, in eval mode.

    Raises ``ValueError`` naming the directory and what it lacks (config, weights, tokenizer, chat
    template, a weight the config does not give) or the architecture it is when not a supported one.
    """
    files = _files(path)
    return FAMILIES[str(files.model_type)](files, device, dtype)


def describe(path: str | Path) -> dict[str, Any]:
    """What the checkpoint ``path`` is, from its files (no weight read): family, layout, sizes, token ids."""
    files = _files(path)
    audio, text = files.config.get("audio_config") or {}, files.config.get("text_config") or files.config
    shapes = files.read("", shapes=True)
    return {
        "family": files.model_type,
        "layout": "original (qwen-asr)" if files.original else "transformers",
        "parameters": sum(int(torch.Size(shape).numel()) for shape in shapes.values()),
        "encoder_layers": audio.get("encoder_layers", audio.get("num_blocks")),
        "lm_layers": text.get("num_hidden_layers"),
        "hidden_size": text.get("hidden_size"),
        "vocab_size": text.get("vocab_size"),
        # Qwen3-ASR names it at the top, Phi-4-multimodal in its audio config
        "audio_token_id": files.config.get("audio_token_id", audio.get("audio_token_id")),
    }
