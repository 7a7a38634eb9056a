"""Phi-4-multimodal as an LLM recogniser: its speech projector, its speech LoRA, its prompt and its answer.

A checkpoint in transformers' ``Phi4MultimodalForCausalLM`` layout
(``model_type`` "phi4_multimodal") is read into audiomask's modules:

- the audio Conformer (``model.embed_tokens_extend.audio_embed.encoder.``)
  into :class:`~audiomask.models.Phi4MMEncoder`, run in its
  ``"phi4mm_compat"`` mask mode (transformers' numerics), each utterance
  encoded under the mask transformers builds for one utterance alone (no
  key masked; past 500 tokens the last block's zero padding is attended),
  utterances of equal length in one call;
- the speech projector (``up_proj_for_speech``, GELU, ``down_proj_for_speech``)
  into :class:`Phi4MMProjector`; the ``*_for_vision_speech`` pair, which
  transformers uses only when an image comes with the audio, is not read;
- the Phi-4-mini decoder (``model.embed_tokens``, ``model.layers``,
  ``model.norm``, ``lm_head``) into :class:`~audiomask.llm.lm.CausalLM` with
  ``qk_norm=False``: its fused ``qkv_proj`` (query, key, value rows) and
  ``gate_up_proj`` (gate rows, then up) are :class:`~audiomask.llm.lm.CausalLM`'s
  own layout; the head is the embedding when the config ties them. LongRoPE and the partial
  rotary factor come from the config (:meth:`~audiomask.llm.lm.LMConfig.from_transformers`).

The speech LoRA: when the directory holds a ``speech-lora/`` peft adapter
(as the released checkpoint does, and transformers loads with
``model.load_adapter(path, adapter_kwargs={"subfolder": "speech-lora"})``),
it is merged into the decoder's weights
(:func:`~audiomask.llm.lora.merge_lora`); without one, the base weights are used.

The prompt is the model card's transcription request, through the checkpoint's
chat template when it has one, else the documented chat format:
``<|user|>`` + one audio token per encoder token + :data:`DEFAULT_INSTRUCTION`
+ ``<|end|><|assistant|>``. ``context`` (text the model is told first) is a
system turn before it (``<|system|>context<|end|>``, the model card's chat
format), none when empty. The model card gives no transcription prompt that
names a language, so ``language`` must be ``None`` (a ``ValueError``
otherwise): the model says what it hears. The answer is the decoded text,
stripped; its language is not said ("").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.attention import sdpa_kernel

from audiomask.llm.files import CheckpointFiles, fill
from audiomask.llm.lm import ATTENTION_BACKENDS, CausalLM, LMConfig
from audiomask.llm.lora import merge_lora
from audiomask.llm.model import AudioLM
from audiomask.llm.prompt import PromptParts, split_at_audio
from audiomask.masks.phi4mm import streaming_mask
from audiomask.models.config import Phi4MMAudioConfig
from audiomask.models.phi4mm import UNFOLD_TOKENS, Phi4MMEncoder
from audiomask.streaming import default_frontend

__all__ = [
    "DEFAULT_INSTRUCTION",
    "ENCODE_BIAS_BYTES",
    "MASK_MODE",
    "SPEECH_LORA",
    "Phi4MMProjector",
    "assemble",
    "build",
    "phi4mm_prompt",
    "phi4mm_texts",
]

DEFAULT_INSTRUCTION = "Transcribe the audio clip into text."  # the model card's speech recognition prompt
SPEECH_LORA = "speech-lora"  # the checkpoint's subdirectory holding the speech LoRA (a peft adapter)
MASK_MODE = "phi4mm_compat"  # the encoder's mask mode that equals transformers' Phi4MultimodalAudioModel
# An encoder call's attention bias (utterances x blocks x heads x block^2, in the encoder's dtype) at most this: 209
# full-size utterances of 32 s (400 tokens, 16 heads) in bf16.
ENCODE_BIAS_BYTES = 2**30
_AUDIO_EMBED = "model.embed_tokens_extend.audio_embed."
_ENCODER = "encoder."  # under _AUDIO_EMBED
_PROJECTOR = ("up_proj_for_speech.", "down_proj_for_speech.")  # under _AUDIO_EMBED
_LM = ("model.embed_tokens.", "model.layers.", "model.norm.", "lm_head.")  # the decoder's tensors
_MODEL = "model."  # transformers' prefix of the decoder's tensors but the head


class Phi4MMProjector(nn.Module):
    """Encoder tokens ``(..., audio_size)`` -> language-model inputs ``(..., hidden_size)``: linear, GELU, linear.

    Weight-compatible with the speech pair of transformers' ``Phi4MultimodalAudioEmbedding``
    (``up_proj_for_speech``, ``down_proj_for_speech``).
    """

    def __init__(self, audio_size: int, hidden_size: int) -> None:
        super().__init__()
        self.up_proj_for_speech = nn.Linear(audio_size, hidden_size)
        self.down_proj_for_speech = nn.Linear(hidden_size, hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``down(gelu(up(tokens)))``."""
        return self.down_proj_for_speech(nn.functional.gelu(self.up_proj_for_speech(tokens)))


