"""Load an LLM recogniser from a local checkpoint directory (no network): :func:`load`, :func:`describe`.

Supported: transformers' ``Qwen3ASRForConditionalGeneration`` (``model_type``
``qwen3_asr``) and the original Qwen3-ASR layout that ``qwen-asr`` and vLLM
load (``thinker_config``; converted on reading,
:mod:`audiomask.llm.layouts`). The directory holds ``config.json``, the
weights (``model.safetensors`` or shards with their index) and the
tokenizer with its chat template. What is missing, or a weight whose shape
the config does not give, is one ``ValueError`` naming it, raised before any
weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from audiomask.llm.layouts import is_original_qwen3_asr, original_qwen3_asr_config, original_qwen3_asr_key
from audiomask.llm.lm import CausalLM, LMConfig
from audiomask.llm.model import AudioLM
from audiomask.llm.qwen3_asr import Qwen3ASRProjector, qwen3_asr_prompt, qwen3_asr_text
from audiomask.models.config import Qwen3ASRConfig
from audiomask.models.pretrained import shape_mismatch
from audiomask.models.qwen3_asr import Qwen3ASREncoder
from audiomask.streaming import default_frontend

__all__ = ["describe", "is_llm_checkpoint", "load"]

_SINGLE_FILE = "model.safetensors"
_SHARD_INDEX = "model.safetensors.index.json"
# transformers' names of each part's weights in a Qwen3ASRForConditionalGeneration
_QWEN3_ASR_PARTS = {
    "encoder": "model.audio_tower.",
    "projector": "model.multi_modal_projector.",
    "lm": "model.language_model.",
}


def _config(directory: Path) -> dict[str, Any]:
    """config.json in transformers' layout (an original Qwen3-ASR config converted)."""
    file = directory / "config.json"
    if not file.is_file():
        raise ValueError(f"model {str(directory)!r} must be a checkpoint directory with a config.json")
    values = json.loads(file.read_text())
    return original_qwen3_asr_config(values) if is_original_qwen3_asr(values) else values


def is_llm_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory whose config.json names a supported LLM recogniser."""
    directory = Path(path)
    if not (directory / "config.json").is_file():
        return False
    try:
        values = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return is_original_qwen3_asr(values) or values.get("model_type") == "qwen3_asr"


def _weight_names(directory: Path, original: bool) -> dict[str, tuple[Path, str]]:
    """transformers' name -> (file, the name stored in it), for every weight of the directory."""
    from safetensors import safe_open

    index = directory / _SHARD_INDEX
    if index.is_file():
        stored = {name: directory / shard for name, shard in json.loads(index.read_text())["weight_map"].items()}
    elif (directory / _SINGLE_FILE).is_file():
        with safe_open(str(directory / _SINGLE_FILE), framework="pt") as reader:
            stored = dict.fromkeys(reader.keys(), directory / _SINGLE_FILE)
    else:
        raise ValueError(f"model {str(directory)!r} lacks its weights: neither {_SINGLE_FILE} nor {_SHARD_INDEX}")
    names = {}
    for name, file in stored.items():
        target = original_qwen3_asr_key(name) if original else name
        if target is not None:
            names[target] = (file, name)
    return names


def _read(names: dict[str, tuple[Path, str]], prefix: str, *, shapes: bool) -> dict[str, Any]:
    """The tensors (or their shapes) named ``prefix...``, by their names less ``prefix``."""
    from safetensors import safe_open

    found: dict[str, Any] = {}
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for name, (file, stored) in names.items():
        if name.startswith(prefix):
            by_file.setdefault(file, []).append((name[len(prefix) :], stored))
    for file, pairs in by_file.items():
        with safe_open(str(file), framework="pt") as reader:
            for name, stored in pairs:
                found[name] = tuple(reader.get_slice(stored).get_shape()) if shapes else reader.get_tensor(stored)
    return found


def _tokenizer(directory: Path) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise ImportError("LLM recognisers need transformers: pip install 'audiomask[llm]'") from error
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"model {str(directory)!r} lacks a tokenizer transformers can read: {error}") from None
    if tokenizer.chat_template is None:
        raise ValueError(
            f"model {str(directory)!r} lacks its chat template (chat_template.jinja or in tokenizer_config.json)"
        )
    return tokenizer


