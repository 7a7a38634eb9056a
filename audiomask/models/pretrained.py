"""Load an audio encoder from a local transformers-format checkpoint directory (no network)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

from audiomask.models.config import MAX_ENCODER_BLOCKS, MAX_ENCODER_PARAMETERS, Phi4MMAudioConfig, Qwen3ASRConfig
from audiomask.models.phi4mm import Phi4MMEncoder
from audiomask.models.qwen3_asr import Qwen3ASREncoder

__all__ = ["encoder_shapes", "from_pretrained", "shape_mismatch"]

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
T = TypeVar("T")
_SHARD_INDEX = "model.safetensors.index.json"


# torch.nn.init's initialisers (normal_, kaiming_uniform_, ...): values a meta tensor does not have.
_INITIALISERS = frozenset(
    getattr(torch.nn.init, name) for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")
)


class _WithoutInitialisers(TorchFunctionMode):
    """Inside, ``torch.nn.init``'s initialisers leave their tensor as it is (meant for modules built on the meta
    device: torch's meta ``normal_`` imports ``torch._dynamo``, 1.3 s and a cache folder in ``TMPDIR``)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _INITIALISERS:
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


def encoder_shapes(config: Phi4MMAudioConfig | Qwen3ASRConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each tensor in the state dict of the encoder ``config`` describes; nothing is allocated.

    The encoder is built on the meta device, once its depth is at most
    :data:`~audiomask.models.config.MAX_ENCODER_BLOCKS`; its parameters and
    buffers (those outside the state dict too) must then number at most
    :data:`~audiomask.models.config.MAX_ENCODER_PARAMETERS`. Either bound
    exceeded is a ``ValueError`` naming the fields: what a file asks for is
    checked before it is built.
    """
    depth = getattr(config, config.DEPTH_FIELD)
    if depth > MAX_ENCODER_BLOCKS:
        raise ValueError(f"{config.DEPTH_FIELD} {depth} exceeds MAX_ENCODER_BLOCKS = {MAX_ENCODER_BLOCKS}")
    with torch.device("meta"), _WithoutInitialisers():
        encoder = (Phi4MMEncoder if isinstance(config, Phi4MMAudioConfig) else Qwen3ASREncoder)(config)
    count = sum(tensor.numel() for tensors in (encoder.parameters(), encoder.buffers()) for tensor in tensors)
    if count > MAX_ENCODER_PARAMETERS:
        defaults = {field.name: field.default for field in dataclasses.fields(config)}
        grown = [
            f"{name} {getattr(config, name)}" for name in config.SIZE_FIELDS if getattr(config, name) > defaults[name]
        ]
        fields = f"{', '.join(grown)} (beyond the released model's) make" if grown else "the config makes"
        raise ValueError(
            f"{fields} an encoder of {count:,} parameters, which exceeds MAX_ENCODER_PARAMETERS = "
            f"{MAX_ENCODER_PARAMETERS:,}"
        )
    return {name: tuple(tensor.shape) for name, tensor in encoder.state_dict().items()}


def shape_mismatch(expected: Mapping[str, Sequence[int]], stored: Mapping[str, Sequence[int]]) -> str | None:
    """One line saying how the ``stored`` tensors' names and shapes differ from ``expected``; ``None`` if not.

    >>> shape_mismatch({"a": (2, 3), "b": (4,), "d": (1,)}, {"a": (3, 2), "c": (1,)})
    'a is (3, 2) in the file, (2, 3) by the config; b and 1 more are missing; c is not in the config'
    """
    differ = sorted(name for name in expected.keys() & stored.keys() if tuple(stored[name]) != tuple(expected[name]))
    missing, extra = sorted(expected.keys() - stored.keys()), sorted(stored.keys() - expected.keys())
    parts = []
    if differ:
        more = {1: "", 2: " (and 1 more tensor)"}.get(len(differ), f" (and {len(differ) - 1} more tensors)")
        name = differ[0]
        parts.append(f"{name} is {tuple(stored[name])} in the file, {tuple(expected[name])} by the config{more}")
    for names, what in ((missing, "missing"), (extra, "not in the config")):
        if names:
            parts.append(
                f"{names[0]} and {len(names) - 1} more are {what}" if len(names) > 1 else f"{names[0]} is {what}"
            )
    return "; ".join(parts) or None


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


def _read_encoder(shards: list[Path], prefix: str, read: Callable[[Any, str], T]) -> dict[str, T]:
    """``read(reader, name)`` of each tensor named ``prefix...`` in the safetensors ``shards``, by its name less ``prefix``."""
    from safetensors import safe_open

    found = {}
    for file in shards:
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (a safetensors reader, not a dict)
                if name.startswith(prefix):
                    found[name[len(prefix) :]] = read(reader, name)
    return found


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
    these, for a config beyond the bounds of :func:`encoder_shapes`, and for
    weights that do not fit the config (told from their shapes, before any
    weight is read).
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
    try:
        expected = encoder_shapes(config)
    except ValueError as error:
        raise ValueError(f"path {str(path)!r}: {error}") from None
    files = _weight_files(directory)
    prefix = _encoder_prefix(list(files), anchor, directory)
    shards = sorted({files[name] for name in files if name.startswith(prefix)})
    # The shapes first: a config that disagrees with them reads no weights.
    mismatch = shape_mismatch(
        expected, _read_encoder(shards, prefix, lambda reader, name: reader.get_slice(name).get_shape())
    )
    if mismatch:
        raise ValueError(f"path {str(path)!r}: the weights do not fit the config: {mismatch}")
    state = _read_encoder(shards, prefix, lambda reader, name: reader.get_tensor(name))
    encoder = encoder_class(config)
    encoder.load_state_dict(state)
    return encoder.to(dtype).eval()
