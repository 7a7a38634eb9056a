"""Offline transcription equals transformers' own ``generate``, one utterance at a time, float32 on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from audiomask.llm import checkpoint, generate
from audiomask.llm.lm import CausalLM, LMConfig, fuse_projections

transformers = pytest.importorskip("transformers")

MAX_NEW_TOKENS = 24


def reference(directory: Path, signal: np.ndarray, context: str, language: str | None) -> list[int]:
    """transformers' greedy answer for one utterance: its processor, its chat template, its ``generate``."""
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    processor = AutoProcessor.from_pretrained(directory)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(directory).eval()
    messages = [
        {"role": "system", "content": context},
        {"role": "user", "content": [{"type": "audio", "audio": ""}]},
    ]
    text = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if language is not None:
        text += f"language {language}<asr_text>"
    inputs = processor(text=text, audio=signal, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    sequences = out.sequences if hasattr(out, "sequences") else out
    answer = sequences[0, inputs["input_ids"].shape[1] :].tolist()
    stops = set(model.generation_config.eos_token_id)
    return answer[: next((i for i, token in enumerate(answer) if token in stops), len(answer))]


@pytest.fixture(scope="module")
def qwen3_asr(tiny_qwen3_asr_dir: Path):
    return checkpoint.load(tiny_qwen3_asr_dir)


@pytest.mark.parametrize(
    ("seconds", "context", "language"),
    [(0.3, "", None), (2.4, "names: Ada", None), (5.0, "", "English"), (17.3, "", None), (9.05, "ctx", "en")],
)
def test_qwen3_asr_tokens_equal_transformers_generate(
    qwen3_asr, tiny_qwen3_asr_dir: Path, speech: Callable, seconds: float, context: str, language: str | None
) -> None:
    signal = speech(seconds, seed=int(seconds * 100))
    ours = qwen3_asr.transcribe([signal], context=context, language=language, max_new_tokens=MAX_NEW_TOKENS)[0]
    name = None if language is None else {"en": "English"}.get(language, language)
    assert list(ours.tokens) == reference(tiny_qwen3_asr_dir, signal, context, name)


def test_an_utterance_decoded_beside_others_equals_itself_alone(qwen3_asr, speech: Callable) -> None:
    signals = [speech(seconds, seed) for seed, seconds in enumerate((0.5, 3.3, 12.0, 1.1))]
    together = qwen3_asr.transcribe(signals, max_new_tokens=MAX_NEW_TOKENS)
    alone = [qwen3_asr.transcribe([signal], max_new_tokens=MAX_NEW_TOKENS)[0] for signal in signals]
    assert [t.tokens for t in together] == [t.tokens for t in alone]
    assert len({t.tokens for t in alone}) > 1  # the tiny model's answers depend on what it hears


def test_a_prefill_split_over_forwards_equals_one_forward(
    qwen3_asr, speech: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = [speech(seconds, seed) for seed, seconds in enumerate((0.5, 3.3, 2.0, 1.1))]
    whole = qwen3_asr.transcribe(signals, max_new_tokens=MAX_NEW_TOKENS)
    lengths = [len(row) for row in qwen3_asr.prompts(signals, qwen3_asr.prompt("", None))]
    limit = lengths[0] + lengths[1] - 1  # no two of the first rows fit one forward: three forwards at least
    monkeypatch.setattr(generate, "PREFILL_TOKENS", limit)
    assert len(generate._groups(np.array(lengths), limit)) >= 3
    assert [t.tokens for t in qwen3_asr.transcribe(signals, max_new_tokens=MAX_NEW_TOKENS)] == [t.tokens for t in whole]


def test_lm_logits_equal_transformers_qwen3_over_ragged_rows_and_steps(tiny_qwen3_asr_dir: Path) -> None:
    """Rows of different lengths prefilled together, then extended one by one, give transformers' logits."""
    from transformers import AutoConfig, Qwen3ForCausalLM

    config = AutoConfig.from_pretrained(tiny_qwen3_asr_dir).text_config
    torch.manual_seed(1)
    upstream = Qwen3ForCausalLM(config).eval()
    ours = CausalLM(LMConfig.from_transformers(config, qk_norm=True)).eval()
    state = {name.removeprefix("model."): tensor for name, tensor in upstream.state_dict().items()}
    ours.load_state_dict(fuse_projections(state))
    rows = [torch.randint(0, config.vocab_size, (length,)) for length in (7, 3, 12)]
    cache = ours.new_cache(slots=4, capacity=32)
    slots = [2, 0, 3]
    with torch.inference_mode():
        first = [row[: max(1, len(row) - 2)] for row in rows]
        width = max(len(row) for row in first)
        embeds = torch.zeros(3, width, config.hidden_size)
        for index, row in enumerate(first):
            embeds[index, : len(row)] = ours.embed(row)
        ours(embeds, torch.tensor(slots), np.array([len(row) for row in first]), cache)
        rest = [row[len(head) :] for row, head in zip(rows, first, strict=True)]
        for step in range(2):
            live = [index for index, tail in enumerate(rest) if len(tail) > step]
            logits = ours(
                ours.embed(torch.stack([rest[index][step] for index in live]))[:, None],
                torch.tensor([slots[index] for index in live]),
                np.ones(len(live), np.int64),
                cache,
            )
            for position, index in enumerate(live):
                expected = upstream(rows[index][None, : len(first[index]) + step + 1]).logits[0, -1]
                torch.testing.assert_close(logits[position], expected, rtol=1e-4, atol=1e-4)


def test_the_original_layout_gives_the_tokens_of_the_transformers_layout(
    qwen3_asr, tiny_qwen3_asr_original_dir: Path, speech: Callable
) -> None:
    original = checkpoint.load(tiny_qwen3_asr_original_dir)
    assert checkpoint.describe(tiny_qwen3_asr_original_dir)["layout"].startswith("original")
    for seconds in (0.7, 9.3):
        signal = speech(seconds, seed=11)
        ours, theirs = (model.transcribe([signal], max_new_tokens=MAX_NEW_TOKENS)[0] for model in (original, qwen3_asr))
        assert ours.tokens == theirs.tokens


def test_static_decode_steps_equal_eager_steps_with_padded_rows(tiny_qwen3_asr_dir: Path) -> None:
    """:class:`GraphedDecode`'s path (rows padded to a power of two, keys read in buckets; eager on the CPU)."""
    from transformers import AutoConfig

    from audiomask.llm.graphs import GraphedDecode

    config = AutoConfig.from_pretrained(tiny_qwen3_asr_dir).text_config
    torch.manual_seed(2)
    lm = CausalLM(LMConfig.from_transformers(config, qk_norm=True)).eval()
    eager_cache, static_cache = lm.new_cache(6, 300), lm.new_cache(6, 300)
    steps = GraphedDecode(lm, static_cache)
    prompts = {slot: torch.randint(0, config.vocab_size, (length,)) for slot, length in ((4, 9), (1, 140), (2, 3))}
    with torch.inference_mode():
        for cache in (eager_cache, static_cache):
            for slot, ids in prompts.items():
                lm(lm.embed(ids)[None], np.array([slot]), np.array([len(ids)]), cache)
        for slots in ([4, 1, 2], [2, 4], [1], [4, 1, 2]):  # 3 rows pad to 4; spans cross a bucket edge
            tokens = torch.randint(0, config.vocab_size, (len(slots),))
            eager = lm(lm.embed(tokens)[:, None], np.array(slots), np.ones(len(slots), np.int64), eager_cache)
            static = steps.step(tokens, np.array(slots))
            torch.testing.assert_close(static, eager, rtol=1e-4, atol=1e-4)
            assert static_cache.lengths.tolist() == eager_cache.lengths.tolist()
