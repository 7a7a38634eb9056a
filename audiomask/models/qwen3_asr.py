"""The Qwen3-ASR audio encoder, weight-compatible with transformers' ``Qwen3ASREncoder``.

Mirrors ``transformers.models.qwen3_asr.modeling_qwen3_asr.Qwen3ASREncoder``
(same parameter names and shapes). For ``features`` ``(B, 128, T)`` (log-mel,
10 ms frames):

1. the frames of each utterance are cut into conv chunks of ``2 * n_window``
   frames (100); each chunk goes through three 3x3 stride-2 conv2d + GELU on
   its own (100 -> 13 steps) and a linear layer, and gets the sinusoidal
   positions ``0 .. 12`` (positions restart in every chunk);
2. the tokens of each utterance (13 per full chunk, the conv length of the
   remainder after them) are cut into attention windows of
   ``13 * n_window_infer / (2 * n_window)`` tokens (104), restarting at every
   utterance; transformer layers (pre-LayerNorm, GELU MLP) attend
   bidirectionally inside each window and never across;
3. a final LayerNorm (``ln_post``). The projection to the language model's
   width (``output_dim``) is not part of transformers' encoder (it is
   ``Qwen3ASRModel.multi_modal_projector``), so it is not part of this one.

Windows without varlen attention: transformers packs the tokens of all
utterances and attends window by window; here each utterance's tokens stay
in its padded row, so its windows are aligned blocks of 104 tokens, and all
windows of the batch are attended at once as a batch of windows, padding
keys excluded with a ``finfo.min`` bias built from the lengths (a numpy
padding mask moved, or compared on the device where the lengths are there).
Same windows, one kernel call, static shapes. The windows are fixed by the
config, so the key padding is the only mask: there is no mask argument.

Padding: as upstream, the last chunk of an utterance is encoded with
whatever the input holds after the utterance's end; inputs with ``T`` not a
multiple of 100 are zero-padded (upstream refuses them).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiomask.models import convs
from audiomask.models.attention import attend, may_attend_to_additive_bias, split_heads
from audiomask.models.config import Qwen3ASRConfig, conv_size
from audiomask.models.layers import (
    activation,
    batch_lengths,
    joined_projections,
    lengths_on,
    model_input,
    valid_positions,
)

__all__ = ["Qwen3ASRConfig", "Qwen3ASREncoder"]

MAX_TIMESCALE = 10_000  # of the sinusoidal positions, as Whisper's
# Conv chunks per call of the conv stack: its activations take ~7 MB a chunk (480 channels of 64 x 50 steps
# after the first conv, GELU'd, bf16), so a call over 10,000 streams' chunks would need ~70 GB at once.
CONV_CHUNKS_PER_CALL = 1024


def _sinusoids(length: int, channels: int) -> torch.Tensor:
    """``(length, channels)`` Whisper positions: ``sin`` then ``cos`` of geometric frequencies, float32."""
    log_increment = math.log(MAX_TIMESCALE) / (channels // 2 - 1)
    inverse_timescales = torch.exp(-log_increment * torch.arange(channels // 2).float())
    scaled_time = torch.arange(length)[:, None] * inverse_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class _Attention(nn.Module):
    def __init__(self, config: Qwen3ASRConfig) -> None:
        super().__init__()
        self.num_heads = config.encoder_attention_heads
        dim = config.d_model
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, hidden: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``hidden`` ``(N, W, D)`` (N windows), ``bias`` ``(N, 1, 1, W)`` or ``None`` (every key valid)."""
        weight, bias_qkv = joined_projections(self, (self.q_proj, self.k_proj, self.v_proj))
        # One GEMM for queries, keys and values.
        query, key, value = (
            split_heads(part, self.num_heads) for part in F.linear(hidden, weight, bias_qkv).chunk(3, dim=-1)
        )
        return self.out_proj(attend(query, key, value, bias))


