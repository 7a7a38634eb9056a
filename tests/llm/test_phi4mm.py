"""Phi-4-multimodal offline transcription equals transformers' own ``generate``, one utterance at a time, float32."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from audiomask.llm import checkpoint
from audiomask.llm import phi4mm as phi4mm_module
from audiomask.llm.phi4mm import DEFAULT_INSTRUCTION, ENCODE_BIAS_BYTES, phi4mm_prompt
from audiomask.llm.policy import StreamPolicy
from audiomask.llm.recognizer import LLMRecognizer
from audiomask.llm.refeed import ReFeedStreams, streams_for

transformers = pytest.importorskip("transformers")

MAX_NEW_TOKENS = 24


def reference(
    model: object,
    directory: Path,
    signal: np.ndarray,
    context: str = "",
    prefix: str = "",
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> list[int]:
    """transformers' greedy answer: its feature extractor, the prompt with one audio token per encoder token,
    then ``prefix`` (text the answer starts from; not in the returned ids).

    The prompt's ids are built here from the text (transformers' processor needs torchvision for its image
    processor); the audio token count is the feature extractor's ``audio_embed_sizes``, as the processor's.
    """
    from transformers import AutoTokenizer, Phi4MultimodalFeatureExtractor

    tokenizer = AutoTokenizer.from_pretrained(directory)
    features = Phi4MultimodalFeatureExtractor.from_pretrained(directory)(signal, return_tensors="pt")
    audio = tokenizer.audio_token * int(features["audio_embed_sizes"][0])
    system = f"<|system|>{context}<|end|>" if context else ""
    ids = tokenizer(f"{system}<|user|>{audio}{DEFAULT_INSTRUCTION}<|end|><|assistant|>{prefix}", return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(  # type: ignore[attr-defined]
            **ids, **features, max_new_tokens=max_new_tokens, do_sample=False
        )
    answer = out[0, ids["input_ids"].shape[1] :].tolist()
    stops = set(model.generation_config.eos_token_id)  # type: ignore[attr-defined]
    return answer[: next((i for i, token in enumerate(answer) if token in stops), len(answer))]


@pytest.fixture(scope="module")
def upstream(tiny_phi4mm_dir: Path):
    from transformers import Phi4MultimodalForCausalLM

    return Phi4MultimodalForCausalLM.from_pretrained(tiny_phi4mm_dir).eval()


@pytest.fixture(scope="module")
def phi4mm(tiny_phi4mm_dir: Path):
    return checkpoint.load(tiny_phi4mm_dir)


@pytest.mark.parametrize(("seconds", "context"), [(0.3, ""), (2.0, ""), (7.0, "names: Ada"), (12.0, ""), (41.0, "")])
def test_phi4mm_tokens_equal_transformers_generate(
    phi4mm, upstream, tiny_phi4mm_dir: Path, speech: Callable, seconds: float, context: str
) -> None:
    signal = speech(seconds, seed=int(seconds * 100))
    ours = phi4mm.transcribe([signal], context=context, max_new_tokens=MAX_NEW_TOKENS)[0]
    expected = reference(upstream, tiny_phi4mm_dir, signal, context)
    assert list(ours.tokens) == expected
    assert ours.text == phi4mm.tokenizer.decode(expected, skip_special_tokens=True).strip()
    assert ours.language == ""


def test_an_utterance_decoded_beside_others_equals_itself_alone(phi4mm, speech: Callable) -> None:
    signals = [speech(seconds, seed) for seed, seconds in enumerate((0.5, 3.3, 6.0, 1.1))]
    together = phi4mm.transcribe(signals, max_new_tokens=MAX_NEW_TOKENS)
    alone = [phi4mm.transcribe([signal], max_new_tokens=MAX_NEW_TOKENS)[0] for signal in signals]
    assert [t.tokens for t in together] == [t.tokens for t in alone]
    assert len({t.tokens for t in alone}) > 1  # the tiny model's answers depend on what it hears


@pytest.mark.parametrize("bias_bytes", [ENCODE_BIAS_BYTES, 1], ids=["a call a length", "a call an utterance"])
def test_utterances_of_one_length_share_an_encoder_call_and_equal_each_alone(
    phi4mm, speech: Callable, monkeypatch: pytest.MonkeyPatch, bias_bytes: int
) -> None:
    """Equal lengths are one encoder call (as re-fed streams at one point of their segments), split where their
    attention bias would pass ``ENCODE_BIAS_BYTES``; each utterance's inputs and tokens are its own alone."""
    monkeypatch.setattr(phi4mm_module, "ENCODE_BIAS_BYTES", bias_bytes)
    lengths_s = (2.0, 3.3, 2.0, 41.0, 2.0, 41.0)  # 41 s: two of upstream's 500-token blocks
    signals = [speech(seconds, seed) for seed, seconds in enumerate(lengths_s)]
    alone = [
        phi4mm.audio_inputs(torch.from_numpy(f), n)[0] for f, n in map(phi4mm.frontend.batch, ([s] for s in signals))
    ]
    encoder, calls = phi4mm.encoder, []
    forward = encoder.forward
    monkeypatch.setattr(
        encoder, "forward", lambda features, *a, **k: calls.append(len(features)) or forward(features, *a, **k)
    )
    features, lengths = phi4mm.frontend.batch(signals)
    together = phi4mm.audio_inputs(torch.from_numpy(features), lengths)
    assert calls == ([3, 1, 2] if bias_bytes == ENCODE_BIAS_BYTES else [1] * len(signals))
    for ours, own in zip(together, alone, strict=True):
        torch.testing.assert_close(ours, own, rtol=1e-5, atol=1e-5)
    tokens = [t.tokens for t in phi4mm.transcribe(signals, max_new_tokens=MAX_NEW_TOKENS)]
    assert tokens == [phi4mm.transcribe([s], max_new_tokens=MAX_NEW_TOKENS)[0].tokens for s in signals]
    assert len({tokens[0], tokens[2], tokens[4]}) > 1  # equal lengths, different audio, different answers


