"""The official streaming recipe through transformers, one stream: the anchor as a user without vLLM runs it.

Every chunk, :class:`TransformersReFeed` re-feeds all the audio so far through transformers' own processor (its
feature extractor) and ``Qwen3ASRForConditionalGeneration.generate``: the chat prompt, then the previous answer
less its last ``unfixed_tokens`` tokens as the answer's prefix (none for the first ``unfixed_chunks`` chunks),
then exactly ``fixed_tokens`` new tokens (random weights never say the end token). That is ``qwen-asr``'s
``streaming_transcribe`` with transformers in place of vLLM: its cost per update grows with the utterance.
:func:`refeed_updates` times each update of one stream (features, prompt and decoding; on CUDA, synchronized).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from audiomask.constants import SAMPLE_RATE
from audiomask.llm.policy import REPLACEMENT_CHARACTER, StreamPolicy

__all__ = ["TransformersReFeed", "refeed_updates"]

MS_PER_S = 1000


class TransformersReFeed:
    """One stream of the recipe over the checkpoint ``directory``, on ``device`` in ``dtype``; ``policy`` must
    have ``fixed_tokens``. :meth:`update` takes all the stream's samples so far."""

    def __init__(self, directory: Path, policy: StreamPolicy, device: str, dtype: torch.dtype) -> None:
        from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

        if policy.fixed_tokens is None:
            raise ValueError("policy must have fixed_tokens: random weights never end an answer")
        self.processor = AutoProcessor.from_pretrained(directory)
        self.model = Qwen3ASRForConditionalGeneration.from_pretrained(directory, dtype=dtype).to(device).eval()
        self.policy, self.device = policy, device
        messages = [{"role": "system", "content": ""}, {"role": "user", "content": [{"type": "audio", "audio": ""}]}]
        tokenizer = self.processor.tokenizer
        self.prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        self.raw, self.chunks = "", 0

    def _prefix(self) -> str:
        """The previous answer less its last ``unfixed_tokens`` tokens (a cut through a character: one more)."""
        if self.chunks < self.policy.unfixed_chunks or not self.raw:
            return ""
        tokenizer = self.processor.tokenizer
        ids = tokenizer.encode(self.raw)
        back = self.policy.unfixed_tokens
        while (end := len(ids) - back) > 0:
            prefix = tokenizer.decode(ids[:end])
            if REPLACEMENT_CHARACTER not in prefix:
                return prefix
            back += 1
        return ""

    @torch.inference_mode()
    def update(self, samples: np.ndarray) -> int:
        """One chunk: ``samples`` are all the stream's audio so far (16 kHz float32); the prompt's token count."""
        prefix = self._prefix()
        inputs = self.processor(text=self.prompt + prefix, audio=samples, return_tensors="pt").to(self.device)
        inputs["input_features"] = inputs["input_features"].to(self.model.dtype)
        tokens = self.policy.fixed_tokens
        out = self.model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        sequences = out.sequences if hasattr(out, "sequences") else out
        length = inputs["input_ids"].shape[1]
        answer = sequences[0, length:].tolist()
        self.raw = prefix + self.processor.tokenizer.decode(answer, skip_special_tokens=True)
        self.chunks += 1
        return length


def refeed_updates(reference: TransformersReFeed, signal: np.ndarray) -> list[dict]:
    """Each update of one stream over ``signal``, a chunk at a time: ``update``, ``audio_s`` (the audio so far),
    ``ms`` (the update's wall time) and ``prompt_tokens``."""
    size = reference.policy.chunk_samples
    rows = []
    for update, end in enumerate(range(size, len(signal) + 1, size), 1):
        if reference.device.startswith("cuda"):
            torch.cuda.synchronize()
        began = time.perf_counter()
        prompt = reference.update(signal[:end])
        if reference.device.startswith("cuda"):
            torch.cuda.synchronize()
        ms = (time.perf_counter() - began) * MS_PER_S
        rows.append({"update": update, "audio_s": end / SAMPLE_RATE, "ms": ms, "prompt_tokens": prompt})
    return rows
