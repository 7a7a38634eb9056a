"""Tiny random LLM-recogniser checkpoints, saved by transformers, with a byte-level tokenizer.

Qwen3-ASR's come from :mod:`bench.llm_checkpoints` (the server benchmark writes
its real sizes the same way), Phi-4-multimodal's are built here with its
tokenizer. ``initializer_range`` is about 1: at transformers' default a tiny
model says the same thing whatever it hears; at 1 its tokens depend on the
audio. The vocabulary is 256 byte tokens plus the models' special tokens, so
the special ids are small and read from the directory, never assumed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from bench.llm_checkpoints import PHI4MM_SPECIALS, TINY_AUDIO, TINY_TEXT, phi4mm_tokenizer, save_qwen3_asr  # noqa: E402
from bench.llm_checkpoints import speech as speech_signal  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _save_qwen3_asr(directory: Path, seed: int) -> Path:
    return save_qwen3_asr(directory, TINY_AUDIO, TINY_TEXT, seed=seed)


@pytest.fixture(scope="session")
def tiny_qwen3_asr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3-ASR checkpoint in transformers' layout (``save_pretrained``), with its processor."""
    return _save_qwen3_asr(tmp_path_factory.mktemp("qwen3-asr-tiny"), seed=0)


@pytest.fixture(scope="session")
def speech() -> Callable[[float, int], np.ndarray]:
    """``speech(seconds, seed)``: float32 16 kHz audio with a voice-like spectrum (harmonics with a moving pitch)."""
    return speech_signal


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


PHI4MM_AUDIO = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_blocks": 2,
    "num_attention_heads": 2,
    "ext_pw_out_channel": 16,
    "depthwise_separable_out_channel": 16,
    "nemo_conv_channels": 8,
    "initializer_range": 1.0,
}
PHI4MM_VISION = {  # as small as the config allows: the checkpoint holds a vision tower the recogniser does not read
    "hidden_size": 8,
    "intermediate_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
    "crop_size": 28,
}
# Phi-4-mini's shape in small: grouped-query attention, LongRoPE over 3/4 of each head (short factors used below
# original_max_position_embeddings; the attention factor from max_position_embeddings / original).
PHI4MM_TEXT = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "original_max_position_embeddings": 4096,
    "initializer_range": 1.0,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "short_factor": [1.0, 1.5, 2.5],
        "long_factor": [2.0, 3.0, 4.0],
        "original_max_position_embeddings": 4096,
    },
}
# The speech LoRA's modules: the decoder's linear layers (the audio encoder's have the same names).
PHI4MM_LORA_TARGETS = r"model\.layers\.\d+\.(self_attn\.(qkv|o)_proj|mlp\.(gate_up|down)_proj)"


def save_phi4mm(directory: Path, seed: int, tie_word_embeddings: bool, lora: bool) -> Path:
    from transformers import Phi4MultimodalConfig, Phi4MultimodalFeatureExtractor, Phi4MultimodalForCausalLM

    tokenizer = phi4mm_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in PHI4MM_SPECIALS}
    config = Phi4MultimodalConfig(
        **PHI4MM_TEXT,
        vocab_size=len(tokenizer),
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|endoftext|>"], ids["<|end|>"]],
        audio_config={**PHI4MM_AUDIO, "audio_token_id": ids["<|audio|>"]},
        vision_config={**PHI4MM_VISION, "image_token_id": ids["<|image|>"]},
    )
    torch.manual_seed(seed)
    model = Phi4MultimodalForCausalLM(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    Phi4MultimodalFeatureExtractor().save_pretrained(directory)
    if lora:
        peft = pytest.importorskip("peft")
        adapter = peft.get_peft_model(
            model,
            peft.LoraConfig(r=4, lora_alpha=6, target_modules=PHI4MM_LORA_TARGETS, init_lora_weights=False),
        )
        with torch.no_grad():  # random, nonzero A and B, large enough to change the answers
            for name, parameter in adapter.named_parameters():
                if ".lora_" in name:
                    parameter.normal_(0.0, 0.5)
        adapter.save_pretrained(directory / "speech-lora")
    return directory


@pytest.fixture(scope="session")
def tiny_phi4mm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Phi-4-multimodal checkpoint (``Phi4MultimodalForCausalLM.save_pretrained``), tied head, no LoRA."""
    return save_phi4mm(tmp_path_factory.mktemp("phi4mm-tiny"), seed=0, tie_word_embeddings=True, lora=False)


@pytest.fixture(scope="session")
def tiny_phi4mm_lora_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Phi-4-multimodal checkpoint, untied head, with a random ``speech-lora/`` saved by peft."""
    return save_phi4mm(tmp_path_factory.mktemp("phi4mm-lora"), seed=1, tie_word_embeddings=False, lora=True)


# transformers' name prefix -> the original Qwen3-ASR layout's (qwen-asr's modules: the audio tower holds proj1, proj2)
QWEN3_ASR_TO_ORIGINAL = (
    ("model.multi_modal_projector.linear_1.", "thinker.audio_tower.proj1."),
    ("model.multi_modal_projector.linear_2.", "thinker.audio_tower.proj2."),
    ("model.audio_tower.", "thinker.audio_tower."),
    ("model.language_model.", "thinker.model."),
    ("lm_head.", "thinker.lm_head."),
)


@pytest.fixture(scope="session")
def tiny_qwen3_asr_original_dir(tiny_qwen3_asr_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-ASR in the original published layout (``thinker_config``, ``thinker.*`` weights), same tensors."""
    import shutil

    from safetensors.torch import load_file, save_file

    directory = tmp_path_factory.mktemp("qwen3-asr-tiny-original")
    for file in tiny_qwen3_asr_dir.iterdir():
        if file.name not in ("config.json", "model.safetensors"):
            shutil.copy(file, directory / file.name)
    config = read_json(tiny_qwen3_asr_dir / "config.json")
    text = dict(config["text_config"])
    rope = text.pop("rope_parameters")
    text.update(
        model_type="qwen3_asr_text",
        rope_theta=rope["rope_theta"],
        rope_scaling={
            "rope_type": "default",
            "type": "default",
            "mrope_section": [2, 1, 1],
            "interleaved": True,
        },
    )
    original = {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "model_type": "qwen3_asr",
        "thinker_config": {
            "model_type": "qwen3_asr_thinker",
            "audio_token_id": config["audio_token_id"],
            "audio_config": {**config["audio_config"], "model_type": "qwen3_asr_audio_encoder"},
            "text_config": text,
        },
    }
    (directory / "config.json").write_text(json.dumps(original))
    weights = {}
    for name, tensor in load_file(tiny_qwen3_asr_dir / "model.safetensors").items():
        prefix, target = next(pair for pair in QWEN3_ASR_TO_ORIGINAL if name.startswith(pair[0]))
        weights[target + name[len(prefix) :]] = tensor.contiguous()
    save_file(weights, directory / "model.safetensors")
    return directory