class _EncoderLayer(nn.Module):
    def __init__(self, config: Qwen3ASRConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.activation_fn = activation(config.activation_function, "activation_function")
        self.fc1 = nn.Linear(config.d_model, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, hidden: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.self_attn_layer_norm(hidden), bias)
        hidden = hidden + self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(hidden))))
        if hidden.dtype == torch.float16:  # as upstream: keep float16 activations off infinity
            limit = torch.finfo(hidden.dtype).max - 1000
            hidden = hidden.clamp(-limit, limit)
        return hidden


class Qwen3ASREncoder(nn.Module):
    """Qwen3-ASR audio encoder: features ``(B, 128, T)`` -> tokens ``(B, N_max, d_model)``, windows of 104.

    >>> config = Qwen3ASRConfig(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=8, d_model=8,
    ...                         downsample_hidden_size=2)
    >>> encoder = Qwen3ASREncoder(config).eval()
    >>> outputs, lengths = encoder(torch.randn(2, 128, 1000), [1000, 250])
    >>> tuple(outputs.shape), lengths.tolist()
    ((2, 130, 8), [130, 33])
    """

    def __init__(self, config: Qwen3ASRConfig) -> None:
        super().__init__()
        self.config = config
        channels = config.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, channels, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(channels, channels, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(channels, channels, 3, 2, padding=1)
        self.conv_out = nn.Linear(channels * conv_size(config.num_mel_bins), config.d_model, bias=False)
        # Not in the state dict (upstream's buffer is not persistent either): computed, as upstream.
        self.register_buffer(
            "positional_embedding", _sinusoids(config.max_position_embeddings, config.d_model), persistent=False
        )
        self.layers = nn.ModuleList(_EncoderLayer(config) for _ in range(config.encoder_layers))
        self.ln_post = nn.LayerNorm(config.d_model)

    @property
    def output_size(self) -> int:
        """``D``, the width of the output tokens (``d_model``)."""
        return self.config.d_model

    def output_lengths(self, feature_lengths: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """Tokens per utterance of ``feature_lengths`` frames ``(B,)`` (int64, on the host or a device).

        13 per full chunk plus the conv length of the remainder, as
        :func:`audiomask.masks.qwen3_asr.output_lengths`; computed where the lengths are.

        >>> Qwen3ASREncoder(Qwen3ASRConfig(encoder_layers=1, d_model=8, encoder_attention_heads=2,
        ...     encoder_ffn_dim=8, downsample_hidden_size=2)).output_lengths(np.array([50, 250, 0]))
        array([ 7, 33,  0])
        """
        chunk_frames = self.config.chunk_frames
        return (feature_lengths // chunk_frames) * self.config.chunk_tokens + conv_size(feature_lengths % chunk_frames)

    def embed_chunks(self, chunks: torch.Tensor) -> torch.Tensor:
        """Conv chunks ``(N, num_mel_bins, chunk_frames)`` -> tokens ``(N, chunk_tokens, d_model)`` with positions.

        At most :data:`CONV_CHUNKS_PER_CALL` chunks go through the conv stack at once (each chunk is
        convolved on its own, so the split changes no value beyond the kernels' rounding).
        """
        if len(chunks) > CONV_CHUNKS_PER_CALL:
            return torch.cat([self.embed_chunks(part) for part in chunks.split(CONV_CHUNKS_PER_CALL)])
        hidden = chunks.unsqueeze(1)  # (N, 1, mel bins, time)
        hidden = convs.patch_conv(self.conv2d1, hidden, activation="gelu")  # channels-last (audiomask.models.convs)
        for conv in (self.conv2d2, self.conv2d3):
            hidden = convs.conv_activation(conv, hidden, "gelu")
        count, channels, bins, steps = hidden.shape
        hidden = self.conv_out(hidden.permute(0, 3, 1, 2).reshape(count, steps, channels * bins))
        return hidden + self.positional_embedding[:steps].to(hidden.dtype)

    def encode_windows(self, windows: torch.Tensor, lengths: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Attention layers and ``ln_post`` over windows ``(N, W, D)`` whose first ``lengths[n]`` tokens are real.

        ``lengths`` ``(N,)`` int64 on the host or on the windows' device. Each
        window attends only to its own real tokens (a window without any gives
        finite padding). Returns ``(N, W, D)``.
        """
        if isinstance(lengths, np.ndarray) and (lengths == windows.shape[1]).all():
            bias = None  # every window full: nothing to exclude, and SDPA may take its fused kernels
        else:
            key_valid = valid_positions(lengths, windows.shape[1], windows.device)
            bias = may_attend_to_additive_bias(key_valid, windows.dtype)[:, None, None, :]
        for layer in self.layers:
            windows = layer(windows, bias)
        return self.ln_post(windows)

    def attend_windows(
        self, tokens: torch.Tensor, token_lengths: np.ndarray | torch.Tensor, longest: int
    ) -> torch.Tensor:
        """The outputs ``(B, longest, d_model)`` of conv tokens ``(B, n, d_model)`` (:meth:`embed_chunks`, each
        row's chunks in order, its first ``token_lengths[b]`` real): attention in the row's aligned windows of
        ``window_tokens``, then ``ln_post``. ``token_lengths`` ``(B,)`` int64 on the host or the tokens' device.
        """
        batch, count, dim = tokens.shape
        window_tokens = self.config.window_tokens
        windows = -(-count // window_tokens)
        # Only a row's last chunk is short, so its tokens lead the row, and its windows are the row's aligned
        # blocks of window_tokens: attend them as a batch.
        tokens = F.pad(tokens, (0, 0, 0, windows * window_tokens - count))
        if isinstance(token_lengths, torch.Tensor):
            starts = window_tokens * torch.arange(windows, device=token_lengths.device)
        else:
            starts = window_tokens * np.arange(windows)
        window_lengths = (token_lengths[:, None] - starts).clip(0, window_tokens).reshape(-1)
        hidden = self.encode_windows(tokens.reshape(batch * windows, window_tokens, dim), window_lengths)
        return hidden.reshape(batch, windows * window_tokens, dim)[:, :longest]

    def forward(self, features: torch.Tensor, feature_lengths: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a padded batch.

        Args:
            features: ``(B, num_mel_bins, T)`` float log-mel frames (10 ms each).
            feature_lengths: ``(B,)`` valid frames per utterance, ``<= T``. On
                the host (int64 numpy array, list or CPU tensor): read and
                checked there. A tensor on the encoder's device: the output
                lengths and the key padding are computed there, from it, and
                nothing waits for the device (values are not checked on a GPU:
                see :func:`~audiomask.models.layers.batch_lengths`).

        Returns:
            ``outputs`` ``(B, N, d_model)``, utterance ``b``'s tokens first in
            its row (positions beyond hold finite padding values), and
            ``output_lengths`` ``(B,)`` int64, both on the encoder's device (host
            features are moved with :func:`audiomask.transfer.to_device`).
            ``N`` is the longest utterance's token count with host lengths, the
            token count of ``T`` frames with device lengths (their maximum is
            not read back). Transformers returns the same tokens packed
            (``(sum N_b, d_model)``).
        """
        config = self.config
        if features.ndim != 3 or features.shape[1] != config.num_mel_bins:
            raise ValueError(f"features must have shape (B, {config.num_mel_bins}, T), got {tuple(features.shape)}")
        batch, bins, frames = features.shape
        device = next(self.parameters()).device
        lengths = batch_lengths("feature_lengths", feature_lengths, batch, frames, "T (features.shape[2])", device)
        output_lengths = self.output_lengths(lengths)
        on_device = isinstance(output_lengths, torch.Tensor)
        longest = int(self.output_lengths(frames) if on_device else output_lengths.max(initial=0))
        chunks = -(-frames // config.chunk_frames)
        padded = F.pad(model_input(features, self), (0, chunks * config.chunk_frames - frames))
        chunked = padded.view(batch, bins, chunks, config.chunk_frames).transpose(1, 2)
        tokens = self.embed_chunks(chunked.reshape(batch * chunks, bins, config.chunk_frames))
        tokens = tokens.reshape(batch, chunks * config.chunk_tokens, config.d_model)
        outputs = self.attend_windows(tokens, output_lengths, longest)
        return outputs, lengths_on(output_lengths, outputs.device)
