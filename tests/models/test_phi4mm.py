"""audiomask.models.phi4mm: parity with transformers' Phi4MultimodalAudioModel, mask modes, NaN-freedom, checks.

Weights are random (every parameter and buffer, so the GLU biases and the
mean/variance buffers take part) and copied from the transformers model with
``load_state_dict``. Upstream is called with ``mask = arange(T) < lengths``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from audiomask.masks import phi4mm as phi4mm_masks
from audiomask.models import Phi4MMAudioConfig
from audiomask.models.phi4mm import SUBSAMPLING_LOOKAHEAD_FRAMES, UNFOLD_TOKENS

TOLERANCE = 1e-4  # float32 on CPU
MEL = 80


@pytest.fixture(scope="module")
def upstream(tiny_phi4mm, randomize):
    """A tiny transformers model with random weights, and ours with the same weights."""
    transformers = pytest.importorskip("transformers")
    ours = tiny_phi4mm()
    config = transformers.Phi4MultimodalAudioConfig(**dataclasses.asdict(ours.config))
    model = randomize(transformers.Phi4MultimodalAudioModel(config))
    ours.load_state_dict(model.state_dict())  # same names and shapes: loads as it is
    return model, ours


def run_upstream(model, features: torch.Tensor, lengths: list[int], chunk_size: int, left_chunk: int) -> torch.Tensor:
    """Upstream output; over 500 tokens one row at a time (its unfold fails for B > 1 in transformers 5.24:
    ``unfold_tensor`` calls ``view`` on a permuted tensor). Rows are independent upstream, so this is exact."""
    model.config.chunk_size, model.config.left_chunk = chunk_size, left_chunk
    mask = torch.arange(features.shape[1])[None] < torch.tensor(lengths)[:, None]
    rows = (
        [slice(None)] if -(-features.shape[1] // 8) <= UNFOLD_TOKENS else [slice(b, b + 1) for b in range(len(lengths))]
    )
    with torch.no_grad():
        return torch.cat([model(features[row], mask[row]) for row in rows])


CHUNKINGS = [(-1, 18), (3, 1), (4, 0), (2, 30)]  # (chunk_size, left_chunk); -1: full attention
BATCHES = {
    "ragged": (97, [97, 50, 3, 1]),  # ends mid-token; a 1-frame utterance
    "unfold": (8 * 520 + 3, [8 * 520 + 3, 8 * 510, 4000]),  # > 500 tokens: 2 blocks, keys of block 2 partly padded
}


@pytest.mark.parity
@pytest.mark.parametrize(("chunk_size", "left_chunk"), CHUNKINGS)
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_compat_mode_equals_transformers(upstream, max_valid_diff, batch, chunk_size, left_chunk):
    model, ours = upstream
    frames, lengths = BATCHES[batch]
    features = torch.randn(len(lengths), frames, MEL, generator=torch.Generator().manual_seed(1))
    reference = run_upstream(model, features, lengths, chunk_size, left_chunk)
    with torch.no_grad():
        outputs, output_lengths = ours(features, lengths, chunk_size=chunk_size, left_chunk=left_chunk)
    assert outputs.shape == reference.shape
    assert output_lengths.dtype == torch.int64
    assert output_lengths.tolist() == [-(-n // 8) for n in lengths]
    assert max_valid_diff(outputs, reference, output_lengths.tolist()) <= TOLERANCE


def test_state_dict_matches_transformers(upstream):
    model, ours = upstream
    theirs = model.state_dict()
    assert {name: tuple(t.shape) for name, t in ours.state_dict().items()} == {
        name: tuple(t.shape) for name, t in theirs.items()
    }


def test_config_defaults_equal_transformers():
    transformers = pytest.importorskip("transformers")
    reference = transformers.Phi4MultimodalAudioConfig()
    ours = Phi4MMAudioConfig()
    for field in (field.name for field in dataclasses.fields(ours)):  # not its ClassVars
        assert getattr(ours, field) == getattr(reference, field), field
    assert ours.nemo_final_size == reference.nemo_final_size


def test_chunk_settings_default_to_the_config(tiny_phi4mm):
    encoder = tiny_phi4mm(chunk_size=2, left_chunk=1)
    features = torch.randn(2, 60, MEL)
    with torch.no_grad():
        default, _ = encoder(features, [60, 33], mask_mode="hard")
        explicit, _ = encoder(features, [60, 33], chunk_size=2, left_chunk=1, mask_mode="hard")
        full, _ = encoder(features, [60, 33], chunk_size=-1, mask_mode="hard")
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)
    assert not torch.allclose(default, full)


def test_hard_equals_compat_for_one_unpadded_utterance_with_full_attention(tiny_phi4mm):
    """With every key valid, compat's +1 on all keys shifts every logit alike: the modes agree."""
    encoder = tiny_phi4mm()
    features = torch.randn(1, 203, MEL)
    with torch.no_grad():
        hard, _ = encoder(features, [203], chunk_size=-1, mask_mode="hard")
        compat, _ = encoder(features, [203], chunk_size=-1, mask_mode="phi4mm_compat")
    assert (hard - compat).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize(("chunk_size", "left_chunk"), [(-1, 0), (3, 1)])