def _stop_ids(directory: Path, config: dict[str, Any]) -> frozenset[int]:
    """The end tokens: generation_config.json's ``eos_token_id``, else config.json's."""
    generation = directory / "generation_config.json"
    values = json.loads(generation.read_text()) if generation.is_file() else {}
    ids = values.get("eos_token_id", config.get("eos_token_id"))
    if ids is None:
        raise ValueError(f"model {str(directory)!r} names no eos_token_id (generation_config.json or config.json)")
    return frozenset([ids] if isinstance(ids, int) else ids)


def _fill(
    module: torch.nn.Module, state: dict[str, torch.Tensor], what: str, directory: Path, optional: tuple[str, ...] = ()
) -> None:
    """Load ``state`` into ``module`` after checking every name and shape; ``optional``: names that may be absent."""
    expected = {
        name: tuple(tensor.shape)
        for name, tensor in module.state_dict().items()
        if name in state or name not in optional
    }
    mismatch = shape_mismatch(expected, {name: tuple(tensor.shape) for name, tensor in state.items()})
    if mismatch:
        raise ValueError(f"model {str(directory)!r}: the {what} weights do not fit the config: {mismatch}")
    module.load_state_dict(state, strict=False)


def load(path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> AudioLM:
    """The LLM recogniser of the checkpoint directory ``path``, on ``device`` in ``dtype``, in eval mode.

    Raises ``ValueError`` naming the directory and what it lacks (config, weights, tokenizer, chat
    template, a weight the config does not give) or the architecture it is when not a supported one.
    """
    directory = Path(path)
    values = _config(directory)
    if values.get("model_type") != "qwen3_asr":
        raise ValueError(
            f"model {str(directory)!r}: model_type must be 'qwen3_asr' (transformers' Qwen3-ASR) or an original "
            f"Qwen3-ASR config (thinker_config), got {values.get('model_type')!r}"
        )
    from transformers import AutoConfig

    text = AutoConfig.for_model(**values.get("text_config", {}))
    tokenizer = _tokenizer(directory)
    names = _weight_names(directory, is_original_qwen3_asr(json.loads((directory / "config.json").read_text())))
    audio = values.get("audio_config") or {}
    encoder = Qwen3ASREncoder(Qwen3ASRConfig.from_dict(audio))
    projector = Qwen3ASRProjector(encoder.output_size, audio.get("output_dim", text.hidden_size))
    lm = CausalLM(LMConfig.from_transformers(text, qk_norm=True))
    lm_state = _read(names, _QWEN3_ASR_PARTS["lm"], shapes=False)
    if "lm_head.weight" in names:
        lm_state["lm_head.weight"] = _read(names, "lm_head.", shapes=False)["weight"]
    _fill(encoder, _read(names, _QWEN3_ASR_PARTS["encoder"], shapes=False), "encoder", directory)
    _fill(projector, _read(names, _QWEN3_ASR_PARTS["projector"], shapes=False), "projector", directory)
    tied = ("lm_head.weight",) if lm.config.tie_word_embeddings else ()
    _fill(lm, lm_state, "language model", directory, tied)
    for module in (encoder, projector, lm):
        module.to(device=device, dtype=dtype).eval()
    return AudioLM(
        family="qwen3_asr",
        encoder=encoder,
        projector=projector,
        lm=lm,
        tokenizer=tokenizer,
        frontend=default_frontend(encoder),
        prompt=lambda context, language: qwen3_asr_prompt(tokenizer, context, language),
        parse=qwen3_asr_text,
        stop_ids=_stop_ids(directory, values),
        path=str(directory),
    )


def describe(path: str | Path) -> dict[str, Any]:
    """What the checkpoint ``path`` is, from its files (no weight read): family, layout, sizes, tokens."""
    directory = Path(path)
    original = json.loads((directory / "config.json").read_text()) if (directory / "config.json").is_file() else {}
    values = _config(directory)
    audio, text = values.get("audio_config") or {}, values.get("text_config") or {}
    names = _weight_names(directory, is_original_qwen3_asr(original))
    shapes = {name: shape for prefix in ("",) for name, shape in _read(names, prefix, shapes=True).items()}
    parameters = sum(int(torch.Size(shape).numel()) for shape in shapes.values())
    return {
        "family": "qwen3_asr",
        "layout": "original (qwen-asr)" if is_original_qwen3_asr(original) else "transformers",
        "parameters": parameters,
        "encoder_layers": audio.get("encoder_layers"),
        "d_model": audio.get("d_model"),
        "lm_layers": text.get("num_hidden_layers"),
        "hidden_size": text.get("hidden_size"),
        "vocab_size": text.get("vocab_size"),
        "audio_token_id": values.get("audio_token_id"),
    }
