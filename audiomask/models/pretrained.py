"""Load an audio encoder from a local transformers-format checkpoint directory (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from audiomask.models.config import Phi4MMAudioConfig, Qwen3ASRConfig
from audiomask.models.phi4mm import Phi4MMEncoder
from audiomask.models.qwen3_asr import Qwen3ASREncoder

__all__ = ["from_pretrained"]

_PHI4MM_ANCHOR = "relative_attention_bias_layer.bias_values.weight"
_QWEN3_ASR_ANCHOR = "conv2d1.weight"
# model_type of config.json -> (config class, encoder class, key of the nested audio config or None,
# a parameter name that ends each encoder's weights: what precedes it is the encoder's prefix).
_KINDS = {
    "phi4_multimodal_audio": (Phi4MMAudioConfig, Phi4MMEncoder, None, _PHI4MM_ANCHOR),
    "phi4_multimodal": (Phi4MMAudioConfig, Phi4MMEncoder, "audio_config", _PHI4MM_ANCHOR),
    "qwen3_asr_encoder": (Qwen3ASRConfig, Qwen3ASREncoder, None, _QWEN3_ASR_ANCHOR),
    "qwen3_asr": (Qwen3ASRConfig, Qwen3ASREncoder, "audio_config", _QWEN3_ASR_ANCHOR),
}
_SINGLE_FILE = "model.safetensors"
_SHARD_INDEX = "model.safetensors.index.json"


def _weight_files(directory: Path) -> dict[str, Path]:
    """Parameter name -> the safetensors file that holds it."""
    index = directory / _SHARD_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / shard for name, shard in weight_map.items()}
    single = directory / _SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as file:
            return dict.fromkeys(file.keys(), single)
    raise ValueError(f"path {str(directory)!r} holds neither {_SINGLE_FILE} nor {_SHARD_INDEX}")


def _encoder_prefix(names: list[str], anchor: str, directory: Path) -> str:
    prefixes = sorted({name[: -len(anchor)] for name in names if name.endswith(anchor)})
    if len(prefixes) != 1:
        raise ValueError(
            f"path {str(directory)!r}: expected the weights of one audio encoder (one parameter ending in "
            f"{anchor!r}), found {len(prefixes)}: {prefixes[:4]}"
        )
    return prefixes[0]


def from_pretrained(path: str | Path, *, dtype: torch.dtype = torch.float32) -> Phi4MMEncoder | Qwen3ASREncoder:
    """The audio encoder of a local transformers checkpoint, on the CPU in ``dtype``, in eval mode.

    ``path`` is a directory with ``config.json`` and ``model.safetensors``
    (or sharded safetensors with ``model.safetensors.index.json``) saved by
    ``save_pretrained`` of ``Phi4MultimodalAudioModel`` or ``Qwen3ASREncoder``,
    or of a whole Phi-4-multimodal or Qwen3-ASR model (the audio config
    nested under ``audio_config``, the encoder's weights under a prefix such
    as ``model.embed_tokens_extend.audio_embed.encoder.`` or
    ``model.audio_tower.``). Only the encoder's tensors are read. Move the
    result with ``encoder.to(device)``.

    Raises ``ValueError`` naming the path for a directory that is not one of
    these, and for weights that do not fit the config.
    """
    directory = Path(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ValueError(f"path must be a checkpoint directory with a config.json, got {str(path)!r}")
    values = json.loads(config_file.read_text())
    model_type = values.get("model_type")
    if model_type not in _KINDS:
        raise ValueError(
            f"path {str(path)!r}: model_type must be one of {sorted(_KINDS)} (a Phi-4-multimodal or Qwen3-ASR "
            f"checkpoint in transformers format), got {model_type!r}"
        )
    config_class, encoder_class, nested, anchor = _KINDS[model_type]
    config = config_class.from_dict((values.get(nested) or {}) if nested else values)
    files = _weight_files(directory)
    prefix = _encoder_prefix(list(files), anchor, directory)

    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for file in sorted({files[name] for name in files if name.startswith(prefix)}):
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (a safetensors reader, not a dict)
                if name.startswith(prefix):
                    state[name[len(prefix) :]] = reader.get_tensor(name)
    encoder = encoder_class(config)
    try:
        encoder.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"path {str(path)!r}: the weights do not fit the config: {error}") from None
    return encoder.to(dtype).eval()
