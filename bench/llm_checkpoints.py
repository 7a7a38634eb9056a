"""Random Qwen3-ASR checkpoint directories, as transformers saves them, with a byte-level tokenizer built here.

Nothing here is part of :mod:`audiomask`; two users load what it writes with
``audiomask.llm.checkpoint.load`` (the directory's config, weights, tokenizer
and chat template, as a user's download):

- the tests (``tests/llm``, ``tests/serve``): :func:`save_qwen3_asr` with
  :data:`TINY_AUDIO` and :data:`TINY_TEXT` (``initializer_range`` 1: at
  transformers' default a tiny model says the same thing whatever it hears);
  the vocabulary is 256 byte tokens plus the special tokens, so special ids
  are small and read from the directory, never assumed;
- the server and endpoint benchmarks (``scripts/bench_server.py --model llm_0.6b``,
  :data:`RANDOM_LLMS`): :func:`save_random_qwen3_asr` at the released sizes
  (:data:`bench.llm_streams.SIZES`), normal(0, 0.02) weights, and a
  byte-level BPE tokenizer of the model's 151,936 ids (words of ASCII
  letters), so that every id the random model writes decodes to text and
  encodes back to that id, at a real BPE's cost.
"""

from __future__ import annotations

import contextlib
import itertools
import string
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "QWEN3_ASR_ADDED",
    "QWEN3_ASR_CHAT_TEMPLATE",
    "QWEN3_ASR_NAMED",
    "QWEN3_ASR_SPECIALS",
    "PHI4MM_CHAT_TEMPLATE",
    "PHI4MM_NAMED",
    "PHI4MM_SPECIALS",
    "TINY_AUDIO",
    "TINY_TEXT",
    "byte_tokenizer",
    "qwen3_asr_tokenizer",
    "phi4mm_tokenizer",
    "word_ids",
    "save_qwen3_asr",
    "RANDOM_LLMS",
    "random_llm_directory",
    "save_random_qwen3_asr",
    "speech",
]