def test_hard_mode_encodes_each_utterance_as_if_alone(tiny_phi4mm, chunk_size, left_chunk):
    """Batch padding (any values) changes nothing in hard mode: each row equals its utterance encoded alone."""
    encoder = tiny_phi4mm()
    lengths = [150, 61, 8, 13]
    features = torch.randn(len(lengths), 150, MEL) * 5  # the padding holds noise, not zeros
    with torch.no_grad():
        batch, batch_lengths = encoder(
            features, lengths, chunk_size=chunk_size, left_chunk=left_chunk, mask_mode="hard"
        )
        for row, length in enumerate(lengths):
            alone, _ = encoder(
                features[row : row + 1, :length],
                [length],
                chunk_size=chunk_size,
                left_chunk=left_chunk,
                mask_mode="hard",
            )
            tokens = batch_lengths[row].item()
            assert (batch[row, :tokens] - alone[0]).abs().max().item() <= TOLERANCE


def test_only_compat_mode_unfolds_long_inputs(tiny_phi4mm):
    """Over 500 tokens compat cuts the sequence into independent blocks, hard attends across the boundary."""
    encoder = tiny_phi4mm()
    frames = 8 * 510
    features = torch.randn(1, frames, MEL)
    with torch.no_grad():
        hard, _ = encoder(features, [frames], chunk_size=-1, mask_mode="hard")
        compat, _ = encoder(features, [frames], chunk_size=-1, mask_mode="phi4mm_compat")
        # compat's first block sees nothing of the rest: it equals compat on the first 500 tokens alone
        block, _ = encoder(features[:, : 8 * UNFOLD_TOKENS], [8 * UNFOLD_TOKENS], chunk_size=-1)
    assert (compat[:, :UNFOLD_TOKENS] - block).abs().max().item() <= TOLERANCE
    assert (hard - compat).abs().max().item() > 10 * TOLERANCE


def test_subsampling_lookahead(tiny_phi4mm):
    """Token t reads frames [8t - 7, 8t + 7] only: nothing after its own 8 frames (lookahead 0)."""
    encoder = tiny_phi4mm(nemo_conv_channels=32)  # enough channels that ReLU never cuts every path
    reduction = encoder.config.time_reduction
    assert SUBSAMPLING_LOOKAHEAD_FRAMES == 0
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(1, 12 * reduction, MEL, generator=generator)
    with torch.no_grad():
        base = encoder.embed(features)
        for token in (0, 5, 11):
            last = token * reduction + reduction - 1 + SUBSAMPLING_LOOKAHEAD_FRAMES
            first = max(token * reduction - (reduction - 1), 0)
            outside = features.clone()
            outside[:, last + 1 :] += 1
            outside[:, :first] += 1
            torch.testing.assert_close(encoder.embed(outside)[:, token], base[:, token], rtol=0, atol=0)
            for edge in {first, last}:
                inside = features.clone()
                inside[:, edge] += torch.randn(MEL, generator=generator)
                assert not torch.equal(encoder.embed(inside)[:, token], base[:, token])


