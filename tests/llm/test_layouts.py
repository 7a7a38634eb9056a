"""audiomask.llm.layouts: Qwen3-ASR's original checkpoint layout, converted, is transformers' own.

A tiny random ``Qwen3ASRForConditionalGeneration`` is the reference; the same tensors are written in the original
layout and converted back. qwen-asr 0.0.6's modeling code does not import under transformers 5.25
(``check_model_inputs()`` is called without the function it now takes), so the original checkpoint is not written
by qwen-asr's classes: its weight names are the inverse of the key map (:data:`TO_ORIGINAL`), whose module set is
checked against qwen-asr's module names (:data:`ORIGINAL_MODULES`), and its config.json is written in qwen-asr's
form (:func:`original_config`: ``thinker_config``, MRoPE ``rope_scaling``, fields transformers dropped).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from audiomask.llm.layouts import is_original_qwen3_asr, original_qwen3_asr_config, original_qwen3_asr_key

transformers = pytest.importorskip("transformers")

AUDIO = {
    "num_mel_bins": 128,
    "encoder_layers": 1,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "d_model": 16,
    "downsample_hidden_size": 4,
    "output_dim": 24,
    "n_window": 50,
    "n_window_infer": 100,  # attention windows of one chunk: 13 tokens
}
TEXT = {
    "vocab_size": 300,
    "hidden_size": 24,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 12,
    "max_position_embeddings": 512,
}
ROPE_THETA = 1e6
AUDIO_TOKEN_ID = 299
INITIALIZER_RANGE = 1.0
# transformers' name prefix -> the original's, written from qwen-asr's modules (its Qwen3ASRAudioEncoder holds
# ln_post, proj1, act, proj2; Qwen3ASRThinkerForConditionalGeneration holds audio_tower, model and lm_head).
TO_ORIGINAL = (
    ("model.multi_modal_projector.linear_1.", "thinker.audio_tower.proj1."),
    ("model.multi_modal_projector.linear_2.", "thinker.audio_tower.proj2."),
    ("model.audio_tower.", "thinker.audio_tower."),
    ("model.language_model.", "thinker.model."),
    ("lm_head.", "thinker.lm_head."),
)
# The modules of qwen-asr's state_dict (its modeling_qwen3_asr.py), two levels below "thinker".
ORIGINAL_MODULES = {
    *(f"thinker.audio_tower.{name}" for name in ("conv2d1", "conv2d2", "conv2d3", "conv_out", "layers", "ln_post")),
    "thinker.audio_tower.proj1",
    "thinker.audio_tower.proj2",
    "thinker.model.embed_tokens",
    "thinker.model.layers",
    "thinker.model.norm",
    "thinker.lm_head.weight",
}
FRAMES, PADDED = 230, 300  # mel frames of the utterance, and padded to whole chunks of 2 * n_window


def reference(tie: bool) -> torch.nn.Module:
    """The tiny transformers model, every parameter random (norms too: a weight sent to the wrong place shows)."""
    config = transformers.Qwen3ASRConfig(
        audio_config={**AUDIO, "initializer_range": INITIALIZER_RANGE},
        text_config={
            **TEXT,
            "model_type": "qwen3",
            "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
            "tie_word_embeddings": tie,
            "initializer_range": INITIALIZER_RANGE,
        },
        audio_token_id=AUDIO_TOKEN_ID,
        tie_word_embeddings=tie,
        initializer_range=INITIALIZER_RANGE,
    )
    model = transformers.Qwen3ASRForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * INITIALIZER_RANGE)
    return model


def original_config(tie: bool) -> dict:
    """config.json of the reference in qwen-asr's layout, with the fields qwen-asr writes and transformers has not."""
    return {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "model_type": "qwen3_asr",
        "support_languages": ["Chinese", "English"],
        "thinker_config": {
            "model_type": "qwen3_asr_thinker",
            "audio_token_id": AUDIO_TOKEN_ID,
            "audio_start_token_id": AUDIO_TOKEN_ID - 2,
            "audio_end_token_id": AUDIO_TOKEN_ID - 1,
            "initializer_range": INITIALIZER_RANGE,
            "audio_config": {
                **AUDIO,
                "model_type": "qwen3_asr_audio_encoder",
                "activation_function": "gelu",
                "dropout": 0,
                "scale_embedding": False,
                "initializer_range": INITIALIZER_RANGE,
                "max_source_positions": 1500,
                "conv_chunksize": 500,
            },
            "text_config": {
                **TEXT,
                "model_type": "qwen3_asr_text",
                "hidden_act": "silu",
                "rms_norm_eps": 1e-6,
                "initializer_range": INITIALIZER_RANGE,
                "tie_word_embeddings": tie,
                "rope_theta": ROPE_THETA,
                "rope_scaling": {
                    "interleaved": True,
                    "mrope_interleaved": True,
                    "mrope_section": [2, 2, 2],
                    "rope_type": "default",
                    "type": "default",
                },
            },
        },
    }


def original_name(name: str) -> str:
    """The original name of transformers' weight ``name`` (:data:`TO_ORIGINAL`)."""
    prefix, original = next((prefix, original) for prefix, original in TO_ORIGINAL if name.startswith(prefix))
    return original + name[len(prefix) :]