def test_the_prompt_without_a_chat_template_is_the_documented_format(phi4mm) -> None:
    tokenizer = phi4mm.tokenizer
    with_template = phi4mm_prompt(tokenizer, "<|audio|>", "ctx", None)
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        assert phi4mm_prompt(tokenizer, "<|audio|>", "ctx", None) == with_template
    finally:
        tokenizer.chat_template = template
    assert tokenizer.decode(list(with_template.head)) == "<|system|>ctx<|end|><|user|>"
    assert tokenizer.decode(list(with_template.tail)) == f"{DEFAULT_INSTRUCTION}<|end|><|assistant|>"


def test_a_language_is_refused(phi4mm, speech: Callable) -> None:
    with pytest.raises(ValueError, match="takes no language"):
        phi4mm.transcribe([speech(0.5, 0)], language="en")


def test_the_speech_lora_is_merged_as_peft_applies_it(tiny_phi4mm_lora_dir: Path, speech: Callable) -> None:
    """With ``speech-lora/``: our merged weights give the tokens of transformers' model with peft's LoRA layers.

    peft applies the adapter unmerged (``x @ W.T + scaling * (x @ A.T) @ B.T``); transformers' own
    ``load_adapter`` calls the same peft code (it asks for peft >= 0.22, so peft's API is used here directly).
    """
    peft = pytest.importorskip("peft")
    from transformers import Phi4MultimodalForCausalLM

    bare = Phi4MultimodalForCausalLM.from_pretrained(tiny_phi4mm_lora_dir).eval()
    adapted = Phi4MultimodalForCausalLM.from_pretrained(tiny_phi4mm_lora_dir).eval()
    peft.PeftModel.from_pretrained(adapted, tiny_phi4mm_lora_dir / "speech-lora")  # LoRA layers put into `adapted`
    assert sum(".lora_A." in name for name, _ in adapted.named_parameters()) == 2 * 4  # 2 layers, 4 modules each
    ours = checkpoint.load(tiny_phi4mm_lora_dir)
    changed = False
    # Signals whose answers lack the audio token: transformers' generate fails on a step whose new token is
    # the audio token (its audio embedding puts the whole audio at that one position).
    for seconds, seed in ((1.5, 2), (2.5, 3)):
        signal = speech(seconds, seed)
        expected = reference(adapted, tiny_phi4mm_lora_dir, signal)
        assert list(ours.transcribe([signal], max_new_tokens=MAX_NEW_TOKENS)[0].tokens) == expected
        changed |= expected != reference(bare, tiny_phi4mm_lora_dir, signal)
    assert changed  # the adapter changes the answers: it was applied


