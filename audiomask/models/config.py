"""The encoder architectures: transformers' config fields and defaults, checked.

- :class:`Phi4MMAudioConfig`: ``Phi4MultimodalAudioConfig`` (the Phi-4-multimodal audio Conformer).
- :class:`Qwen3ASRConfig`: ``Qwen3ASREncoderConfig`` (the Qwen3-ASR audio encoder).

Both load from a transformers ``config.json`` dict with ``from_dict``; a bad
field is a ``ValueError`` naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from audiomask.checks import check_int
from audiomask.models.layers import config_from_dict, positive_fields

__all__ = [
    "CONV_STAGES",
    "MAX_ENCODER_BLOCKS",
    "MAX_ENCODER_PARAMETERS",
    "Phi4MMAudioConfig",
    "Qwen3ASRConfig",
    "conv_size",
]

CONV_STAGES = 3  # Qwen3-ASR: conv2d kernel 3, stride 2, padding 1, per chunk
# Bounds on an encoder that a file describes (a model file's metadata, a checkpoint's config.json),
# checked before anything is built from it (:func:`audiomask.models.pretrained.encoder_shapes`).
# Blocks: each is built as modules of its own, so depth also bounds the time the check takes (128
# blocks of 1024: 0.5 s on the meta device); the encoders in use have 24 (Phi-4MM, Qwen3-ASR).
MAX_ENCODER_BLOCKS = 128
# Parameters and buffers: 2^32 (16 GiB in float32) is ten times the largest encoder in use (Phi-4MM's, 441M).
MAX_ENCODER_PARAMETERS = 2**32


def conv_size(size: int) -> int:
    """Qwen3-ASR steps (or mel bins) left after the conv stages: ``ceil`` halving ``CONV_STAGES`` times."""
    return -(-size // 2**CONV_STAGES)


MIN_SINUSOID_CHANNELS = (
    4  # a sin and a cos channel at each of at least two timescales (their log spacing divides by one less)
)


@dataclasses.dataclass(frozen=True)
class Phi4MMAudioConfig:
    """Architecture of the Phi-4MM audio encoder: ``Phi4MultimodalAudioConfig``'s fields and defaults.

    The defaults are the released model's (24 blocks of 1024 dims, 16 heads,
    1536 feed-forward units, 80 mel bins in, 8 frames per token). Fields of
    the transformers config that play no part at inference (dropout, token
    ids, ``feature_layer``) are not kept.

    >>> Phi4MMAudioConfig().nemo_final_size  # 80 mel bins after three stride-2 convs
    10
    """

    DEPTH_FIELD: ClassVar[str] = "num_blocks"  # the field that counts the blocks
    SIZE_FIELDS: ClassVar[tuple[str, ...]] = (  # the integer fields that are sizes, each >= 1
        "hidden_size",
        "intermediate_size",
        "num_blocks",
        "num_attention_heads",
        "ext_pw_out_channel",
        "depthwise_separable_out_channel",
        "depthwise_multiplier",
        "kernel_size",
        "input_size",
        "time_reduction",
        "bias_max_distance",
        "nemo_conv_channels",
    )

    hidden_size: int = 1024
    intermediate_size: int = 1536
    num_blocks: int = 24
    num_attention_heads: int = 16
    activation: str = "swish"
    chunk_size: int = -1  # tokens per attention chunk; <= 0 = full attention
    left_chunk: int = 18  # chunks of left context
    ext_pw_out_channel: int = 1024
    depthwise_separable_out_channel: int = 1024
    depthwise_multiplier: int = 1
    kernel_size: int = 3  # causal depthwise conv of the conv module, in tokens
    conv_activation: str = "swish"
    input_size: int = 80  # mel bins
    conv_glu_type: str = "swish"
    time_reduction: int = 8  # feature frames per token
    bias_max_distance: int = 1000  # tokens; relative distances are clipped to [-max, max - 1]
    bias_symmetric: bool = False
    nemo_activation: str = "relu"
    nemo_conv_channels: int = 1024

    def __post_init__(self) -> None:
        positive_fields(self, *self.SIZE_FIELDS)
        check_int("chunk_size", self.chunk_size)
        check_int("left_chunk", self.left_chunk, minimum=0)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads, "
                f"got {self.num_attention_heads}"
            )
        if self.time_reduction < 2 or self.time_reduction & (self.time_reduction - 1):
            raise ValueError(f"time_reduction must be a power of 2 >= 2, got {self.time_reduction}")
        # The conv module's residual path chains hidden -> GLU -> depthwise -> pointwise -> hidden.
        for name in ("ext_pw_out_channel", "depthwise_separable_out_channel"):
            if getattr(self, name) != self.hidden_size:
                raise ValueError(f"{name} must equal hidden_size ({self.hidden_size}), got {getattr(self, name)}")

    @property
    def subsampling_stages(self) -> int:
        """Stride-2 conv stages of the subsampling: ``log2(time_reduction)``."""
        return self.time_reduction.bit_length() - 1

    @property
    def nemo_final_size(self) -> int:
        """Mel bins left after the subsampling stages (each maps ``n`` to ``ceil(n / 2)``)."""
        return -(-self.input_size // self.time_reduction)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Phi4MMAudioConfig:
        """From a transformers ``Phi4MultimodalAudioConfig`` dict (``config.json``)."""
        return config_from_dict(cls, values)


@dataclasses.dataclass(frozen=True)
class Qwen3ASRConfig:
    """Architecture of the Qwen3-ASR audio encoder: ``Qwen3ASREncoderConfig``'s fields and defaults.

    Fields of the transformers config that play no part in the encoder
    (dropout, ``output_dim``, ``scale_embedding``, which upstream computes but
    never applies) are not kept.

    >>> Qwen3ASRConfig().window_tokens  # 8 chunks of 13 tokens
    104
    """

    DEPTH_FIELD: ClassVar[str] = "encoder_layers"  # the field that counts the blocks
    SIZE_FIELDS: ClassVar[tuple[str, ...]] = (  # the integer fields that are sizes, each >= 1
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
        positive_fields(self, *self.SIZE_FIELDS)
        if self.d_model % self.encoder_attention_heads or self.d_model % 2 or self.d_model < MIN_SINUSOID_CHANNELS:
            raise ValueError(
                f"d_model must be even and >= {MIN_SINUSOID_CHANNELS} (sin and cos positions over at least two "
                f"timescales) and a multiple of encoder_attention_heads ({self.encoder_attention_heads}), got {self.d_model}"
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
        return conv_size(self.chunk_frames)

    @property
    def chunks_per_window(self) -> int:
        """Conv chunks per attention window: ``n_window_infer / (2 * n_window)`` (8)."""
        return self.n_window_infer // self.chunk_frames

    @property
    def window_tokens(self) -> int:
        """Tokens per full attention window (104)."""
        return self.chunk_tokens * self.chunks_per_window

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Qwen3ASRConfig:
        """From a transformers ``Qwen3ASREncoderConfig`` dict (``config.json``)."""
        return config_from_dict(cls, values)