QWEN3_ASR_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
)
QWEN3_ASR_NAMED = {
    "audio_token": "<|audio_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
# As Qwen3-ASR's: "<asr_text>" is an added token that is not special (the output keeps it, the parser splits on it).
QWEN3_ASR_ADDED = ("<asr_text>",)
# The chat template of the released Qwen3-ASR checkpoints, reduced to what a transcription request uses.
QWEN3_ASR_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "<|im_start|>system\n{{ message['content'] if message['content'] is string else '' }}<|im_end|>\n"
    "{% elif message['role'] == 'user' %}"
    "<|im_start|>user\n"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PHI4MM_SPECIALS = ("<|endoftext|>", "<|user|>", "<|end|>", "<|assistant|>", "<|system|>", "<|audio|>", "<|image|>")
PHI4MM_NAMED = {"audio_token": "<|audio|>", "image_token": "<|image|>"}
# The chat template of the released Phi-4-multimodal tokenizer, reduced to what a transcription request uses.
PHI4MM_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
)
TINY_AUDIO = {
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "d_model": 16,
    "downsample_hidden_size": 4,
    "output_dim": 24,
    "initializer_range": 1.0,
}
TINY_TEXT = {
    "hidden_size": 24,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "initializer_range": 1.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
WORD_START = "\u0120"  # "Ġ": the byte-level alphabet's space, which starts a word
BYTE_TOKENS = 256  # the byte-level alphabet: ids 0-255
TEMPLATE_WORDS = ("system", "user", "assistant")  # the role names of QWEN3_ASR_CHAT_TEMPLATE
BENCH_INIT_RANGE = 0.02  # the real sizes' weights: normal(0, 0.02), as bench.llm_streams.build_model's


def qwen3_asr_tokenizer(vocab_size: int | None = None) -> Any:
    """:func:`byte_tokenizer` with Qwen3-ASR's special and added tokens, chat template and named tokens."""
    return byte_tokenizer(
        QWEN3_ASR_SPECIALS, QWEN3_ASR_ADDED, QWEN3_ASR_CHAT_TEMPLATE, QWEN3_ASR_NAMED, vocab_size=vocab_size
    )


def phi4mm_tokenizer(vocab_size: int | None = None) -> Any:
    """:func:`byte_tokenizer` with Phi-4-multimodal's special tokens, chat template and named tokens."""
    return byte_tokenizer(PHI4MM_SPECIALS, (), PHI4MM_CHAT_TEMPLATE, PHI4MM_NAMED, vocab_size=vocab_size)


def byte_tokenizer(
    specials: tuple[str, ...],
    added: tuple[str, ...],
    chat_template: str,
    named: dict[str, str],
    vocab_size: int | None = None,
) -> Any:
    """A byte-level BPE tokenizer (256 byte tokens, no merges) with ``specials`` and ``added`` tokens after them.

    ``named``: attribute name -> special token (``audio_token``...), as the models' processors read them.
    ``vocab_size``: add the chat template's role names and words (`` ab``, `` xyZ``) after the byte tokens, with
    the merges that make them, so that the tokenizer holds this many ids, each decoding to its own text and
    encoded back to its id (as a real vocabulary's words: the streaming prompt's prefix is the answer's text
    encoded again), and Qwen3-ASR's prompt has its 9 + 6 tokens around the audio; ``None``: none.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: index for index, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []

    def merge(token: str) -> None:  # the token, made from itself less its last character
        vocab[token] = len(vocab)
        merges.append((token[:-1], token[-1]))

    if vocab_size is not None:
        # The chat template's role names, one token each (as in Qwen's vocabulary: the prompt's length is its);
        # their merges rank last, so that no word below is split by them.
        for word in TEMPLATE_WORDS:
            for end in range(2, len(word) + 1):
                merge(word[:end])
        roles, merges = merges, []
        # Words of one to four ASCII letters after a space ("Ġ"), each merged from the word one letter shorter:
        # the pre-tokenizer splits a text at its spaces, so a decoded text encodes back to its ids (the
        # streaming prompt's prefix), at a real BPE's cost (151k merges, as Qwen's).
        words = itertools.chain.from_iterable(itertools.product(string.ascii_letters, repeat=n) for n in range(1, 5))
        for word in itertools.islice(words, vocab_size - len(specials) - len(added) - len(vocab)):
            merge(WORD_START + "".join(word))
        merges += roles
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=specials[0], pad_token=specials[0], extra_special_tokens=named
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(specials[1:])})
    tokenizer.add_tokens(list(added))
    tokenizer.chat_template = chat_template
    return tokenizer


def word_ids(tokenizer: Any) -> range:
    """The ids of :func:`byte_tokenizer`'s words (given a ``vocab_size``): after the byte tokens and the role
    names, before the special tokens (the first of which is the end token) and the added ones; a random answer
    made of them encodes back to itself."""
    first = BYTE_TOKENS + sum(len(word) - 1 for word in TEMPLATE_WORDS)
    return range(first, tokenizer.convert_tokens_to_ids(tokenizer.eos_token))


def save_qwen3_asr(
    directory: Path,
    audio: dict[str, Any],
    text: dict[str, Any],
    *,
    seed: int = 0,
    vocab_size: int | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Path:
    """A random Qwen3-ASR checkpoint in transformers' layout (``save_pretrained``), with its processor, in ``directory``.

    ``audio``, ``text``: transformers' ``Qwen3ASRConfig`` audio and text configs (the text one a ``qwen3``'s);
    ``vocab_size``: the language model's ids (``None``: the tokenizer's, 263); the weights are made on
    ``device`` (a GPU makes a 0.6B model in seconds) and stored in ``dtype``.
    """
    from transformers import (
        Qwen3ASRConfig,
        Qwen3ASRFeatureExtractor,
        Qwen3ASRForConditionalGeneration,
        Qwen3ASRProcessor,
    )

    tokenizer = qwen3_asr_tokenizer(vocab_size)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN3_ASR_SPECIALS}
    config = Qwen3ASRConfig(
        audio_config=audio,
        text_config={**text, "model_type": "qwen3", "vocab_size": vocab_size or len(tokenizer)},
        audio_token_id=ids["<|audio_pad|>"],
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|endoftext|>"], ids["<|im_end|>"]],
        initializer_range=text.get("initializer_range", BENCH_INIT_RANGE),
        tie_word_embeddings=text.get("tie_word_embeddings", True),  # the model's own, as the text config says
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ASRForConditionalGeneration(config).to(dtype).eval()
    model.save_pretrained(directory)
    del model
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()  # the caller (a benchmark) starts a server on this GPU next: give its memory back
    processor = Qwen3ASRProcessor(
        feature_extractor=Qwen3ASRFeatureExtractor(), tokenizer=tokenizer, chat_template=QWEN3_ASR_CHAT_TEMPLATE
    )
    processor.save_pretrained(directory)
    return directory


def save_random_qwen3_asr(directory: Path, size: str, device: str = "cpu", seed: int = 0) -> Path:
    """Qwen3-ASR of :data:`bench.llm_streams.SIZES` ``size`` (``0.6b``, ``1.7b``, ``tiny``), random weights
    (normal, std 0.02; the language model's head untied), bfloat16, saved in ``directory`` as :func:`save_qwen3_asr`
    saves it."""
    from bench.llm_streams import SIZES

    spec = SIZES[size]
    init = {"initializer_range": BENCH_INIT_RANGE}
    # An untied head (the same GEMM as the released tied one): tied, random weights repeat the prompt's last token,
    # a newline, and every parsed text is empty.
    text = {key: value for key, value in spec["text"].items() if key != "vocab_size"} | init
    text["tie_word_embeddings"] = False
    audio = spec["audio"] | {"output_dim": spec["output_dim"]} | init
    return save_qwen3_asr(
        directory, audio, text, seed=seed, vocab_size=spec["text"]["vocab_size"], device=device, dtype=torch.bfloat16
    )


# The benchmarks' --model names of random LLM recognisers: Qwen3-ASR at a size of bench.llm_streams.SIZES.
RANDOM_LLMS = {"llm_0.6b": "0.6b", "llm_1.7b": "1.7b", "llm_tiny": "tiny"}


def random_llm_directory(name: str, device: str, stack: contextlib.ExitStack) -> str:
    """A temporary directory of the random LLM recogniser ``name`` (:data:`RANDOM_LLMS`, by
    :func:`save_random_qwen3_asr`), made on ``device`` (``"auto"``: the CPU), removed with ``stack``."""
    directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="audiomask-bench-llm-"))
    return str(save_random_qwen3_asr(Path(directory), RANDOM_LLMS[name], device="cpu" if device == "auto" else device))


def speech(seconds: float, seed: int) -> np.ndarray:
    """``(round(seconds * 16000),)`` float32 audio at 16 kHz with a voice-like spectrum (harmonics of a moving
    pitch, a syllable-rate envelope, a little noise): what the tests' random recognisers hear."""
    rng = np.random.default_rng(seed)
    time = np.arange(int(round(seconds * 16000))) / 16000
    pitch = 120 + 60 * np.sin(2 * np.pi * rng.uniform(0.2, 1.0) * time + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(pitch) / 16000
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * time)
    return (0.1 * voice * envelope + 0.01 * rng.standard_normal(len(time))).astype(np.float32)
