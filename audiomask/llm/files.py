"""A local checkpoint directory's files, read without the network: :class:`CheckpointFiles`.

Its ``config.json`` (in transformers' layout; an original Qwen3-ASR config is
converted, :mod:`audiomask.llm.layouts`), its weights (``model.safetensors``
or shards with their index) by transformers' names, its tokenizer and chat
template, and its end tokens. What is missing is one ``ValueError`` naming
the directory and the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from audiomask.llm.layouts import is_original_qwen3_asr, original_qwen3_asr_config, original_qwen3_asr_key
from audiomask.models.pretrained import shape_mismatch

__all__ = ["CheckpointFiles", "fill"]

_SINGLE_FILE = "model.safetensors"
_SHARD_INDEX = "model.safetensors.index.json"


class CheckpointFiles:
    """The files of the checkpoint directory ``path``; config.json is read at once, the rest when asked."""

    def __init__(self, path: str | Path) -> None:
        self.directory = Path(path)
        file = self.directory / "config.json"
        if not file.is_file():
            raise ValueError(f"model {str(path)!r} must be a checkpoint directory with a config.json")
        try:
            stored = json.loads(file.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"model {str(path)!r}: config.json is not readable JSON: {error}") from None
        if not isinstance(stored, dict):
            raise ValueError(f"model {str(path)!r}: config.json must hold an object, got {type(stored).__name__}")
        self.original = is_original_qwen3_asr(stored)
        self.config: dict[str, Any] = original_qwen3_asr_config(stored) if self.original else stored
        self._names: dict[str, tuple[Path, str]] | None = None

    @property
    def model_type(self) -> object:
        return self.config.get("model_type")

    @property
    def names(self) -> dict[str, tuple[Path, str]]:
        """transformers' name -> (file, the name stored in it), for every weight of the directory."""
        if self._names is None:
            self._names = self._weight_names()
        return self._names

    def _weight_names(self) -> dict[str, tuple[Path, str]]:
        from safetensors import safe_open

        directory = self.directory
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
            target = original_qwen3_asr_key(name) if self.original else name
            if target is not None:
                names[target] = (file, name)
        return names

    def read(self, prefix: str, *, shapes: bool = False) -> dict[str, Any]:
        """The tensors (their shapes with ``shapes``) named ``prefix...``, by their names less ``prefix``."""
        from safetensors import safe_open

        found: dict[str, Any] = {}
        by_file: dict[Path, list[tuple[str, str]]] = {}
        for name, (file, stored) in self.names.items():
            if name.startswith(prefix):
                by_file.setdefault(file, []).append((name[len(prefix) :], stored))
        for file, pairs in by_file.items():
            with safe_open(str(file), framework="pt") as reader:
                for name, stored in pairs:
                    found[name] = tuple(reader.get_slice(stored).get_shape()) if shapes else reader.get_tensor(stored)
        return found

    def tokenizer(self) -> Any:
        """The directory's tokenizer (transformers' ``AutoTokenizer``), with its chat template."""
        try:
            from transformers import AutoTokenizer
        except ImportError as error:
            raise ImportError("LLM recognisers need transformers: pip install 'audiomask[llm]'") from error
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(self.directory), local_files_only=True)
        except (OSError, ValueError, TypeError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(
                f"model {str(self.directory)!r} lacks a tokenizer transformers can read (tokenizer.json, or "
                f"vocab.json and merges.txt, with tokenizer_config.json): {first}"
            ) from None
        if tokenizer.chat_template is None:
            raise ValueError(
                f"model {str(self.directory)!r} lacks its chat template (chat_template.jinja or tokenizer_config.json)"
            )
        return tokenizer

    def stop_ids(self) -> frozenset[int]:
        """The end tokens: generation_config.json's ``eos_token_id``, else config.json's."""
        generation = self.directory / "generation_config.json"
        values = json.loads(generation.read_text()) if generation.is_file() else {}
        ids = values.get("eos_token_id", self.config.get("eos_token_id"))
        if ids is None:
            raise ValueError(
                f"model {str(self.directory)!r} names no eos_token_id (generation_config.json or config.json)"
            )
        return frozenset([ids] if isinstance(ids, int) else ids)


def fill(
    module: torch.nn.Module,
    state: dict[str, torch.Tensor],
    what: str,
    files: CheckpointFiles,
    optional: tuple[str, ...] = (),
    stored_name: Callable[[str], str] = str,
) -> None:
    """Load ``state`` into ``module`` after checking every name and shape; ``optional``: names that may be absent.

    A missing, extra or misshapen weight is a ``ValueError`` naming the directory, ``what`` and the weight
    (as the checkpoint names it: ``stored_name`` of its name in ``state``).
    """
    expected = {
        name: tuple(tensor.shape)
        for name, tensor in module.state_dict().items()
        if name in state or name not in optional
    }
    mismatch = shape_mismatch(
        {stored_name(name): shape for name, shape in expected.items()},
        {stored_name(name): tuple(tensor.shape) for name, tensor in state.items()},
    )
    if mismatch:
        raise ValueError(f"model {str(files.directory)!r}: the {what} weights do not fit the config: {mismatch}")
    module.load_state_dict(state, strict=False)
