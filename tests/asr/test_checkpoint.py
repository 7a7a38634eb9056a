"""The model file: save/load round trips, float16 storage, metadata without weights, clear errors."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from audiomask.asr.checkpoint import (
    DEFAULT_MODEL_PATH,
    FORMAT,
    SHIPPED_ENCODER_CONFIG,
    load_model,
    model_info,
    save_model,
)
from audiomask.asr.model import ASRModel
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.models import Phi4MMEncoder

CARD = {"data": "random weights", "cer": {"offline": 0.5, "streaming": {"640": 0.6}}}
# 40 ms tokens, 320 ms chunks, 4 chunks of left context: the shipped model's streaming layout, tiny.
SHIPPED_LAYOUT = {"time_reduction": 4, "chunk_size": 8, "left_chunk": 4}


@pytest.fixture
def model(tiny_asr_model) -> ASRModel:
    """A tiny random model (every parameter and the normalisation buffers random, so a lost one shows)."""
    return tiny_asr_model(varied_text=False, **SHIPPED_LAYOUT)


def _log_probs(model: ASRModel, features: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden, _ = model.encoder(features, [features.shape[1]] * features.shape[0], mask_mode="hard")
        return model.head(hidden.float())


def test_round_trip_gives_equal_outputs_and_metadata(model: ASRModel, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_model(model, path, card=CARD)
    loaded = load_model(path)
    assert loaded.encoder.config == model.encoder.config
    assert loaded.tokenizer.alphabet == model.tokenizer.alphabet
    for original, restored in ((model.encoder, loaded.encoder), (model.head, loaded.head)):
        state = restored.state_dict()
        for name, tensor in original.state_dict().items():
            assert torch.equal(state[name], tensor), name
    features = torch.randn(2, 77, 80)
    assert torch.equal(_log_probs(loaded, features), _log_probs(model, features))
    info = model_info(path)
    expected_parameters = sum(t.numel() for m in (model.encoder, model.head) for t in m.state_dict().values())
    assert info["parameters"] == expected_parameters
    assert info["card"] == CARD and info["format"] == FORMAT and info["dtypes"] == ["F32"]
    assert (info["chunk_ms"], info["left_chunks"]) == (8 * 40, 4)  # the config's chunk of 8 tokens of 40 ms
    assert info["encoder_config"]["num_blocks"] == 2 and info["vocab_size"] == len(model.tokenizer.alphabet) + 1


def test_float16_storage_is_half_the_size_and_close(model: ASRModel, tmp_path: Path) -> None:
    full, half = tmp_path / "full.safetensors", tmp_path / "half.safetensors"
    save_model(model, full)
    save_model(model, half, dtype=torch.float16)
    assert model_info(half)["dtypes"] == ["F16"]
    assert model_info(half)["size_bytes"] < 0.6 * model_info(full)["size_bytes"]
    loaded = load_model(half)
    assert next(loaded.encoder.parameters()).dtype == torch.float32  # loaded in the dtype asked for
    features = torch.randn(1, 64, 80)
    reference, restored = _log_probs(model, features), _log_probs(loaded, features)
    assert not torch.equal(reference, restored)  # float16 rounding did happen
    torch.testing.assert_close(restored, reference, atol=2e-2, rtol=2e-2)


def test_streaming_defaults_reach_the_recognizer(model: ASRModel, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_model(model, path, chunk_ms=640, left_chunks=1)  # 16 tokens
    assert (model_info(path)["chunk_ms"], model_info(path)["left_chunks"]) == (640, 1)
    with StreamingRecognizer(load_model(path), overlap=False) as recognizer:
        assert (recognizer.chunk_ms, recognizer.left_chunks) == (640, 1)


def test_full_attention_config_has_no_default_chunk(model: ASRModel, tmp_path: Path) -> None:
    full_attention = Phi4MMEncoder(dataclasses.replace(model.encoder.config, chunk_size=-1))
    path = tmp_path / "model.safetensors"
    save_model(ASRModel(full_attention, model.head, model.tokenizer), path)
    assert model_info(path)["chunk_ms"] is None
    save_model(ASRModel(full_attention, model.head, model.tokenizer), path, chunk_ms=320)
    assert load_model(path).encoder.config.chunk_size == 8


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"dtype": torch.int8}, "dtype must be one of"),
        ({"chunk_ms": 100}, "chunk_ms must be a multiple of 40 (one encoder token), got 100"),
        ({"left_chunks": -1}, "left_chunks must be >= 0, got -1"),
        ({"card": ["not", "a", "mapping"]}, "card must be a mapping"),
        ({"card": {"when": object()}}, "card must be JSON-serialisable"),
    ],
)
def test_save_rejects_bad_arguments(model: ASRModel, tmp_path: Path, keywords: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        save_model(model, tmp_path / "model.safetensors", **keywords)
    assert not (tmp_path / "model.safetensors").exists()


def test_save_rejects_what_is_not_a_model(model: ASRModel, tiny_qwen3_asr, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model must be an ASRModel, got dict"):
        save_model({}, tmp_path / "model.safetensors")  # type: ignore[arg-type]
    qwen = ASRModel(tiny_qwen3_asr(), model.head, model.tokenizer)  # 16 wide too
    with pytest.raises(ValueError, match="model.encoder must be a Phi4MMEncoder .*got Qwen3ASREncoder"):
        save_model(qwen, tmp_path / "model.safetensors")


def _metadata_variant(model: ASRModel, tmp_path: Path, **changes: str | None) -> Path:
    """A saved model whose metadata has ``changes`` applied (``None`` removes a key)."""
    from safetensors import safe_open

    source = tmp_path / "source.safetensors"
    save_model(model, source)
    with safe_open(str(source), framework="pt") as reader:
        metadata = reader.metadata()
        tensors = {name: reader.get_tensor(name) for name in reader.keys()}  # noqa: SIM118
    for key, value in changes.items():
        if value is None:
            metadata.pop(key)
        else:
            metadata[key] = value
    path = tmp_path / "variant.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": None}, "not an audiomask model file (metadata format is None, expected 'audiomask-ctc/1')"),
        ({"format": "audiomask-ctc/9"}, "metadata format is 'audiomask-ctc/9'"),
        ({"alphabet": None}, "metadata lacks ['alphabet']"),
        ({"encoder_config": "{not json"}, "metadata 'encoder_config' is not valid JSON"),
        ({"encoder_config": json.dumps({"hidden_size": 16, "dropout": 0.1})}, "lacks: ['dropout']"),
        ({"encoder_config": json.dumps({"hidden_size": 32})}, "bad encoder_config"),
        ({"chunk_ms": "100"}, "chunk_ms must be a multiple of 40"),
        ({"left_chunks": "many"}, "metadata 'left_chunks' must be an integer, got 'many'"),
        ({"card": "[1,"}, "metadata 'card' is not valid JSON"),
        ({"card": "[1]"}, "metadata 'card' must be a JSON object, got list"),
        ({"alphabet": "aab"}, "bad alphabet"),
    ],
)
def test_foreign_or_inconsistent_metadata_is_a_clear_error(
    model: ASRModel, tmp_path: Path, changes: dict, message: str
) -> None:
    path = _metadata_variant(model, tmp_path, **changes)
    for read in (load_model, model_info):
        with pytest.raises(ValueError) as caught:
            read(path)
        assert str(path) in str(caught.value) and message in str(caught.value)


def test_weights_that_do_not_fit_the_config(model: ASRModel, tmp_path: Path) -> None:
    wider = json.dumps({**dataclasses.asdict(model.encoder.config), "intermediate_size": 32})
    deeper = json.dumps({**dataclasses.asdict(model.encoder.config), "num_blocks": 3})
    cases = [
        (wider, None, "encoder.encoders.0.feed_forward_in.down_proj.weight is (16, 24) in the file, (16, 32) by the"),
        (deeper, None, "encoder.encoders.2.conv.dw_sep_conv_1d.dw_conv.bias and 35 more are missing"),
        (
            None,
            model.tokenizer.alphabet + "-",
            "head.proj.bias is (29,) in the file, (30,) by the config (and 1 more tensor)",
        ),
    ]
    for encoder_config, alphabet, message in cases:
        changes = {"encoder_config": encoder_config} if encoder_config else {"alphabet": alphabet}
        path = _metadata_variant(model, tmp_path, **changes)
        for read in (load_model, model_info):  # told from the header, before any weight is read
            with pytest.raises(ValueError) as caught:
                read(path)
            assert str(caught.value).startswith(f"model {str(path)!r}: the weights do not fit the stored config: ")
            assert message in str(caught.value) and "\n" not in str(caught.value)


WIDE = 65536
# Metadata asking for absurd sizes, and what the error names: refused before anything is allocated.
ABSURD = {
    "left_chunks": (
        {"left_chunks": "99999999"},
        "left_chunks 99999999 with chunk_ms 320: a stream attends to (left_chunks + 1) * chunk_ms = "
        "32000000000 ms of audio, which exceeds MAX_CONTEXT_MS = 600000",
    ),
    "chunk_ms": ({"chunk_ms": "99999960"}, "chunk_ms must be <= 60000, got 99999960"),
    "hidden_size": (
        {"hidden_size": WIDE, "ext_pw_out_channel": WIDE, "depthwise_separable_out_channel": WIDE},
        f"hidden_size {WIDE}, ext_pw_out_channel {WIDE}, depthwise_separable_out_channel {WIDE} "
        "(beyond the released model's) make an encoder of 68,747,067,924 parameters, which exceeds "
        "MAX_ENCODER_PARAMETERS = 4,294,967,296",
    ),
    "num_blocks": ({"num_blocks": 10**8}, "num_blocks 100000000 exceeds MAX_ENCODER_BLOCKS = 128"),
    "bias_max_distance": ({"bias_max_distance": 10**10}, "bias_max_distance 10000000000 (beyond the released"),
    "nemo_conv_channels": ({"nemo_conv_channels": 10**6}, "nemo_conv_channels 1000000 (beyond the released"),
    "kernel_size": ({"kernel_size": 10**8}, "dw_conv.weight is (16, 1, 3) in the file, (16, 1, 100000000) by the"),
    "input_size": ({"input_size": 10**8}, "the weights do not fit the stored config: "),
    "time_reduction": ({"time_reduction": 2**40}, "chunk_ms must be a multiple of"),
    "negative": ({"num_attention_heads": -2}, "num_attention_heads must be >= 1, got -2"),
}
HEADROOM_BYTES = 512 * 2**20  # what reading a tiny model may map: far less than any absurd size asks


@pytest.mark.parametrize("case", list(ABSURD))
def test_absurd_sizes_are_refused_naming_the_field(
    model: ASRModel, tmp_path: Path, case: str, bounded_address_space
) -> None:
    changes, message = ABSURD[case]
    config = dataclasses.asdict(model.encoder.config)
    metadata = {key: value for key, value in changes.items() if key in ("chunk_ms", "left_chunks")}
    config.update({key: value for key, value in changes.items() if key not in metadata})
    path = _metadata_variant(model, tmp_path, encoder_config=json.dumps(config), **metadata)
    for read in (load_model, model_info):
        with bounded_address_space(HEADROOM_BYTES), pytest.raises(ValueError) as caught:
            read(path)
        assert str(caught.value).startswith(f"model {str(path)!r}: ") and message in str(caught.value)
        assert "\n" not in str(caught.value)


def test_a_model_that_is_not_a_regular_file_is_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)  # no writer: opening it would block
    for path, kind in ((Path("/dev/urandom"), "a character device"), (fifo, "a named pipe")):
        for read in (load_model, model_info):
            with pytest.raises(ValueError) as caught:
                read(path)
            assert str(caught.value) == f"model {str(path)!r}: not a regular file ({kind})"


def test_stray_tensors_are_not_silently_dropped(model: ASRModel, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_model(model, path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as reader:
        metadata = reader.metadata()
        tensors = {name: reader.get_tensor(name) for name in reader.keys()}  # noqa: SIM118
    save_file({**tensors, "decoder.weight": torch.zeros(2)}, str(path), metadata=metadata)
    with pytest.raises(ValueError, match=r"tensors outside encoder\./head\.: \['decoder.weight'\]"):
        load_model(path)


def test_missing_directory_and_corrupt_files(tmp_path: Path) -> None:
    missing = tmp_path / "absent.safetensors"
    with pytest.raises(ValueError, match="no such file") as caught:
        load_model(missing)
    assert str(missing) in str(caught.value)
    with pytest.raises(ValueError, match="is a directory, not a model file"):
        model_info(tmp_path)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header!!}")
    with pytest.raises(ValueError, match="not a readable safetensors file") as caught:
        load_model(corrupt)
    assert str(corrupt) in str(caught.value)
    wav = Path(__file__).resolve().parents[2] / "samples" / "hello_world.wav"
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        model_info(wav)


def test_load_rejects_a_bad_dtype(model: ASRModel, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_model(model, path)
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(path, dtype=torch.int64)
    assert next(load_model(path, dtype=torch.bfloat16).encoder.parameters()).dtype == torch.bfloat16


@pytest.mark.skipif(not DEFAULT_MODEL_PATH.is_file(), reason=f"the shipped model {DEFAULT_MODEL_PATH} is not built yet")
def test_shipped_model_loads() -> None:
    info = model_info()
    assert info["path"] == str(DEFAULT_MODEL_PATH) and info["chunk_ms"] is not None
    model = load_model()
    assert model.tokenizer.alphabet == info["alphabet"]
    assert model.encoder.config == SHIPPED_ENCODER_CONFIG  # the one definition of its architecture