def _copy(directory: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(directory, tmp_path / directory.name))


def _rewrite_safetensors(file: Path, edit: Callable[[dict], object]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})


def _write_adapter(directory: Path, config: dict, modules: dict[str, tuple[int, int]], r: int) -> dict:
    """A ``speech-lora/`` in peft's format by hand: random ``(A, B)`` for ``modules`` (name -> (out, in))."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(5)
    tensors = {}
    for module, (rows, columns) in modules.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(r, columns, generator=generator)
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(rows, r, generator=generator)
    adapter = directory / "speech-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "target_modules": [], **config}))
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    return tensors


@pytest.mark.parametrize(("use_rslora", "scaling"), [(False, 6 / 4), (True, 6 / 2)])
def test_merge_lora_adds_scaling_times_b_at_a(
    tiny_phi4mm_dir: Path, tmp_path: Path, use_rslora: bool, scaling: float
) -> None:
    from audiomask.llm.lora import merge_lora

    state = {"model.layers.0.self_attn.qkv_proj.weight": torch.randn(64, 32), "other.weight": torch.randn(3)}
    module = "model.layers.0.self_attn.qkv_proj"
    tensors = _write_adapter(tmp_path, {"r": 4, "lora_alpha": 6, "use_rslora": use_rslora}, {module: (64, 32)}, r=4)
    merged = merge_lora(state, tmp_path / "speech-lora")
    delta = tensors[f"base_model.model.{module}.lora_B.weight"] @ tensors[f"base_model.model.{module}.lora_A.weight"]
    torch.testing.assert_close(merged[f"{module}.weight"], state[f"{module}.weight"] + scaling * delta)
    assert merged["other.weight"] is state["other.weight"]


@pytest.mark.parametrize(
    ("config", "drop", "match"),
    [
        ({"lora_alpha": 8}, None, r"speech-lora.*lacks 'r'"),
        ({"r": 0, "lora_alpha": 8}, None, "r must be a positive integer"),
        ({"r": 2, "lora_alpha": 8, "use_dora": True}, None, "use_dora"),
        ({"r": 2, "lora_alpha": 8, "rank_pattern": {"qkv_proj": 8}}, None, "rank_pattern"),
        ({"r": 3, "lora_alpha": 8}, None, r"lora_A \(2, 32\).*r = 3"),
        ({"r": 2, "lora_alpha": 8}, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", "down_proj.lora_B"),
    ],
)
def test_a_malformed_adapter_is_a_value_error_naming_it(
    tiny_phi4mm_dir: Path, tmp_path: Path, config: dict, drop: str | None, match: str
) -> None:
    directory = _copy(tiny_phi4mm_dir, tmp_path)
    modules = {"model.layers.0.self_attn.qkv_proj": (64, 32), "model.layers.1.mlp.down_proj": (32, 48)}
    _write_adapter(directory, config, modules, r=2)
    if drop is not None:
        _rewrite_safetensors(directory / "speech-lora" / "adapter_model.safetensors", lambda tensors: tensors.pop(drop))
    with pytest.raises(ValueError, match=match):
        checkpoint.load(directory)


def test_an_adapter_of_a_weight_the_model_lacks_is_a_value_error(tiny_phi4mm_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_phi4mm_dir, tmp_path)
    _write_adapter(directory, {"r": 2, "lora_alpha": 2}, {"model.layers.7.self_attn.qkv_proj": (64, 32)}, r=2)
    with pytest.raises(ValueError, match=r"model\.layers\.7\.self_attn\.qkv_proj\.weight"):
        checkpoint.load(directory)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.self_attn.qkv_proj.weight"),
        ("model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"),
        ("model.layers.0.mlp.down_proj.weight", "layers.0.mlp.down_proj.weight"),
        ("model.embed_tokens_extend.audio_embed.up_proj_for_speech.weight", "up_proj_for_speech.weight"),
        ("model.embed_tokens_extend.audio_embed.encoder.embed.out.weight", "embed.out.weight"),
    ],
)
def test_weights_missing_a_tensor_are_a_value_error_naming_it(
    tiny_phi4mm_dir: Path, tmp_path: Path, name: str, said: str
) -> None:
    directory = _copy(tiny_phi4mm_dir, tmp_path)
    _rewrite_safetensors(directory / "model.safetensors", lambda tensors: tensors.pop(name))
    with pytest.raises(ValueError, match=said.replace(".", r"\.")):
        checkpoint.load(directory)


def test_phi4mm_streams_by_re_feeding_each_partial_the_recipe_over_transformers_generate(
    phi4mm, upstream, tiny_phi4mm_dir: Path, speech: Callable
) -> None:
    """Its encoder attends over the whole utterance, so each update encodes all the audio so far again: every
    partial is transformers' greedy answer for that audio from the recipe's prefix (the previous answer less its
    last tokens, none for the first chunks), and the final is the offline answer, across a segment's end."""
    policy = StreamPolicy(chunk_s=1.0, update_tokens=6, final_tokens=MAX_NEW_TOKENS, segment_windows=1)
    signal = speech(9.6, seed=5)  # past one segment: 8 s
    streams = streams_for(phi4mm, 2, policy=policy)
    assert isinstance(streams, ReFeedStreams)
    streams.open("talk")
    tokenizer, size, cut = phi4mm.tokenizer, policy.chunk_samples, 8 * 16000
    raw, start, partials = "", 0, 0  # the segment's answer so far, where it starts, its updates
    for end in range(size, len(signal) + 1, size):
        streams.feed("talk", signal[end - size : end])
        (partial,) = streams.update()
        ids, back, prefix = tokenizer.encode(raw), policy.unfixed_tokens, ""
        while partials >= policy.unfixed_chunks and len(ids) > back:  # a cut through a character: one more back
            prefix = tokenizer.decode(ids[:-back])
            if "\ufffd" not in prefix:
                break
            back, prefix = back + 1, ""
        expected = reference(upstream, tiny_phi4mm_dir, signal[start:end], prefix=prefix, max_new_tokens=6)
        assert list(partial.tokens) == expected, end
        raw, partials = prefix + tokenizer.decode(expected, skip_special_tokens=True), partials + 1
        if end - start >= cut:  # the segment ends at 8 s: its offline answer is committed, the stream goes on
            committed = phi4mm.transcribe([signal[start : start + cut]], max_new_tokens=MAX_NEW_TOKENS)[0].text
            raw, start, partials = "", start + cut, 0
    streams.feed("talk", signal[end:])  # the last 0.6 s: no chunk of its own, in the final
    (final,) = streams.finish(["talk"])
    rest = phi4mm.transcribe([signal[start:]], max_new_tokens=MAX_NEW_TOKENS)[0].text
    assert final.text == " ".join(text for text in (committed, rest) if text)


def test_phi4mm_streams_through_the_recognizer_to_the_offline_answer(phi4mm, speech: Callable) -> None:
    """What ``audiomask transcribe --model DIR`` drives: a stream's final is the offline answer."""
    signal = speech(3.3, seed=8)
    recognizer = LLMRecognizer(phi4mm, max_streams=1, policy=StreamPolicy(chunk_s=1.0, final_tokens=MAX_NEW_TOKENS))
    stream = recognizer.open_stream("file")
    stream.accept(signal)
    assert stream.partial()  # a partial each whole chunk
    assert stream.finish() == phi4mm.transcribe([signal], max_new_tokens=MAX_NEW_TOKENS)[0].text
