"""Qwen3-ASR as an LLM recogniser: its projector, its prompt and how its answer reads.

The prompt is the checkpoint's chat template for a transcription request
(what the ``qwen-asr`` package and transformers' processor build): a system
turn holding the optional context text (how users bias the model toward
their words), a user turn holding the audio between ``<|audio_start|>`` and
``<|audio_end|>``, one ``<|audio_pad|>`` placeholder per encoder token, and
the assistant's turn; a forced language appends ``language X<asr_text>``, so
the model writes only the text. Its answer otherwise reads
``language X<asr_text>text`` (:func:`audiomask.llm.parse.parse_outputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from audiomask.llm.files import CheckpointFiles, fill
from audiomask.llm.lm import CausalLM, LMConfig, fuse_projections
from audiomask.llm.model import AudioLM
from audiomask.llm.parse import ASR_TEXT_TAG, language_name, parse_outputs
from audiomask.llm.prompt import PromptParts, split_at_audio
from audiomask.models.config import Qwen3ASRConfig
from audiomask.models.qwen3_asr import Qwen3ASREncoder
from audiomask.streaming import default_frontend

__all__ = ["AUDIO_PLACEHOLDER", "Qwen3ASRProjector", "assemble", "build", "qwen3_asr_prompt", "qwen3_asr_texts"]

AUDIO_PLACEHOLDER = "<|audio_pad|>"  # the chat template's one placeholder; the prompt repeats it per audio token


class Qwen3ASRProjector(nn.Module):
    """Encoder tokens ``(..., d_model)`` -> language-model inputs ``(..., output_dim)``: linear, GELU, linear.

    Weight-compatible with transformers' ``Qwen3ASRMultiModalProjector`` (``linear_1``, ``linear_2``).
    """

    def __init__(self, d_model: int, output_dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(d_model, d_model)
        self.linear_2 = nn.Linear(d_model, output_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.linear_2(nn.functional.gelu(self.linear_1(tokens)))


def qwen3_asr_prompt(tokenizer: Any, context: str, language: str | None) -> PromptParts:
    """The token ids around the audio of a transcription request, from the checkpoint's chat template.

    ``context``: the system turn's text ("" for none); ``language``: a language name or code to force
    (:func:`~audiomask.llm.parse.language_name`), or ``None`` to let the model say it.
    """
    messages = [
        {"role": "system", "content": context},
        {"role": "user", "content": [{"type": "audio", "audio": ""}]},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if language is not None:
        text += f"language {language_name(language)}{ASR_TEXT_TAG}"
    return split_at_audio(tokenizer, text, AUDIO_PLACEHOLDER)


def qwen3_asr_texts(answers: Sequence[str], language: str | None) -> list[tuple[str, str]]:
    """``(language, text)`` of each of the model's decoded answers (the forced language's name when one was
    forced), parsed together."""
    return parse_outputs(answers, None if language is None else language_name(language))


def build(files: CheckpointFiles, device: torch.device | str, dtype: torch.dtype) -> AudioLM:
    """The Qwen3-ASR recogniser of a checkpoint's files (transformers' names), on ``device`` in ``dtype``."""
    from transformers import AutoConfig

    config = files.config
    audio = config.get("audio_config") or {}
    text = AutoConfig.for_model(**(config.get("text_config") or {}))
    tokenizer = files.tokenizer()
    encoder = Qwen3ASREncoder(Qwen3ASRConfig.from_dict(audio))
    projector = Qwen3ASRProjector(encoder.output_size, audio.get("output_dim", text.hidden_size))
    lm = CausalLM(LMConfig.from_transformers(text, qk_norm=True))
    fill(encoder, files.read("model.audio_tower."), "encoder", files)
    fill(projector, files.read("model.multi_modal_projector."), "projector", files)
    lm_state = files.read("model.language_model.")
    lm_state.update({f"lm_head.{name}": tensor for name, tensor in files.read("lm_head.").items()})
    tied = ("lm_head.weight",) if lm.config.tie_word_embeddings else ()
    fill(lm, fuse_projections(lm_state), "language model", files, tied)
    for module in (encoder, projector, lm):
        module.to(device=device, dtype=dtype).eval()
    return assemble(encoder, projector, lm, tokenizer, files.stop_ids(), path=str(files.directory))


def assemble(
    encoder: Qwen3ASREncoder,
    projector: Qwen3ASRProjector,
    lm: CausalLM,
    tokenizer: Any,
    stop_ids: frozenset[int],
    **fields: Any,
) -> AudioLM:
    """The Qwen3-ASR recogniser of its parts (its front end, prompt and answer rules); ``fields``: AudioLM's others."""
    return AudioLM(
        family="qwen3_asr",
        encoder=encoder,
        projector=projector,
        lm=lm,
        tokenizer=tokenizer,
        frontend=default_frontend(encoder),
        prompt=lambda context, language: qwen3_asr_prompt(tokenizer, context, language),
        parse=qwen3_asr_texts,
        stop_ids=stop_ids,
        **fields,
    )
