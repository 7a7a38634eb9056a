"""audiomask.models.qwen3_asr: parity with transformers' Qwen3ASREncoder (sdpa and eager), windows, checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from audiomask.masks import qwen3_asr
from audiomask.models import Qwen3ASRConfig

TOLERANCE = 1e-4  # float32 on CPU
MEL = 128


@pytest.fixture(scope="module")
def upstream(tiny_qwen3_asr, randomize):
    transformers = pytest.importorskip("transformers")
    ours = tiny_qwen3_asr()
    config = transformers.Qwen3ASREncoderConfig(**dataclasses.asdict(ours.config))
    model = randomize(transformers.Qwen3ASREncoder(config))
    ours.load_state_dict(model.state_dict())
    return model, ours


def unpack(packed: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """transformers' packed tokens ``(sum N_b, D)`` -> ``(B, N_max, D)`` zero-padded."""
    rows = torch.split(packed, lengths)
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True)


BATCHES = {
    "one_window": (300, [300, 250, 50, 0]),  # remainders of 50 frames (7 tokens); an empty utterance
    "windows": (2100, [2100, 1234, 900, 130]),  # 273 tokens: windows 104 + 104 + 65; a window ending mid-chunk
}


@pytest.mark.parity
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_equals_transformers(upstream, max_valid_diff, batch, attention):
    """Both of transformers' attention paths attend window by window (5.24 splits by cu_seqlens)."""
    model, ours = upstream
    model.config._attn_implementation = attention
    frames, lengths = BATCHES[batch]
    features = torch.randn(len(lengths), MEL, frames, generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(frames)[None] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        packed = model(features, mask).last_hidden_state
        outputs, output_lengths = ours(features, lengths)
    expected_lengths = qwen3_asr.output_lengths(lengths).tolist()
    assert output_lengths.tolist() == expected_lengths
    assert outputs.shape == (len(lengths), max(expected_lengths), ours.config.d_model)
    assert max_valid_diff(outputs, unpack(packed, expected_lengths), expected_lengths) <= TOLERANCE
    assert torch.isfinite(outputs).all()  # padding rows and the empty utterance's windows included


def test_state_dict_matches_transformers(upstream):
    model, ours = upstream
    assert {n: tuple(t.shape) for n, t in ours.state_dict().items()} == {
        n: tuple(t.shape) for n, t in model.state_dict().items()
    }
    torch.testing.assert_close(ours.positional_embedding, model.positional_embedding.positional_embedding)


def test_config_defaults_equal_transformers():
    transformers = pytest.importorskip("transformers")
    reference = transformers.Qwen3ASREncoderConfig()
    ours = Qwen3ASRConfig()
    for field in (field.name for field in dataclasses.fields(ours)):  # not its ClassVars
        assert getattr(ours, field) == getattr(reference, field), field
    assert (ours.chunk_frames, ours.chunk_tokens, ours.window_tokens) == (
        qwen3_asr.CHUNK_FRAMES,
        qwen3_asr.TOKENS_PER_CHUNK,
        qwen3_asr.WINDOW_TOKENS,
    )


def test_windows_do_not_see_each_other(tiny_qwen3_asr):
    """Changing frames of the second window changes nothing in the first window's outputs."""
    encoder = tiny_qwen3_asr()
    features = torch.randn(1, MEL, 1700)
    changed = features.clone()
    changed[:, :, 800:] += 1
    with torch.no_grad():
        before, _ = encoder(features, [1700])
        after, _ = encoder(changed, [1700])
    window = qwen3_asr.WINDOW_TOKENS
    torch.testing.assert_close(after[:, :window], before[:, :window], rtol=0, atol=0)
    assert not torch.allclose(after[:, window:], before[:, window:])


def test_frames_not_a_multiple_of_the_chunk_are_zero_padded(tiny_qwen3_asr):
    encoder = tiny_qwen3_asr()
    features = torch.randn(2, MEL, 237)
    with torch.no_grad():
        outputs, lengths = encoder(features, [237, 120])
        padded, _ = encoder(torch.nn.functional.pad(features, (0, 63)), [237, 120])
    torch.testing.assert_close(outputs, padded[:, : outputs.shape[1]], rtol=0, atol=0)
    assert lengths.tolist() == qwen3_asr.output_lengths([237, 120]).tolist()


def test_empty_batch_rows(tiny_qwen3_asr):
    encoder = tiny_qwen3_asr()
    with torch.no_grad():
        outputs, lengths = encoder(torch.zeros(2, MEL, 0), [0, 0])
    assert outputs.shape == (2, 0, 16) and lengths.tolist() == [0, 0]


@pytest.mark.parametrize(
    ("features", "lengths", "message"),
    [
        (torch.zeros(2, 80, 100), [100, 100], r"features must have shape \(B, 128, T\), got \(2, 80, 100\)"),
        (torch.zeros(2, MEL, 100), [101, 1], r"feature_lengths must be <= T \(features.shape\[2\]\) \(100\), got 101"),
        (torch.zeros(2, MEL, 100), [1, 2, 3], r"feature_lengths must have 2 entries"),
    ],
)
def test_bad_arguments(tiny_qwen3_asr, features, lengths, message):
    with pytest.raises(ValueError, match=message):
        tiny_qwen3_asr()(features, lengths)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_window_infer": 750}, r"n_window_infer must be a multiple of 2 \* n_window \(100\), got 750"),
        ({"max_position_embeddings": 12}, r"max_position_embeddings must be >= the tokens of a chunk \(13\), got 12"),
        ({"d_model": 15, "encoder_attention_heads": 3}, "d_model must be even"),
        ({"d_model": 2, "encoder_attention_heads": 1}, "d_model must be even and >= 4"),
        ({"activation_function": "nope"}, "activation_function must be one of"),
    ],
)
def test_bad_config(tiny_qwen3_asr, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_qwen3_asr(**overrides)


def test_device_lengths_equal_host_lengths(tiny_qwen3_asr):
    """Lengths on the encoder's device (here the CPU: a tensor): the same tokens; the width is that of T frames
    (the longest length is not read back)."""
    encoder = tiny_qwen3_asr()
    lengths = [1234, 900, 130]
    features = torch.randn(3, MEL, 1500)
    with torch.no_grad():
        reference, reference_lengths = encoder(features, lengths)
        outputs, output_lengths = encoder(features, torch.tensor(lengths))
    assert output_lengths.tolist() == reference_lengths.tolist() == qwen3_asr.output_lengths(lengths).tolist()
    assert (
        reference.shape[1] == max(reference_lengths.tolist()) < outputs.shape[1] == qwen3_asr.output_lengths([1500])[0]
    )
    torch.testing.assert_close(outputs[:, : reference.shape[1]], reference, rtol=0, atol=0)


def test_conv_chunks_in_bounded_calls_equal_one_call(tiny_qwen3_asr, monkeypatch):
    """The conv stack runs over at most CONV_CHUNKS_PER_CALL chunks at once; the tokens are those of one call."""
    from audiomask.models import qwen3_asr as module

    encoder = tiny_qwen3_asr()
    chunks = torch.randn(7, encoder.config.num_mel_bins, encoder.config.chunk_frames, generator=torch.manual_seed(4))
    with torch.no_grad():
        whole = encoder.embed_chunks(chunks)
        monkeypatch.setattr(module, "CONV_CHUNKS_PER_CALL", 3)
        calls = []
        first = module.convs.patch_conv  # the stack's first conv: each call's chunks counted
        monkeypatch.setattr(
            module.convs,
            "patch_conv",
            lambda conv, hidden, **options: calls.append(len(hidden)) or first(conv, hidden, **options),
        )
        split = encoder.embed_chunks(chunks)
    assert calls == [3, 3, 1]
    # The kernels' rounding: the conv kernel a batch of 3 chunks gets may differ from one of 7 (on AMD CPUs it
    # does) and round a few float32 ulps apart.
    torch.testing.assert_close(split, whole, rtol=2e-6, atol=1e-6)
