"""audiomask.models.from_pretrained: transformers checkpoints saved with save_pretrained load and reproduce."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from audiomask.models import Phi4MMEncoder, Qwen3ASREncoder, from_pretrained

pytestmark = pytest.mark.parity
transformers = pytest.importorskip("transformers")
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny_fields(tiny_phi4mm, tiny_qwen3_asr):
    """The config fields of the tiny Phi-4MM and Qwen3-ASR encoders, for transformers' configs."""
    return dataclasses.asdict(tiny_phi4mm().config), dataclasses.asdict(tiny_qwen3_asr().config)


@pytest.fixture(scope="module")
def saved_encoders(tmp_path_factory, tiny_fields, randomize):
    """Each upstream encoder saved on its own, and sharded (the index file path)."""
    phi_fields, qwen_fields = tiny_fields
    phi_config = transformers.Phi4MultimodalAudioConfig(**{**phi_fields, "chunk_size": 3, "left_chunk": 1})
    phi = randomize(transformers.Phi4MultimodalAudioModel(phi_config))
    qwen = randomize(transformers.Qwen3ASREncoder(transformers.Qwen3ASREncoderConfig(**qwen_fields)))
    paths = {name: tmp_path_factory.mktemp(name) for name in ("phi", "qwen", "qwen_sharded")}
    phi.save_pretrained(paths["phi"])
    qwen.save_pretrained(paths["qwen"])
    qwen.save_pretrained(paths["qwen_sharded"], max_shard_size="20KB")
    assert (paths["qwen_sharded"] / "model.safetensors.index.json").is_file()
    return phi, qwen, paths


def test_phi4mm_audio_model_directory(saved_encoders, max_valid_diff):
    phi, _, paths = saved_encoders
    encoder = from_pretrained(paths["phi"])
    assert isinstance(encoder, Phi4MMEncoder) and not encoder.training
    assert (encoder.config.chunk_size, encoder.config.left_chunk) == (3, 1)  # the config's settings come along
    lengths = [120, 57]
    features = torch.randn(2, 120, 80)
    mask = torch.arange(120)[None] < torch.tensor(lengths)[:, None]
    with torch.no_grad():
        reference = phi(features, mask)
        outputs, output_lengths = encoder(features, lengths)
    assert max_valid_diff(outputs, reference, output_lengths.tolist()) <= TOLERANCE


@pytest.mark.parametrize("directory", ["qwen", "qwen_sharded"])
def test_qwen3_asr_encoder_directory(saved_encoders, directory):
    _, qwen, paths = saved_encoders
    encoder = from_pretrained(paths[directory])
    assert isinstance(encoder, Qwen3ASREncoder) and not encoder.training
    lengths = [1000, 250]
    features = torch.randn(2, 128, 1000)
    mask = (torch.arange(1000)[None] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        packed = qwen(features, mask).last_hidden_state
        outputs, output_lengths = encoder(features, lengths)
    rows = torch.split(packed, output_lengths.tolist())
    assert max((outputs[b, : len(row)] - row).abs().max().item() for b, row in enumerate(rows)) <= TOLERANCE


def assert_same_weights(encoder: torch.nn.Module, reference: torch.nn.Module) -> None:
    ours, theirs = encoder.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)


def test_full_phi4_multimodal_checkpoint(tmp_path, tiny_fields, randomize):
    """The audio config nested, the weights under model.embed_tokens_extend.audio_embed.encoder."""
    config = transformers.Phi4MultimodalConfig(
        vocab_size=300,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        audio_config=tiny_fields[0],
        vision_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2},
        bos_token_id=1,
        pad_token_id=1,
        eos_token_id=[2],
    )
    model = randomize(transformers.Phi4MultimodalForCausalLM(config))
    model.save_pretrained(tmp_path)
    encoder = from_pretrained(tmp_path)
    assert_same_weights(encoder, model.model.embed_tokens_extend.audio_embed.encoder)


def test_full_qwen3_asr_checkpoint(tmp_path, tiny_fields, randomize):
    """The audio config nested, the weights under model.audio_tower; bfloat16 on request."""
    text = {
        "vocab_size": 300,
        "hidden_size": 24,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 12,
    }
    model = randomize(
        transformers.Qwen3ASRForConditionalGeneration(
            transformers.Qwen3ASRConfig(audio_config=tiny_fields[1], text_config=text)
        )
    )
    model.save_pretrained(tmp_path)
    assert_same_weights(from_pretrained(tmp_path), model.model.audio_tower)
    assert next(from_pretrained(tmp_path, dtype=torch.bfloat16).parameters()).dtype == torch.bfloat16


def test_not_a_checkpoint_directory(tmp_path):
    with pytest.raises(ValueError, match="path must be a checkpoint directory with a config.json, got"):
        from_pretrained(tmp_path)


def test_other_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="model_type must be one of .* got 'bert'"):
        from_pretrained(tmp_path)


def test_no_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_asr_encoder"}))
    with pytest.raises(ValueError, match="holds neither model.safetensors nor model.safetensors.index.json"):
        from_pretrained(tmp_path)


def edit_config(directory, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))


def test_weights_that_do_not_fit_the_config(saved_encoders, tmp_path):
    _, qwen, _ = saved_encoders
    qwen.save_pretrained(tmp_path)
    edit_config(tmp_path, d_model=32)
    with pytest.raises(ValueError) as caught:
        from_pretrained(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"path {str(tmp_path)!r}: the weights do not fit the config: ")
    assert "conv_out.weight is (16, 64) in the file, (32, 64) by the config (and " in message and "\n" not in message


HEADROOM_BYTES = 512 * 2**20  # what loading a tiny checkpoint may map: far less than any absurd size asks


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"encoder_layers": 10**8}, "encoder_layers 100000000 exceeds MAX_ENCODER_BLOCKS = 128"),
        ({"d_model": 2**20, "encoder_ffn_dim": 2**20}, "encoder_ffn_dim 1048576, d_model 1048576 (beyond the released"),
        ({"max_position_embeddings": 10**9}, "max_position_embeddings 1000000000 (beyond the released model's)"),
    ],
)
def test_absurd_sizes_are_refused_before_anything_is_built(
    saved_encoders, tmp_path, changes, message, bounded_address_space
):
    _, qwen, _ = saved_encoders
    qwen.save_pretrained(tmp_path)
    edit_config(tmp_path, **changes)
    with bounded_address_space(HEADROOM_BYTES), pytest.raises(ValueError) as caught:
        from_pretrained(tmp_path)
    assert str(caught.value).startswith(f"path {str(tmp_path)!r}: ") and message in str(caught.value)


def test_weights_of_another_model(saved_encoders, tmp_path):
    phi, _, _ = saved_encoders
    phi.save_pretrained(tmp_path)
    edit_config(tmp_path, model_type="qwen3_asr_encoder")
    with pytest.raises(ValueError, match="expected the weights of one audio encoder .* found 0"):
        from_pretrained(tmp_path)