def original_weights(model: torch.nn.Module, tie: bool) -> dict[str, torch.Tensor]:
    """The reference's tensors under the original names; tied, without the head (a tied checkpoint may leave it out)."""
    weights = {original_name(name): tensor for name, tensor in model.state_dict().items()}
    if tie:
        del weights["thinker.lm_head.weight"]
    return weights


def converted(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {original_qwen3_asr_key(name): tensor for name, tensor in weights.items()}


def inputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Random features of :data:`FRAMES` frames and a prompt holding one audio token per encoder output."""
    generator = torch.Generator().manual_seed(1)
    features = torch.zeros(1, AUDIO["num_mel_bins"], PADDED)
    features[..., :FRAMES] = torch.randn(1, AUDIO["num_mel_bins"], FRAMES, generator=generator)
    mask = (torch.arange(PADDED) < FRAMES).long()[None]
    with torch.no_grad():
        tokens = model.get_audio_features(features, mask).pooler_output.shape[0]
    ids = torch.tensor([[1, 2, *[AUDIO_TOKEN_ID] * tokens, 3, 4, 5]])
    return {"input_ids": ids, "input_features": features, "input_features_mask": mask}


def test_the_original_layout_is_recognised() -> None:
    assert is_original_qwen3_asr(original_config(tie=False))
    assert not is_original_qwen3_asr(reference(tie=False).config.to_dict())
    assert not is_original_qwen3_asr({"model_type": "qwen3", "hidden_size": 24})


@pytest.mark.parametrize("tie", [False, True])
def test_the_converted_config_is_transformers(tie: bool) -> None:
    ours = transformers.Qwen3ASRConfig(**original_qwen3_asr_config(original_config(tie)))
    expected = reference(tie).config
    assert ours.to_dict() == expected.to_dict()
    assert ours.audio_config.max_position_embeddings == 13  # one chunk's positions: 100 frames -> 50 -> 25 -> 13
    assert ours.text_config.rope_parameters == {"rope_type": "default", "rope_theta": ROPE_THETA}


@pytest.mark.parametrize("tie", [False, True])
def test_the_converted_weights_are_transformers(tie: bool) -> None:
    model = reference(tie)
    weights = original_weights(model, tie)
    modules = {".".join(name.split(".")[:3]) for name in weights}
    assert modules == ORIGINAL_MODULES - ({"thinker.lm_head.weight"} if tie else set())
    ours, expected = converted(weights), model.state_dict()
    if tie:
        del expected["lm_head.weight"]  # transformers ties it to the embedding on loading
    assert ours.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(ours[name], tensor), name


@pytest.mark.parametrize("tie", [False, True])
def test_the_converted_checkpoint_loads_with_equal_logits(tie: bool, tmp_path: Path) -> None:
    model = reference(tie)
    (tmp_path / "config.json").write_text(json.dumps(original_qwen3_asr_config(original_config(tie))))
    save_file(converted(original_weights(model, tie)), tmp_path / "model.safetensors")
    loaded, info = transformers.Qwen3ASRForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert (loaded.lm_head.weight is loaded.model.language_model.embed_tokens.weight) == tie
    with torch.no_grad():
        batch = inputs(model)
        torch.testing.assert_close(loaded.eval()(**batch).logits, model(**batch).logits, rtol=0, atol=0)


@pytest.mark.parametrize(
    "path",
    [
        "thinker_config",
        "thinker_config.audio_config",
        "thinker_config.text_config",
        "thinker_config.audio_token_id",
        "thinker_config.audio_config.n_window",
        "thinker_config.audio_config.d_model",
        "thinker_config.text_config.rope_theta",
        "thinker_config.text_config.num_key_value_heads",
    ],
)
def test_a_missing_field_is_named(path: str) -> None:
    config = copy.deepcopy(original_config(tie=False))
    *sections, field = path.split(".")
    parent = config
    for section in sections:
        parent = parent[section]
    del parent[field]
    with pytest.raises(ValueError, match=path.replace(".", r"\.")):
        original_qwen3_asr_config(config)


def test_untied_unless_the_text_config_ties() -> None:
    config = original_config(tie=True)
    del config["thinker_config"]["text_config"]["tie_word_embeddings"]  # qwen-asr's default: untied
    ours = original_qwen3_asr_config(config)
    assert ours["tie_word_embeddings"] is ours["text_config"]["tie_word_embeddings"] is False


def test_a_forced_aligner_is_refused() -> None:
    config = original_config(tie=False)
    config["thinker_config"]["classify_num"] = 5000
    with pytest.raises(ValueError, match="classify_num"):
        original_qwen3_asr_config(config)


def test_names_outside_the_layout() -> None:
    assert original_qwen3_asr_key("talker.model.layers.0.mlp.up_proj.weight") is None
    assert original_qwen3_asr_key("code2wav.decoder.0.weight") is None
    with pytest.raises(ValueError, match="audio_tower.proj1.weight"):
        original_qwen3_asr_key("audio_tower.proj1.weight")
