"""Qwen3-ASR's original checkpoint layout, read as transformers' own.

One network, two layouts:

- *original*: what Qwen published (``Qwen/Qwen3-ASR-0.6B``, ``-1.7B``) and what the ``qwen-asr`` package and
  vLLM load. ``config.json`` (``model_type`` ``qwen3_asr``) nests the model in ``thinker_config``: its
  ``audio_config``, ``text_config`` (Qwen3 with MRoPE), ``audio_token_id``. Weights: ``thinker.audio_tower.*``
  (the encoder, ending ``ln_post``, ``proj1``, the encoder's activation, ``proj2``), ``thinker.model.*`` (the
  Qwen3 decoder) and ``thinker.lm_head.weight`` (a tied checkpoint may leave it out).
- *transformers* (``Qwen3ASRForConditionalGeneration``, transformers 5): a flat ``Qwen3ASRConfig``, its
  ``audio_config`` a ``qwen3_asr_encoder`` and its ``text_config`` a plain ``qwen3`` one. Weights:
  ``model.audio_tower.*`` (ending ``ln_post``), ``model.multi_modal_projector.linear_1``/``linear_2`` (with the
  encoder's activation between them), ``model.language_model.*`` and ``lm_head.weight``.

Every tensor is the same, unchanged; only names and config fields move, as transformers'
``convert_qwen3_asr_to_hf.py`` moves them, so a checkpoint converts in memory, weight by weight.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_original_qwen3_asr", "original_qwen3_asr_config", "original_qwen3_asr_key"]

MODEL_TYPE = "qwen3_asr"  # both layouts' top-level model_type
AUDIO_MODEL_TYPE = "qwen3_asr_encoder"
TEXT_MODEL_TYPE = "qwen3"

# Original prefix -> transformers prefix; the first match wins, so the projector precedes the rest of the tower.
KEY_PREFIXES = (
    ("thinker.audio_tower.proj1.", "model.multi_modal_projector.linear_1."),
    ("thinker.audio_tower.proj2.", "model.multi_modal_projector.linear_2."),
    ("thinker.audio_tower.", "model.audio_tower."),
    ("thinker.model.", "model.language_model."),
    ("thinker.lm_head.", "lm_head."),
)
# Qwen3-Omni's speech-output modules, which vLLM's Qwen3-ASR loader skips (skip_prefixes); no ASR model has them.
SKIPPED_PREFIXES = ("talker.", "code2wav.")

# Fields that fix shapes, windows and positions: required, as the two layouts' defaults differ for most of them.
AUDIO_REQUIRED = (
    "num_mel_bins",
    "encoder_layers",
    "encoder_attention_heads",
    "encoder_ffn_dim",
    "d_model",
    "downsample_hidden_size",
    "output_dim",
    "n_window",
    "n_window_infer",
)
TEXT_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rope_theta",
)
# Copied when present; absent, both layouts' defaults agree.
AUDIO_OPTIONAL = (
    "activation_function",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "scale_embedding",
    "initializer_range",
)
TEXT_OPTIONAL = ("hidden_act", "rms_norm_eps", "attention_bias", "attention_dropout", "initializer_range")
# MRoPE's fields (Qwen3-ASR gives its three position streams equal positions: plain RoPE) and the alias "type".
DROPPED_ROPE_KEYS = frozenset({"mrope_section", "mrope_interleaved", "interleaved", "type"})
DEFAULT_ROPE_TYPE = "default"
ORIGINAL_TIE_DEFAULT = False  # qwen-asr's Qwen3ASRTextConfig.tie_word_embeddings; the original ties by text_config
# Qwen's <|endoftext|> and <|im_end|>: qwen-asr's generate stops on both; transformers' converter writes these.
EOS_TOKEN_IDS = (151643, 151645)
PAD_TOKEN_ID = 151645
DOWNSAMPLING_CONVS = 3  # the encoder's conv2d1..3, each kernel 3, stride 2, padding 1


def _field(section: dict[str, Any], name: str, path: str) -> Any:
    """``section[name]``; ValueError naming ``path.name`` where it is absent."""
    if name not in section:
        raise ValueError(f"{path}.{name} is missing from the original Qwen3-ASR config")
    return section[name]


def _section(section: dict[str, Any], name: str, path: str) -> dict[str, Any]:
    """The dict ``section[name]``; ValueError naming ``path.name`` where it is absent or not a dict."""
    value = _field(section, name, path)
    if not isinstance(value, dict):
        raise ValueError(f"{path}.{name} must be a dict, got {type(value).__name__}")
    return value


def _copy(section: dict[str, Any], path: str, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, Any]:
    """The ``required`` fields of ``section`` (ValueError naming the first absent) and those of ``optional`` present."""
    fields = {name: _field(section, name, path) for name in required}
    fields.update({name: section[name] for name in optional if name in section})
    return fields


def is_original_qwen3_asr(config: dict[str, Any]) -> bool:
    """Whether a ``config.json`` dict is Qwen3-ASR's original layout (``model_type`` qwen3_asr, a ``thinker_config``).

    transformers' layout has the same ``model_type`` and no ``thinker_config``; it and other models give False.
    """
    return config.get("model_type") == MODEL_TYPE and "thinker_config" in config


def original_qwen3_asr_config(config: dict[str, Any]) -> dict[str, Any]:
    """transformers' ``Qwen3ASRConfig`` dict (``Qwen3ASRConfig(**result)``) of an original ``config.json`` dict.

    The audio config keeps its fields (``output_dim``, ``n_window``, ``n_window_infer``... under the same names)
    but ``max_source_positions`` and ``conv_chunksize``: the sinusoid table's rows are one chunk's positions after
    the convolutions (13 for ``n_window`` 50; its values do not depend on its length) and transformers runs the
    convolutions unchunked. (transformers 5.25 counts 13 tokens per whole chunk: it runs ``n_window`` 50 only,
    the released checkpoints'.) The text config becomes ``qwen3``: ``rope_theta`` and ``rope_scaling`` (less MRoPE)
    become ``rope_parameters``. ``thinker_config.audio_token_id`` moves up; ``audio_start_token_id`` and
    ``support_languages`` have no field (the processor writes the audio markers). ``tie_word_embeddings`` is
    ``text_config``'s, both at the top (transformers ties by it) and in the text config. Pad and eos are
    :data:`PAD_TOKEN_ID` and :data:`EOS_TOKEN_IDS`, as in transformers' converted checkpoints.

    Raises ValueError naming the field where a required one (``thinker_config``, its ``audio_config``,
    ``text_config``, ``audio_token_id``, and :data:`AUDIO_REQUIRED`, :data:`TEXT_REQUIRED`) is absent, and for a
    forced aligner (``thinker_config.classify_num``), whose head is transformers' ``Qwen3ASRForTokenClassification``.
    """
    thinker = _section(config, "thinker_config", "config")
    if "classify_num" in thinker:
        raise ValueError("thinker_config.classify_num: a Qwen3 forced aligner, not a Qwen3-ASR recogniser")
    original_audio = _section(thinker, "audio_config", "thinker_config")
    original_text = _section(thinker, "text_config", "thinker_config")

    audio = _copy(original_audio, "thinker_config.audio_config", AUDIO_REQUIRED, AUDIO_OPTIONAL)
    positions = 2 * audio["n_window"]
    for _ in range(DOWNSAMPLING_CONVS):
        positions = (positions - 1) // 2 + 1
    audio.update(model_type=AUDIO_MODEL_TYPE, max_position_embeddings=positions)

    text = _copy(original_text, "thinker_config.text_config", TEXT_REQUIRED, TEXT_OPTIONAL)
    rope_scaling = original_text.get("rope_scaling") or {}
    rope = {key: value for key, value in rope_scaling.items() if key not in DROPPED_ROPE_KEYS}
    rope.setdefault("rope_type", rope_scaling.get("type", DEFAULT_ROPE_TYPE))
    rope["rope_theta"] = text.pop("rope_theta")
    tie = original_text.get("tie_word_embeddings", ORIGINAL_TIE_DEFAULT)
    text.update(model_type=TEXT_MODEL_TYPE, rope_parameters=rope, tie_word_embeddings=tie)

    result = {
        "model_type": MODEL_TYPE,
        "audio_config": audio,
        "text_config": text,
        "audio_token_id": _field(thinker, "audio_token_id", "thinker_config"),
        "pad_token_id": PAD_TOKEN_ID,
        "eos_token_id": list(EOS_TOKEN_IDS),
        "tie_word_embeddings": tie,
    }
    if "initializer_range" in thinker:
        result["initializer_range"] = thinker["initializer_range"]
    return result


def original_qwen3_asr_key(name: str) -> str | None:
    """transformers' name of an original weight ``name`` (``thinker.audio_tower.proj1.weight`` ->
    ``model.multi_modal_projector.linear_1.weight``; :data:`KEY_PREFIXES`), the tensor unchanged.

    None for ``talker.*`` and ``code2wav.*`` (:data:`SKIPPED_PREFIXES`): Qwen3-Omni's speech output, which vLLM's
    loader skips and transformers' Qwen3-ASR has no module for. Any other name raises ValueError naming it.
    """
    for original, converted in KEY_PREFIXES:
        if name.startswith(original):
            return converted + name[len(original) :]
    if name.startswith(SKIPPED_PREFIXES):
        return None
    raise ValueError(f"{name!r} is not a weight of the original Qwen3-ASR layout")
