"""An LLM recogniser in one bundle: :class:`AudioLM` (encoder, projector, language model, tokenizer, prompt).

:meth:`AudioLM.transcribe` is the offline path: each utterance's features
through the encoder and the projector, its prompt around them, and greedy
decoding, every utterance in its own cache slot, so an utterance's text does
not depend on the others in the call.

Usage (with a checkpoint directory on disk)::

    from audiomask.llm.checkpoint import load
    model = load("Qwen3-ASR-0.6B", device="cuda", dtype=torch.bfloat16)
    print(model.transcribe([samples], language="en", context="Ada Lovelace")[0].text)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.attention import sdpa_kernel

from audiomask.features.frontend import Frontend
from audiomask.llm.generate import greedy
from audiomask.llm.lm import ATTENTION_BACKENDS, CausalLM
from audiomask.llm.prompt import PromptParts, decode_texts
from audiomask.models import Phi4MMEncoder, Qwen3ASREncoder
from audiomask.samples import as_samples

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "AudioLM", "LLMTranscript"]

DEFAULT_MAX_NEW_TOKENS = 512  # the qwen-asr package's default answer length


@dataclass(frozen=True)
class LLMTranscript:
    """One utterance's answer: ``text`` (parsed), ``language`` ("" when not said), the answer's ``tokens``, ``raw``."""

    text: str
    language: str
    tokens: tuple[int, ...]
    raw: str


@dataclass
class AudioLM:
    """An LLM recogniser: ``encoder`` -> ``projector`` -> ``lm``, with its tokenizer and prompt rules.

    ``family``: ``"qwen3_asr"`` or ``"phi4mm"``; ``prompt(context, language)``: the ids around the audio;
    ``parse(answers, language)``: ``(language, text)`` of each decoded answer; ``stop_ids``: the end tokens.
    """

    family: str
    encoder: Phi4MMEncoder | Qwen3ASREncoder
    projector: nn.Module
    lm: CausalLM
    tokenizer: Any
    frontend: Frontend
    prompt: Callable[[str, str | None], PromptParts]
    parse: Callable[[Sequence[str], str | None], list[tuple[str, str]]]
    stop_ids: frozenset[int]
    path: str = ""
    description: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.lm.device

    def audio_inputs(self, features: torch.Tensor, lengths: np.ndarray) -> list[torch.Tensor]:
        """Language-model inputs of a padded feature batch ``(B, bins, T)`` and its ``(B,)`` int64 host ``lengths``:
        per utterance ``(n_b, hidden_size)`` on the model's device. The token counts come from the host lengths:
        nothing waits for the device."""
        with sdpa_kernel(ATTENTION_BACKENDS):  # shapes change with every utterance: no cuDNN plan per shape
            outputs, _ = self.encoder(features, lengths)
        projected = self.projector(outputs)
        counts = self.encoder.output_lengths(np.asarray(lengths, np.int64))
        return [projected[row, :count] for row, count in enumerate(counts.tolist())]

    def prompt_inputs(self, parts: PromptParts, audio: torch.Tensor) -> torch.Tensor:
        """``(len(head) + n + len(tail), hidden_size)``: the prompt's embeddings with ``audio`` ``(n, hidden_size)``."""
        embed = self.lm.embed
        head = embed(torch.tensor(parts.head, dtype=torch.long))
        tail = embed(torch.tensor(parts.tail, dtype=torch.long))
        return torch.cat((head, audio.to(head.dtype), tail))

    def answers(self, answers: Sequence[Sequence[int]], language: str | None) -> list[LLMTranscript]:
        """The transcript of each answer's token ids, decoded and parsed together."""
        raws = decode_texts(self.tokenizer, answers)
        return [
            LLMTranscript(text=text, language=said, tokens=tuple(tokens), raw=raw)
            for tokens, raw, (said, text) in zip(answers, raws, self.parse(raws, language), strict=True)
        ]

    def answer(self, tokens: Sequence[int], language: str | None) -> LLMTranscript:
        """The transcript of an answer's token ids."""
        return self.answers([tokens], language)[0]

    def prompts(self, signals: Sequence[object], parts: PromptParts) -> list[torch.Tensor]:
        """Each utterance's whole prompt ``(len(head) + n_b + len(tail), hidden_size)`` on the model's device: its
        features (offline: the floor of the whole utterance) through the encoder and the projector, between the
        prompt's ``parts``. ``signals``: 1-D 16 kHz float samples each."""
        features, lengths = self.frontend.batch(
            [as_samples(f"signals[{index}]", signal) for index, signal in enumerate(signals)]
        )
        return self.feature_prompts(features, lengths, parts)

    def feature_prompts(self, features: np.ndarray, lengths: np.ndarray, parts: PromptParts) -> list[torch.Tensor]:
        """:meth:`prompts` of a front end's :meth:`~audiomask.features.frontend.Frontend.batch` output: float32
        ``features`` ``(B, bins, T)`` (or ``(B, T, bins)``, per the front end's time axis) and ``(B,)`` ``lengths``."""
        audio = self.audio_inputs(torch.from_numpy(features), lengths)
        return [self.prompt_inputs(parts, row) for row in audio]

    @torch.inference_mode()
    def transcribe(
        self,
        signals: Sequence[object],
        *,
        context: str = "",
        language: str | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        stop: bool = True,
    ) -> list[LLMTranscript]:
        """Transcribe whole utterances (1-D 16 kHz float samples each), greedily; one transcript each.

        ``context``: text the model is told first (names, terms it should prefer); ``language``: a
        language to force (a name or an ISO code), ``None`` to let the model detect it;
        ``max_new_tokens``: the longest answer; ``stop=False``: always that long (random weights, benchmarks).
        """
        if not signals:
            return []
        inputs = self.prompts(signals, self.prompt(context, language))
        cache = self.lm.new_cache(len(inputs), max(len(row) for row in inputs) + max_new_tokens)
        answers = greedy(self.lm, cache, range(len(inputs)), inputs, max_new_tokens, self.stop_ids, stop=stop)
        return self.answers(answers, language)
