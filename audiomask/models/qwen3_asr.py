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
keys excluded with a ``finfo.min`` bias built from a numpy padding mask. Same
windows, one kernel call, static shapes.

Padding: as upstream, the last chunk of an utterance is encoded with
whatever the input holds after the utterance's end; inputs with ``T`` not a
multiple of 100 are zero-padded (upstream refuses them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiomask.masks import padding_mask, qwen3_asr
from audiomask.models.attention import attend, may_attend_to_additive_bias, split_heads
from audiomask.models.layers import activation, config_from_dict, host_lengths, model_input, positive_fields
from audiomask.streaming.streams import Qwen3ASRStream
from audiomask.transfer import to_device

__all__ = ["Qwen3ASRConfig", "Qwen3ASREncoder"]

CONV_STAGES = 3  # conv2d kernel 3, stride 2, padding 1, per chunk
MAX_TIMESCALE = 10_000  # of the sinusoidal positions, as Whisper's


def _conv_size(size: int) -> int:
    """Steps (or mel bins) left after the conv stages: ``ceil`` halving ``CONV_STAGES`` times."""
    return -(-size // 2**CONV_STAGES)


@dataclasses.dataclass(frozen=True)
class Qwen3ASRConfig:
    """Architecture of the Qwen3-ASR audio encoder: ``Qwen3ASREncoderConfig``'s fields and defaults.

    Fields of the transformers config that play no part in the encoder
    (dropout, ``output_dim``, ``scale_embedding``, which upstream computes but
    never applies) are not kept.

    >>> Qwen3ASRConfig().window_tokens  # 8 chunks of 13 tokens
    104
    """

    num_mel_bins: int = 128
    encoder_layers: int = 24
    encoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    d_model: int = 1024
    activation_function: str = "gelu"
    n_window: int = 50  # mel frames; half a conv chunk
    n_window_infer: int = 800  # mel frames per attention window
    downsample_hidden_size: int = 480  # conv channels
    max_position_embeddings: int = 13  # sinusoidal positions per chunk

    def __post_init__(self) -> None:
        positive_fields(
            self,
            "num_mel_bins",
            "encoder_layers",
            "encoder_attention_heads",
            "encoder_ffn_dim",
            "d_model",
            "n_window",
            "n_window_infer",
            "downsample_hidden_size",
            "max_position_embeddings",
        )
        if self.d_model % self.encoder_attention_heads or self.d_model % 2:
            raise ValueError(
                f"d_model must be even (sin and cos positions) and a multiple of encoder_attention_heads "
                f"({self.encoder_attention_heads}), got {self.d_model}"
            )
        if self.n_window_infer % self.chunk_frames:
            raise ValueError(
                f"n_window_infer must be a multiple of 2 * n_window ({self.chunk_frames}), got {self.n_window_infer}"
            )
        if self.max_position_embeddings < self.chunk_tokens:
            raise ValueError(
                f"max_position_embeddings must be >= the tokens of a chunk ({self.chunk_tokens}), "
                f"got {self.max_position_embeddings}"
            )

    @property
    def chunk_frames(self) -> int:
        """Mel frames per conv chunk: ``2 * n_window``."""
        return 2 * self.n_window

    @property
    def chunk_tokens(self) -> int:
        """Tokens out of a full conv chunk (13 for 100 frames)."""
        return _conv_size(self.chunk_frames)

    @property
    def chunks_per_window(self) -> int:
        return self.n_window_infer // self.chunk_frames

    @property
    def window_tokens(self) -> int:
        """Tokens per full attention window (104)."""
        return self.chunk_tokens * self.chunks_per_window

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Qwen3ASRConfig:
        """From a transformers ``Qwen3ASREncoderConfig`` dict (``config.json``)."""
        return config_from_dict(cls, values)


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

    def forward(self, hidden: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``(N, W, D)`` (N windows), ``bias`` ``(N, 1, 1, W)``."""
        query, key, value = (
            split_heads(proj(hidden), self.num_heads) for proj in (self.q_proj, self.k_proj, self.v_proj)
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

    def forward(self, hidden: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
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
        self.conv_out = nn.Linear(channels * _conv_size(config.num_mel_bins), config.d_model, bias=False)
        # Not in the state dict (upstream's buffer is not persistent either): computed, as upstream.
        self.register_buffer(
            "positional_embedding", _sinusoids(config.max_position_embeddings, config.d_model), persistent=False
        )
        self.layers = nn.ModuleList(_EncoderLayer(config) for _ in range(config.encoder_layers))
        self.ln_post = nn.LayerNorm(config.d_model)

    def output_lengths(self, feature_lengths: np.ndarray) -> np.ndarray:
        """Tokens per utterance of ``feature_lengths`` frames (13 per full chunk plus the remainder's)."""
        return qwen3_asr.output_lengths(feature_lengths, self.config.n_window)

    def embed_chunks(self, chunks: torch.Tensor) -> torch.Tensor:
        """Conv chunks ``(N, num_mel_bins, chunk_frames)`` -> tokens ``(N, chunk_tokens, d_model)`` with positions."""
        hidden = chunks.unsqueeze(1)  # (N, 1, mel bins, time)
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            hidden = F.gelu(conv(hidden))
        count, channels, bins, steps = hidden.shape
        hidden = self.conv_out(hidden.permute(0, 3, 1, 2).reshape(count, steps, channels * bins))
        return hidden + self.positional_embedding[:steps].to(hidden.dtype)

    def encode_windows(self, windows: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
        """Attention layers and ``ln_post`` over windows ``(N, W, D)`` whose first ``lengths[n]`` tokens are real.

        Each window attends only to its own real tokens (a window without
        any gives finite padding). Returns ``(N, W, D)``.
        """
        key_valid = to_device(padding_mask(lengths, windows.shape[1]), windows.device)
        bias = may_attend_to_additive_bias(key_valid, windows.dtype)[:, None, None, :]
        for layer in self.layers:
            windows = layer(windows, bias)
        return self.ln_post(windows)

    def forward(self, features: torch.Tensor, feature_lengths: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a padded batch.

        Args:
            features: ``(B, num_mel_bins, T)`` float log-mel frames (10 ms each).
            feature_lengths: ``(B,)`` valid frames per utterance, ``<= T``
                (int64 numpy array, list or tensor; read on the host).

        Returns:
            ``outputs`` ``(B, N_max, d_model)``, utterance ``b``'s tokens first
            in its row (positions beyond hold finite padding values), and
            ``output_lengths`` ``(B,)`` int64, both on the encoder's device (host
            features are moved with :func:`audiomask.transfer.to_device`).
            Transformers returns the same tokens packed (``(sum N_b, d_model)``).
        """
        config = self.config
        if features.ndim != 3 or features.shape[1] != config.num_mel_bins:
            raise ValueError(f"features must have shape (B, {config.num_mel_bins}, T), got {tuple(features.shape)}")
        batch, bins, frames = features.shape
        lengths = host_lengths("feature_lengths", feature_lengths, frames, "T (features.shape[2])")
        if lengths.size != batch:
            raise ValueError(f"feature_lengths must have {batch} entries (features.shape[0]), got {lengths.size}")
        output_lengths = self.output_lengths(lengths)
        longest = int(output_lengths.max(initial=0))
        chunks = -(-frames // config.chunk_frames)
        padded = F.pad(model_input(features, self), (0, chunks * config.chunk_frames - frames))
        chunked = padded.view(batch, bins, chunks, config.chunk_frames).transpose(1, 2)
        tokens = self.embed_chunks(chunked.reshape(batch * chunks, bins, config.chunk_frames))
        # Only an utterance's last chunk is short, so its tokens lead its row, and its
        # windows are the row's aligned blocks of window_tokens: attend them as a batch.
        window_tokens, dim = config.window_tokens, config.d_model
        windows = -(-chunks // config.chunks_per_window)
        tokens = F.pad(
            tokens.reshape(batch, chunks * config.chunk_tokens, dim),
            (0, 0, 0, windows * window_tokens - chunks * config.chunk_tokens),
        )
        window_lengths = np.clip(output_lengths[:, None] - window_tokens * np.arange(windows), 0, window_tokens)
        hidden = self.encode_windows(tokens.reshape(batch * windows, window_tokens, dim), window_lengths.reshape(-1))
        outputs = hidden.reshape(batch, windows * window_tokens, dim)[:, :longest]
        return outputs, to_device(output_lengths, outputs.device)

    def stream(self, batch_size: int = 1) -> Qwen3ASRStream:
        """A stream of ``batch_size`` utterances: see :class:`audiomask.streaming.Qwen3ASRStream`."""
        return Qwen3ASRStream(self, batch_size)
