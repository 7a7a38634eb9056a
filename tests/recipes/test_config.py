"""recipes.ctc_small.config: the training settings and the architecture they name."""

from __future__ import annotations

import dataclasses
import doctest

from audiomask.asr.checkpoint import model_info
from recipes.ctc_small import config
from recipes.ctc_small.config import MODEL_SIZES, TrainConfig


def test_doctests() -> None:
    assert doctest.testmod(config).failed == 0


def test_the_shipped_model_has_the_default_architecture() -> None:
    """The model inside the package was trained with the defaults' sizes and streaming settings."""
    shipped = model_info()
    defaults = TrainConfig()
    assert shipped["encoder_config"] == dataclasses.asdict(defaults.encoder_config())
    assert (shipped["chunk_ms"], shipped["left_chunks"]) == (defaults.default_chunk_ms, defaults.default_left_chunks)


def test_model_sizes_change_only_the_sizes() -> None:
    tiny = TrainConfig(**MODEL_SIZES["tiny"]).encoder_config()
    shipped = TrainConfig().encoder_config()
    assert tiny.hidden_size == MODEL_SIZES["tiny"]["hidden_size"] == tiny.ext_pw_out_channel
    assert tiny.num_attention_heads == MODEL_SIZES["tiny"]["num_heads"]
    assert (tiny.time_reduction, tiny.chunk_size, tiny.left_chunk) == (
        shipped.time_reduction,
        shipped.chunk_size,
        shipped.left_chunk,
    )
