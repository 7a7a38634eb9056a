"""A peft LoRA adapter merged into a model's weights on loading: :func:`merge_lora` (peft is not needed to run).

The adapter directory is what peft's ``save_pretrained`` writes:
``adapter_config.json`` (``peft_type`` "LORA", ``r``, ``lora_alpha``,
``target_modules``, ``use_rslora``...) and ``adapter_model.safetensors``,
whose tensors are named ``base_model.model.<module>.lora_A.weight`` ``(r, in)``
and ``base_model.model.<module>.lora_B.weight`` ``(out, r)`` for each adapted
linear layer ``<module>`` of the base model. Merging is what peft's
``merge_and_unload`` does to a linear layer: ``W += scaling * B @ A`` with
``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``),
computed in float32 and stored back in ``W``'s dtype.

Adapters this does not merge exactly are refused with a ``ValueError`` naming
the directory and the field: DoRA, per-module ranks or alphas
(``rank_pattern``, ``alpha_pattern``), ``fan_in_fan_out``, trained biases,
and tensors other than the LoRA pairs (``modules_to_save``, embeddings).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "merge_lora"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."  # peft's names: the wrapper's, then the base model's own names
_DOWN, _UP = ".lora_A.weight", ".lora_B.weight"  # A: (r, in), B: (out, r)
# Fields of adapter_config.json whose values other than these change the merge; refused when they differ.
_UNSUPPORTED = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "bias": "none",
    "lora_bias": False,
    "rank_pattern": {},
    "alpha_pattern": {},
    "modules_to_save": None,
}


def _config(directory: Path) -> tuple[int, float]:
    """``(r, scaling)`` of the adapter's config, checked."""
    file = directory / ADAPTER_CONFIG
    if not file.is_file():
        raise ValueError(f"LoRA adapter {str(directory)!r} lacks {ADAPTER_CONFIG}")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"LoRA adapter {str(directory)!r}: {ADAPTER_CONFIG} is not readable JSON: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"LoRA adapter {str(directory)!r}: {ADAPTER_CONFIG} must hold an object")
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA adapter {str(directory)!r}: peft_type must be 'LORA', got {config['peft_type']!r}")
    for name in ("r", "lora_alpha", "target_modules"):
        if name not in config:
            raise ValueError(f"LoRA adapter {str(directory)!r}: {ADAPTER_CONFIG} lacks {name!r}")
    r, alpha = config["r"], config["lora_alpha"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"LoRA adapter {str(directory)!r}: r must be a positive integer, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"LoRA adapter {str(directory)!r}: lora_alpha must be a finite number, got {alpha!r}")
    for name, plain in _UNSUPPORTED.items():
        value = config.get(name, plain)
        if value != plain and not (plain is None and not value):
            raise ValueError(
                f"LoRA adapter {str(directory)!r}: {name} = {value!r} is not supported (merged only as {plain!r})"
            )
    scaling = alpha / math.sqrt(r) if config.get("use_rslora", False) else alpha / r
    return r, scaling


def _pairs(directory: Path, r: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The adapter's ``(A, B)`` per adapted module (the base model's name of the module), checked."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = directory / ADAPTER_WEIGHTS
    if not file.is_file():
        raise ValueError(f"LoRA adapter {str(directory)!r} lacks {ADAPTER_WEIGHTS}")
    try:
        tensors = load_file(str(file))
    except (OSError, SafetensorError) as error:
        raise ValueError(f"LoRA adapter {str(directory)!r}: {ADAPTER_WEIGHTS} is not readable: {error}") from None
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        suffix = _DOWN if name.endswith(_DOWN) else _UP if name.endswith(_UP) else None
        if suffix is None or not name.startswith(_PEFT_PREFIX):
            raise ValueError(
                f"LoRA adapter {str(directory)!r}: {name!r} is not a LoRA weight "
                f"({_PEFT_PREFIX}<module>{_DOWN} or {_UP})"
            )
        halves.setdefault(name[len(_PEFT_PREFIX) : -len(suffix)], {})[suffix] = tensor
    if not halves:
        raise ValueError(f"LoRA adapter {str(directory)!r}: {ADAPTER_WEIGHTS} holds no LoRA weights")
    pairs = {}
    for module, found in sorted(halves.items()):
        if len(found) != 2:
            lacking = _UP if _DOWN in found else _DOWN
            raise ValueError(f"LoRA adapter {str(directory)!r} lacks {_PEFT_PREFIX}{module}{lacking}")
        down, up = found[_DOWN], found[_UP]
        if down.ndim != 2 or up.ndim != 2 or down.shape[0] != r or up.shape[1] != r:
            raise ValueError(
                f"LoRA adapter {str(directory)!r}: {module}'s lora_A {tuple(down.shape)} and lora_B "
                f"{tuple(up.shape)} must be (r, in) and (out, r) with r = {r}"
            )
        pairs[module] = (down, up)
    return pairs


def merge_lora(state: dict[str, torch.Tensor], adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """``state`` with the LoRA adapter of ``adapter_dir`` merged into its weights (a new dict; ``state`` is kept).

    ``state``: the base model's tensors by its own names (``model.layers.0.self_attn.qkv_proj.weight``...),
    holding at least every weight the adapter adapts. A malformed adapter, or one that adapts a weight
    ``state`` lacks or of another shape, is a ``ValueError`` naming the directory and the tensor.
    """
    directory = Path(adapter_dir)
    r, scaling = _config(directory)
    merged = dict(state)
    for module, (down, up) in _pairs(directory, r).items():
        name = f"{module}.weight"
        if name not in state:
            raise ValueError(f"LoRA adapter {str(directory)!r} adapts {name!r}, which the model's weights lack")
        weight = state[name]
        if tuple(weight.shape) != (up.shape[0], down.shape[1]):
            raise ValueError(
                f"LoRA adapter {str(directory)!r}: {module}'s update is {(up.shape[0], down.shape[1])}, the weight "
                f"{name!r} is {tuple(weight.shape)}"
            )
        delta = (up.float() @ down.float()) * scaling
        merged[name] = (weight.float() + delta).to(weight.dtype)
    return merged
