"""Every setting of a training run (:class:`TrainConfig`, recorded in ``train.json``); the defaults make ctc-small.

The architecture is the library's (:data:`ARCHITECTURE`): :class:`TrainConfig`
names its sizes one field each (so ``train.json`` and the card read them) and
takes their defaults from it; :meth:`TrainConfig.encoder_config` gives them back.
"""

from __future__ import annotations

import dataclasses

from audiomask.asr.checkpoint import SHIPPED_ENCODER_CONFIG as ARCHITECTURE
from audiomask.constants import FRAME_MS
from audiomask.models import Phi4MMAudioConfig

__all__ = ["ARCHITECTURE", "MODEL_SIZES", "TrainConfig"]

SHIPPED_TOKEN_MS = FRAME_MS * ARCHITECTURE.time_reduction  # 40 ms of audio per encoder token


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run (recorded in train.json); the defaults are the shipped model's."""

    # Model: the shipped Phi-4MM Conformer's sizes (the released Phi-4MM is 1024 wide, 24 blocks, 8 frames a token).
    hidden_size: int = ARCHITECTURE.hidden_size
    intermediate_size: int = ARCHITECTURE.intermediate_size  # units of each feed-forward GLU
    num_blocks: int = ARCHITECTURE.num_blocks
    num_heads: int = ARCHITECTURE.num_attention_heads
    conv_kernel_tokens: int = ARCHITECTURE.kernel_size  # causal depthwise conv of each block
    subsampling_channels: int = ARCHITECTURE.nemo_conv_channels  # conv subsampling width
    time_reduction: int = ARCHITECTURE.time_reduction  # feature frames per token
    bias_max_distance_tokens: int = ARCHITECTURE.bias_max_distance  # relative-position bias clip
    # Streaming defaults stored in the model file, and the evaluated chunk sizes.
    default_chunk_ms: int = ARCHITECTURE.chunk_size * SHIPPED_TOKEN_MS
    default_left_chunks: int = ARCHITECTURE.left_chunk
    eval_chunk_ms: tuple[int, ...] = (160, 320, 640, 1280)
    # Dynamic chunk training, drawn per batch.
    full_attention_share: float = 0.25
    chunk_tokens: tuple[int, int] = (4, 32)  # inclusive, uniform: 160-1280 ms
    all_left_share: float = 0.5  # of chunked batches: all the left context; the others draw left_chunks
    left_chunks: tuple[int, int] = (1, 16)  # inclusive, uniform
    # Optimisation.
    peak_lr: float = 2e-3
    warmup_steps: int = 300  # at most; a tenth of the steps when there are fewer than 3000
    final_lr_share: float = 0.02  # cosine decay from peak_lr down to this share of it
    weight_decay: float = 1e-2
    adam_betas: tuple[float, float] = (0.9, 0.98)
    grad_clip_norm: float = 5.0
    ema_horizon_share: float = 0.1  # the EMA averages over about this share of the steps
    batch_audio_s: float = 600.0  # padded audio per batch
    feature_copies: int = 2  # of each training utterance: clean, and augmented ones
    # SpecAugment, on the device.
    freq_masks: int = 2
    freq_mask_bins: int = 12  # widest, of 80 mel bins
    time_masks_per_s: float = 0.5
    time_mask_frames: int = 20  # widest: 200 ms (wider hides whole words, which random sentences cannot predict)
    mel_warp: tuple[float, float] = (0.85, 1.18)  # vocal-tract-length perturbation factor, uniform per utterance
    spectral_tilt_db: tuple[float, float] = (-10.0, 10.0)  # top bin minus bottom bin, uniform per utterance
    seed: int = 0

    def encoder_config(self) -> Phi4MMAudioConfig:
        """The encoder architecture of these sizes; its chunk settings are the streaming defaults.

        >>> TrainConfig().encoder_config() == ARCHITECTURE
        True
        """
        return dataclasses.replace(
            ARCHITECTURE,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_blocks=self.num_blocks,
            num_attention_heads=self.num_heads,
            ext_pw_out_channel=self.hidden_size,
            depthwise_separable_out_channel=self.hidden_size,
            kernel_size=self.conv_kernel_tokens,
            nemo_conv_channels=self.subsampling_channels,
            time_reduction=self.time_reduction,
            bias_max_distance=self.bias_max_distance_tokens,
            chunk_size=self.default_chunk_ms // (FRAME_MS * self.time_reduction),
            left_chunk=self.default_left_chunks,
        )


MODEL_SIZES = {  # --model-size: smaller architectures for tests and trials
    "tiny": {"hidden_size": 16, "intermediate_size": 16, "num_blocks": 1, "num_heads": 2, "subsampling_channels": 4},
}
