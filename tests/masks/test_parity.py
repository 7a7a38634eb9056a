"""Parity of audiomask.masks with the upstream implementations in transformers (torch).

The only mask tests that import torch. Upstream references:
``transformers.models.phi4_multimodal.modeling_phi4_multimodal`` (``adaptive_enc_mask``,
``Phi4MultimodalAudioModel._streaming_mask`` / ``forward_embeddings`` /
``calculate_hs_mask``) and ``transformers.models.qwen3_asr.modeling_qwen3_asr``
(``_get_feat_extract_output_lengths``, ``get_audio_cu_seqlens``, the encoder's chunking).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.masks import phi4mm, qwen3_asr

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
phi4_modeling = pytest.importorskip("transformers.models.phi4_multimodal.modeling_phi4_multimodal")
qwen_modeling = pytest.importorskip("transformers.models.qwen3_asr.modeling_qwen3_asr")


def as_numpy(tensor) -> np.ndarray:
    return tensor.contiguous().numpy()


# --- Phi-4MM -----------------------------------------------------------------------------


@st.composite
def chunk_starts(draw):
    x_len = draw(st.integers(0, 60))
    return x_len, sorted(draw(st.sets(st.integers(0, x_len), max_size=x_len + 1)))


@given(case=chunk_starts(), left=st.integers(0, 8), right=st.integers(0, 8))
def test_adaptive_enc_mask_equals_upstream(case, left, right):
    x_len, starts = case
    upstream = phi4_modeling.adaptive_enc_mask(x_len, starts, left_window=left, right_window=right)
    np.testing.assert_array_equal(phi4mm.adaptive_enc_mask(x_len, starts, left, right), as_numpy(upstream))


EVAL = SimpleNamespace(training=False)  # `_streaming_mask` reads only `self.training`
upstream_chunk_sizes = st.just(-1) | st.integers(1, 70)  # upstream's arange fails on chunk_size 0


@given(
    seq_len=st.integers(1, 80), batch_size=st.integers(1, 3), chunk_size=upstream_chunk_sizes, left=st.integers(0, 20)
)
def test_streaming_mask_equals_upstream_eval_mode(seq_len, batch_size, chunk_size, left):
    upstream = phi4_modeling.Phi4MultimodalAudioModel._streaming_mask(EVAL, seq_len, batch_size, chunk_size, left)
    np.testing.assert_array_equal(phi4mm.streaming_mask(seq_len, batch_size, chunk_size, left), as_numpy(upstream))


@pytest.fixture(scope="module")
def tiny_phi4_audio():
    """A Phi4MultimodalAudioModel small enough to run its conv subsampling per example."""
    from transformers import Phi4MultimodalAudioConfig

    config = Phi4MultimodalAudioConfig(
        hidden_size=16,
        intermediate_size=16,
        num_blocks=1,
        num_attention_heads=2,
        ext_pw_out_channel=16,
        depthwise_separable_out_channel=16,
        nemo_conv_channels=4,
    )
    torch.manual_seed(0)
    return phi4_modeling.Phi4MultimodalAudioModel(config).eval()


@st.composite
def frame_lengths(draw):
    lengths = draw(st.lists(st.integers(1, 120), min_size=1, max_size=3))
    return lengths, max(lengths) + draw(st.integers(0, 17))


@settings(max_examples=60)  # each example runs upstream's conv subsampling
@given(case=frame_lengths(), chunk_size=upstream_chunk_sizes, left=st.integers(0, 6))
def test_hs_mask_equals_upstream_forward_embeddings(tiny_phi4_audio, case, chunk_size, left):
    lengths, max_frames = case
    model = tiny_phi4_audio
    model.config.chunk_size, model.config.left_chunk = chunk_size, left
    features = torch.randn(len(lengths), max_frames, model.config.input_size)
    frame_mask = torch.arange(max_frames)[None, :] < torch.tensor(lengths)[:, None]
    with torch.no_grad():
        _, upstream, _ = model.forward_embeddings(features, frame_mask)
    ours = phi4mm.hs_mask(lengths, max_frames, chunk_size, left, model.config.time_reduction)
    np.testing.assert_array_equal(ours, as_numpy(upstream))


@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=4),
    extra=st.integers(0, 10),
    chunk_size=upstream_chunk_sizes,
    left=st.integers(0, 6),
)
def test_hs_mask_equals_upstream_calculate_hs_mask(lengths, extra, chunk_size, left):
    # calculate_hs_mask takes a mask already in tokens: our time_reduction=1 case.
    seq_len = max(lengths) + extra
    if seq_len == 0:
        return
    model = SimpleNamespace(training=False, config=SimpleNamespace(chunk_size=chunk_size, left_chunk=left))
    model._streaming_mask = lambda *args: phi4_modeling.Phi4MultimodalAudioModel._streaming_mask(model, *args)
    hidden = torch.zeros(len(lengths), seq_len, 1)
    token_mask = torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]
    upstream = phi4_modeling.Phi4MultimodalAudioModel.calculate_hs_mask(model, hidden, "cpu", token_mask)
    ours = phi4mm.hs_mask(lengths, seq_len, chunk_size, left, time_reduction=1)
    np.testing.assert_array_equal(ours, as_numpy(upstream))


@given(lengths=st.lists(st.integers(0, 10**5), min_size=1, max_size=6))
def test_subsampled_lengths_equal_upstream_padding_length(lengths):
    upstream = torch.ceil(torch.tensor(lengths) / phi4mm.TIME_REDUCTION)  # NemoConvSubsampling.forward
    np.testing.assert_array_equal(phi4mm.subsampled_lengths(lengths), as_numpy(upstream).astype(np.int64))


# --- Qwen3-ASR -----------------------------------------------------------------------------


def upstream_chunk_layout(lengths, n_window):
    """Qwen3ASREncoder.forward's padded chunk lengths: (batch * num_chunks,), zeros for padding chunks."""
    chunk = 2 * n_window
    padded = max(1, math.ceil(max(lengths) / chunk)) * chunk
    frame_mask = (torch.arange(padded)[None, :] < torch.tensor(lengths)[:, None]).long()
    return frame_mask.view(len(lengths), padded // chunk, chunk).sum(dim=-1).reshape(-1)


feature_lens = st.lists(st.integers(0, 5000), min_size=1, max_size=6)


@given(lengths=feature_lens)
def test_output_lengths_equal_upstream(lengths):
    upstream = qwen_modeling._get_feat_extract_output_lengths(torch.tensor(lengths))
    np.testing.assert_array_equal(qwen3_asr.output_lengths(lengths), as_numpy(upstream))
    upstream = qwen_modeling._get_feat_extract_output_lengths(torch.tensor(lengths), n_window=50)
    np.testing.assert_array_equal(qwen3_asr.output_lengths(lengths, n_window=50), as_numpy(upstream))


@given(lengths=feature_lens, n_window=st.integers(1, 80))
def test_chunks_and_tokens_equal_upstream_encoder_packing(lengths, n_window):
    # The encoder's own chunking and valid-token selection, for any n_window
    # (upstream's length helper hard-codes 13 tokens per chunk; the encoder does not).
    chunks = upstream_chunk_layout(lengths, n_window)
    np.testing.assert_array_equal(qwen3_asr.chunk_lengths(lengths, n_window), as_numpy(chunks[chunks > 0]))
    tokens = qwen_modeling.Qwen3ASREncoder._post_cnn_length(chunks)
    time_steps = int(qwen3_asr.output_lengths([2 * n_window], n_window)[0])  # conv output width of a full chunk
    valid = torch.arange(time_steps)[None, :] < tokens[:, None]
    per_utterance = valid.view(len(lengths), -1).sum(dim=-1)
    np.testing.assert_array_equal(qwen3_asr.output_lengths(lengths, n_window), as_numpy(per_utterance))
    ours = qwen3_asr.padded_mask_after_cnn(lengths, n_window)
    np.testing.assert_array_equal(ours, as_numpy(valid[chunks > 0])[:, : ours.shape[1]])
    assert not as_numpy(valid)[:, ours.shape[1] :].any()


@given(lengths=feature_lens, ratio=st.integers(1, 16))
def test_cu_seqlens_equal_upstream(lengths, ratio):
    if not any(lengths):
        return  # upstream divides by zero when every utterance is empty
    n_window_infer = 100 * ratio
    upstream = qwen_modeling.get_audio_cu_seqlens(
        upstream_chunk_layout(lengths, 50), torch.tensor(lengths), n_window_infer, 50
    )
    ours = qwen3_asr.cu_seqlens(lengths, n_window_infer=n_window_infer)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, as_numpy(upstream))
    # The dense mask is the block diagonal of upstream's windows (its non-varlen path splits by them).
    if ours[-1] <= 600:
        blocks = [torch.ones(int(w), int(w), dtype=torch.bool) for w in torch.diff(upstream)]
        np.testing.assert_array_equal(
            qwen3_asr.window_mask(lengths, n_window_infer=n_window_infer), as_numpy(torch.block_diag(*blocks))
        )