@pytest.mark.parametrize("mask_mode", ["hard", "phi4mm_compat"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fully_masked_rows_stay_finite(tiny_phi4mm, mask_mode, dtype):
    """Padded query rows whose chunk holds no valid key, and empty utterances: finite outputs, no NaN."""
    encoder = tiny_phi4mm().to(dtype)
    lengths = [200, 0, 9, 1]
    features = torch.randn(len(lengths), 200, MEL, dtype=dtype)
    with torch.no_grad():
        outputs, output_lengths = encoder(features, lengths, chunk_size=2, left_chunk=0, mask_mode=mask_mode)
    assert output_lengths.tolist() == [25, 0, 2, 1]
    assert torch.isfinite(outputs).all()


def test_all_empty_batch(tiny_phi4mm):
    encoder = tiny_phi4mm()
    with torch.no_grad():
        outputs, lengths = encoder(torch.zeros(2, 0, MEL), [0, 0], mask_mode="hard")
        padded, padded_lengths = encoder(torch.zeros(2, 16, MEL), [0, 0], mask_mode="hard")
    assert outputs.shape == (2, 0, 16) and lengths.tolist() == [0, 0]
    assert padded.shape == (2, 2, 16) and torch.isfinite(padded).all() and padded_lengths.tolist() == [0, 0]


def test_lengths_as_tensor_numpy_or_list(tiny_phi4mm):
    encoder = tiny_phi4mm()
    features = torch.randn(2, 40, MEL)
    with torch.no_grad():
        results = [encoder(features, lengths)[0] for lengths in ([40, 17], np.array([40, 17]), torch.tensor([40, 17]))]
    for result in results[1:]:
        torch.testing.assert_close(result, results[0], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mask_mode": "soft"}, "mask_mode must be one of"),
        ({"chunk_size": 2.5}, "chunk_size must be an integer, got 2.5"),
        ({"left_chunk": -1}, "left_chunk must be >= 0, got -1"),
        ({"feature_lengths": [41, 3]}, r"feature_lengths must be <= T \(features.shape\[1\]\) \(40\), got 41"),
        ({"feature_lengths": [40]}, r"feature_lengths must have 2 entries \(features.shape\[0\]\), got 1"),
        ({"features": torch.zeros(2, 40, 81)}, r"features must have shape \(B, T, 80\), got \(2, 40, 81\)"),
    ],
)
def test_bad_arguments(tiny_phi4mm, kwargs, message):
    encoder = tiny_phi4mm()
    call = {"features": torch.zeros(2, 40, MEL), "feature_lengths": [40, 3], **kwargs}
    with pytest.raises(ValueError, match=message):
        encoder(call.pop("features"), call.pop("feature_lengths"), **call)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"time_reduction": 6}, "time_reduction must be a power of 2 >= 2, got 6"),
        ({"ext_pw_out_channel": 8}, r"ext_pw_out_channel must equal hidden_size \(16\), got 8"),
        ({"num_attention_heads": 3}, r"hidden_size \(16\) must be a multiple of num_attention_heads, got 3"),
        ({"num_blocks": 0}, "num_blocks must be >= 1, got 0"),
        ({"activation": "mish"}, "activation must be one of"),
    ],
)
def test_bad_config(tiny_phi4mm, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_phi4mm(**overrides)


def test_config_from_dict_ignores_fields_it_does_not_use(tiny_phi4mm):
    fields = dataclasses.asdict(tiny_phi4mm().config)
    config = Phi4MMAudioConfig.from_dict({**fields, "dropout_rate": 0.1, "architectures": ["X"], "model_type": "m"})
    assert config == Phi4MMAudioConfig(**fields)


def block_masks(lengths: list[int], frames: int, chunk_size: int, left_chunk: int) -> np.ndarray:
    """The compat mode's masks of upstream's 500-token blocks, ``(B * n, l, l)``, from the host builders."""
    tokens = phi4mm_masks.subsampled_lengths(lengths)
    length = -(-frames // 8)
    block = min(length, UNFOLD_TOKENS)
    starts = block * np.arange(-(-length // block))
    block_lengths = np.clip(tokens[:, None] - starts, 0, block).reshape(-1)
    return phi4mm_masks.hs_mask(block_lengths, block, chunk_size, left_chunk, time_reduction=1)


@pytest.mark.parametrize(("mask_mode", "frames"), [("hard", 97), ("phi4mm_compat", 97), ("phi4mm_compat", 8 * 510)])
def test_device_lengths_and_given_masks_equal_the_host_path(tiny_phi4mm, mask_mode, frames):
    """Lengths on the encoder's device (here the CPU: a tensor) and masks built by the caller give the outputs
    of host lengths, bit for bit: the same masks, built elsewhere."""
    encoder = tiny_phi4mm()
    lengths = [frames, frames // 2, 3]
    features = torch.randn(len(lengths), frames, MEL, generator=torch.Generator().manual_seed(4))
    settings = {"chunk_size": 3, "left_chunk": 1, "mask_mode": mask_mode}
    if mask_mode == "hard":
        mask = phi4mm_masks.hs_mask(lengths, frames, 3, 1)
    else:
        mask = block_masks(lengths, frames, 3, 1)
    with torch.no_grad():
        reference, reference_lengths = encoder(features, lengths, **settings)
        for feature_lengths, given in [
            (torch.tensor(lengths, dtype=torch.int32), None),  # device lengths: masks built with torch
            (lengths, mask),  # a host mask
            (torch.tensor(lengths), torch.from_numpy(mask)),  # both on the device
        ]:
            outputs, output_lengths = encoder(features, feature_lengths, mask=given, **settings)
            torch.testing.assert_close(outputs, reference, rtol=0, atol=0)
            assert output_lengths.dtype == torch.int64 and output_lengths.tolist() == reference_lengths.tolist()


def test_a_given_mask_replaces_the_chunk_settings(tiny_phi4mm):
    """Full attention given as a mask under chunk settings that say otherwise: the full-attention outputs."""
    encoder = tiny_phi4mm()
    lengths = [90, 41]
    features = torch.randn(2, 90, MEL)
    full = phi4mm_masks.hs_mask(lengths, 90, chunk_size=-1, left_chunk=0)
    with torch.no_grad():
        chunked, _ = encoder(features, lengths, chunk_size=2, left_chunk=0, mask_mode="hard")
        unchunked, _ = encoder(features, lengths, chunk_size=-1, mask_mode="hard")
        given, _ = encoder(features, lengths, chunk_size=2, left_chunk=0, mask_mode="hard", mask=full)
    torch.testing.assert_close(given, unchunked, rtol=0, atol=0)
    assert not torch.allclose(given, chunked)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mask": np.ones((2, 4, 4), bool)}, r"mask must be a bool array or tensor of shape \(2, 5, 5\) .*\(2, 4, 4\)"),
        ({"mask": np.ones((2, 5, 5), np.int64)}, r"mask must be a bool array or tensor of shape \(2, 5, 5\)"),
        ({"mask": [[True]]}, r"mask must be a bool array or tensor of shape \(2, 5, 5\) .*got list"),
        ({"feature_lengths": torch.tensor([[40, 3]])}, "feature_lengths must be a 1-D integer tensor"),
        ({"feature_lengths": torch.tensor([40.0, 3.0])}, "feature_lengths must be a 1-D integer tensor"),
        (
            {"feature_lengths": torch.tensor([41, 3])},
            r"feature_lengths must be <= T \(features.shape\[1\]\) \(40\), got 41",
        ),
        (
            {"feature_lengths": torch.tensor([40])},
            r"feature_lengths must have 2 entries \(features.shape\[0\]\), got 1",
        ),
        ({"feature_lengths": torch.tensor([40, 3], device="meta")}, r"on the host or on the encoder's device \(cpu\)"),
    ],
)
def test_bad_masks_and_device_lengths(tiny_phi4mm, kwargs, message):
    encoder = tiny_phi4mm()
    call = {"features": torch.zeros(2, 40, MEL), "feature_lengths": [40, 3], "mask_mode": "hard", **kwargs}
    with pytest.raises(ValueError, match=message):
        encoder(call.pop("features"), call.pop("feature_lengths"), **call)