class _Phi4MMAudioLM(AudioLM):
    """An :class:`AudioLM` that encodes each utterance as transformers encodes one utterance alone.

    In ``"phi4mm_compat"`` mode a masked key is only one logit down, so an utterance padded in a batch is
    not encoded as it is alone. Alone, transformers' processor gives no audio mask, and its encoder masks no
    key: past :data:`~audiomask.models.phi4mm.UNFOLD_TOKENS` tokens, the zero padding of the last block is
    attended like the rest (:func:`_unpadded_mask`). Utterances of one length need no padding beside each
    other, so each group of equal lengths is one encoder call (re-fed streams at the same point of their
    segments have equal lengths: an update of many streams is a few calls, not one a stream).
    """

    def audio_inputs(self, features: torch.Tensor, lengths: np.ndarray) -> list[torch.Tensor]:
        """Language-model inputs of a padded feature batch ``(B, T, 80)`` and its ``(B,)`` host ``lengths``: per
        utterance ``(n_b, hidden_size)``, its token count from the host length (nothing waits for the device).

        Utterances of one length are encoded together, at most :data:`ENCODE_BIAS_BYTES` of attention bias a call.
        """
        encoder, lengths = self.encoder, np.asarray(lengths)
        inputs: list[torch.Tensor] = [features.new_empty(0)] * len(lengths)
        element = next(encoder.parameters()).element_size()
        for length in np.unique(lengths).tolist():
            block, blocks = _blocks(encoder, length)
            bias_bytes = blocks * encoder.config.num_attention_heads * block * block * element  # an utterance's
            rows = np.flatnonzero(lengths == length)
            calls = min(len(rows), max(1, -(-len(rows) * bias_bytes // ENCODE_BIAS_BYTES)))  # one row at least each
            for call in np.array_split(rows, calls):
                mask = _unpadded_mask(encoder, length, len(call))
                group = features[torch.from_numpy(call).to(features.device), :length]
                with sdpa_kernel(ATTENTION_BACKENDS):  # as the other encoders': no cuDNN plan per shape
                    outputs, _ = encoder(group, [length] * len(call), mask_mode=MASK_MODE, mask=mask)
                projected = self.projector(outputs[:, : encoder.output_lengths(length)])
                for position, row in enumerate(call.tolist()):
                    inputs[row] = projected[position]
        return inputs


def _blocks(encoder: Phi4MMEncoder, frames: int) -> tuple[int, int]:
    """``(l, n)``: the length and count of upstream's blocks for one utterance of ``frames`` frames, ``l = min(L,
    UNFOLD_TOKENS)``, ``n = ceil(L / l)``, ``L = ceil(frames / time_reduction)``."""
    tokens = -(-frames // encoder.config.time_reduction)
    block = max(1, min(tokens, UNFOLD_TOKENS))
    return block, -(-tokens // block)


def _unpadded_mask(encoder: Phi4MMEncoder, frames: int, utterances: int = 1) -> np.ndarray:
    """The compat-mode mask of ``utterances`` utterances of ``frames`` frames each, as transformers builds it for
    one utterance without an audio mask: ``(utterances * n, l, l)`` (:func:`_blocks`), the chunk band of each
    block, every key valid (the last block's padding too)."""
    block, blocks = _blocks(encoder, frames)
    return streaming_mask(block, utterances * blocks, *encoder.chunking(None, None))


def phi4mm_prompt(tokenizer: Any, audio_token: str, context: str, language: str | None) -> PromptParts:
    """The token ids around the audio of a transcription request (see the module docstring).

    ``audio_token``: the tokenizer's token for the audio (one placeholder in the text); ``context``: the
    system turn's text ("" for none); ``language``: must be ``None`` (``ValueError`` otherwise).
    """
    if language is not None:
        raise ValueError(
            f"Phi-4-multimodal takes no language (its model card gives no transcription prompt naming one), "
            f"got language={language!r}; pass None"
        )
    messages = [{"role": "system", "content": context}] if context else []
    messages.append({"role": "user", "content": f"{audio_token}{DEFAULT_INSTRUCTION}"})
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "".join(f"<|{message['role']}|>{message['content']}<|end|>" for message in messages) + "<|assistant|>"
    return split_at_audio(tokenizer, text, audio_token)


def phi4mm_texts(answers: Sequence[str], language: str | None) -> list[tuple[str, str]]:
    """``("", text)`` of each of the model's decoded answers: the text stripped (Phi-4-multimodal does not say its
    language)."""
    return [("", answer.strip()) for answer in answers]


def _tokenizer(files: CheckpointFiles) -> Any:
    """The directory's tokenizer; a chat template is used when it has one (not required)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise ImportError("LLM recognisers need transformers: pip install 'audiomask[llm]'") from error
    try:
        return AutoTokenizer.from_pretrained(str(files.directory), local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"model {str(files.directory)!r} lacks a tokenizer transformers can read: {error}") from None


def _audio_token(tokenizer: Any, token_id: int, files: CheckpointFiles) -> str:
    """The token of ``token_id``, checked to be one the tokenizer keeps whole (the prompt is split at it)."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(token, str) or tokenizer.encode(token, add_special_tokens=False) != [token_id]:
        raise ValueError(
            f"model {str(files.directory)!r}: the audio token id {token_id} (audio_config.audio_token_id) must be an "
            f"added token of the tokenizer, got {token!r}"
        )
    return token


def _text_config(files: CheckpointFiles) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(**files.config)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"model {str(files.directory)!r}: config.json is not a Phi-4-multimodal config: {error}"
        ) from None


def build(files: CheckpointFiles, device: torch.device | str, dtype: torch.dtype) -> AudioLM:
    """The Phi-4-multimodal recogniser of a checkpoint's files (transformers' names), on ``device`` in ``dtype``.

    The ``speech-lora/`` adapter, when the directory holds one, is merged into the decoder's weights.
    A missing or misshapen weight, or a malformed adapter, is a ``ValueError`` naming it.
    """
    config = _text_config(files)
    audio = files.config.get("audio_config") or {}
    if audio.get("downsample_rate", 1) != 1:
        raise ValueError(
            f"model {str(files.directory)!r}: audio_config.downsample_rate must be 1 (transformers' audio embedding "
            f"projects encoder tokens one by one), got {audio['downsample_rate']!r}"
        )
    tokenizer = _tokenizer(files)
    audio_token = _audio_token(tokenizer, int(config.audio_config.audio_token_id), files)
    encoder = Phi4MMEncoder(Phi4MMAudioConfig.from_dict(audio))
    projector = Phi4MMProjector(encoder.output_size, config.hidden_size)
    lm = CausalLM(LMConfig.from_transformers(config, qk_norm=False))
    audio_state = files.read(_AUDIO_EMBED)
    encoder_state = {name[len(_ENCODER) :]: t for name, t in audio_state.items() if name.startswith(_ENCODER)}
    projector_state = {name: t for name, t in audio_state.items() if name.startswith(_PROJECTOR)}
    lm_state: dict[str, torch.Tensor] = {}
    for prefix in _LM:
        lm_state.update({f"{prefix}{name}": tensor for name, tensor in files.read(prefix).items()})
    lora = files.directory / SPEECH_LORA
    if lora.is_dir():
        lm_state = merge_lora(lm_state, lora)
    lm_state = {name.removeprefix(_MODEL): tensor for name, tensor in lm_state.items()}
    fill(encoder, encoder_state, "encoder", files)
    fill(projector, projector_state, "projector", files)
    tied = ("lm_head.weight",) if lm.config.tie_word_embeddings else ()
    fill(
        lm, lm_state, "language model", files, tied, lambda name: name if name.startswith("lm_head.") else _MODEL + name
    )
    for module in (encoder, projector, lm):
        module.to(device=device, dtype=dtype).eval()
    return assemble(encoder, projector, lm, tokenizer, audio_token, files.stop_ids(), path=str(files.directory))


def assemble(
    encoder: Phi4MMEncoder,
    projector: Phi4MMProjector,
    lm: CausalLM,
    tokenizer: Any,
    audio_token: str,
    stop_ids: frozenset[int],
    **fields: Any,
) -> AudioLM:
    """The Phi-4-multimodal recogniser of its parts (its front end, prompt with ``audio_token`` once per encoder
    token, and answer rules); ``fields``: AudioLM's others."""
    return _Phi4MMAudioLM(
        family="phi4mm",
        encoder=encoder,
        projector=projector,
        lm=lm,
        tokenizer=tokenizer,
        frontend=default_frontend(encoder),
        prompt=lambda context, language: phi4mm_prompt(tokenizer, audio_token, context, language),
        parse=phi4mm_texts,
        stop_ids=stop_ids,
        **fields,
    )
