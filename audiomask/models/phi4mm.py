"""The Phi-4-multimodal (Phi-4MM) audio Conformer, weight-compatible with transformers.

Mirrors ``transformers.models.phi4_multimodal.modeling_phi4_multimodal.Phi4MultimodalAudioModel``:
parameter names and shapes are the same, so its ``state_dict`` loads here
as it is. Data flow, for ``features`` ``(B, T, 80)`` (log-mel frames of 10 ms):

1. mean/variance normalisation per mel bin (``encoder_embedding``);
2. NeMo ``dw_striding`` conv subsampling (``embed``): a 3x3 stride-2 conv,
   then depthwise 3x3 stride-2 + pointwise 1x1 convs, ``log2(time_reduction)``
   stride-2 stages in all, then a linear layer: ``(B, L, D)`` with
   ``L = ceil(T / time_reduction)`` tokens of 80 ms;
3. Conformer blocks: half feed-forward, self-attention with a T5-style
   relative position bias (one learned scalar per head and clipped distance,
   not bidirectionally symmetric by default), a causal depthwise conv module
   with a GLU, half feed-forward, LayerNorm.

Mask modes (the masks are built in numpy by :mod:`audiomask.masks.phi4mm`
and moved by :func:`audiomask.transfer.to_device`, or built on the device
from lengths already there, or given whole: see :meth:`Phi4MMEncoder.forward`):

- ``"phi4mm_compat"`` reproduces upstream numerics: the boolean hidden-state
  mask is *added* to the relative bias (a masked key is only 1 logit down),
  and a sequence longer than :data:`UNFOLD_TOKENS` tokens is cut into
  independent 500-token blocks, the last one zero-padded. Upstream is
  reproduced as called with ``mask = arange(T) < feature_lengths``.
- ``"hard"``: masked keys get ``finfo.min``; the whole utterance is attended
  under the chunk mask (no unfold); and each utterance is encoded as if it
  were alone, whatever the batch padding: feature frames beyond its length,
  and the subsampling stages' outputs beyond theirs, are zero (the zero
  padding of the convs). This is what chunk-by-chunk streaming reproduces.

Receptive field of the subsampling: each stride-2 conv (kernel 3, padding 1)
maps inputs ``[2p - 1, 2p + 1]`` to output ``p``, so ``n`` stages map frames
``[2^n t - (2^n - 1), 2^n t + (2^n - 1)]`` to token ``t``. The right end is
the last frame of the token's own ``time_reduction`` frames: a chunk's tokens
need no frame beyond the chunk (:data:`SUBSAMPLING_LOOKAHEAD_FRAMES` is 0),
and the left context is one cached step per stage.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiomask.checks import check_int
from audiomask.masks import phi4mm
from audiomask.models.attention import MaskMode, check_mask_mode, may_attend_to_compat_bias
from audiomask.models.config import Phi4MMAudioConfig
from audiomask.models.conformer import ConformerBlock, ConvSubsampling, MeanVarianceNorm, RelativeAttentionBias
from audiomask.models.layers import batch_lengths, lengths_on, model_input, valid_positions
from audiomask.transfer import to_device

__all__ = ["SUBSAMPLING_LOOKAHEAD_FRAMES", "UNFOLD_TOKENS", "Phi4MMAudioConfig", "Phi4MMEncoder"]

UNFOLD_TOKENS = 500  # upstream's "max_seq_len": longer sequences are encoded as 500-token blocks (compat mode)
SUBSAMPLING_LOOKAHEAD_FRAMES = 0  # feature frames a token needs beyond its own time_reduction frames


class Phi4MMEncoder(nn.Module):
    """Phi-4MM audio Conformer: features ``(B, T, 80)`` -> tokens ``(B, ceil(T / 8), D)``.

    >>> config = Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1, num_attention_heads=2,
    ...                            ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2)
    >>> encoder = Phi4MMEncoder(config).eval()
    >>> outputs, lengths = encoder(torch.randn(2, 40, 80), [40, 17], chunk_size=2, left_chunk=1, mask_mode="hard")
    >>> tuple(outputs.shape), lengths.tolist()
    ((2, 5, 8), [5, 3])
    """

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder_embedding = MeanVarianceNorm(config)
        self.embed = ConvSubsampling(config)
        self.relative_attention_bias_layer = RelativeAttentionBias(config)
        self.encoders = nn.ModuleList(ConformerBlock(config) for _ in range(config.num_blocks))

    @property
    def output_size(self) -> int:
        """``D``, the width of the output tokens (``hidden_size``)."""
        return self.config.hidden_size

    def output_lengths(self, feature_lengths: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """Tokens per utterance of ``feature_lengths`` frames ``(B,)`` (int64, on the host or a device):
        ``ceil(feature_lengths / time_reduction)``, computed where the lengths are.

        >>> Phi4MMEncoder(Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1, num_attention_heads=2,
        ...     ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2)
        ... ).output_lengths(np.array([40, 17, 0]))
        array([5, 3, 0])
        """
        reduction = self.config.time_reduction
        return (feature_lengths + (reduction - 1)) // reduction

    def chunking(self, chunk_size: int | None, left_chunk: int | None) -> tuple[int, int]:
        """``(chunk_size, left_chunk)`` checked, the config's where ``None``: tokens per chunk, chunks of left context."""
        chunk_size = self.config.chunk_size if chunk_size is None else check_int("chunk_size", chunk_size)
        left_chunk = self.config.left_chunk if left_chunk is None else check_int("left_chunk", left_chunk, minimum=0)
        return chunk_size, left_chunk

    def forward(
        self,
        features: torch.Tensor,
        feature_lengths: object,
        *,
        chunk_size: int | None = None,
        left_chunk: int | None = None,
        mask_mode: MaskMode = "phi4mm_compat",
        mask: object = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a padded batch.

        Args:
            features: ``(B, T, input_size)`` float log-mel frames (10 ms each).
            feature_lengths: ``(B,)`` valid frames per utterance, ``<= T``. On
                the host (int64 numpy array, list or CPU tensor): read and
                checked there, and the masks are built with
                :mod:`audiomask.masks` and moved. A tensor on the encoder's
                device: the output lengths and masks are computed there, from
                it, and nothing waits for the device (values are not checked
                on a GPU: see :func:`~audiomask.models.layers.batch_lengths`).
            chunk_size: tokens per attention chunk (``<= 0``: full attention);
                ``None``: the config's.
            left_chunk: chunks of left context; ``None``: the config's.
            mask_mode: ``"phi4mm_compat"`` (upstream numerics) or ``"hard"``
                (see the module docstring).
            mask: the attention mask to use instead of the one built from
                ``feature_lengths``, ``chunk_size`` and ``left_chunk``: bool,
                ``True`` = the query token may attend to the key token,
                ``(B, T_q, T_k) = (B, L, L)`` with ``L = ceil(T / time_reduction)``;
                in ``"phi4mm_compat"`` mode the mask of each block of upstream's
                unfold, ``(B * n, l, l)`` with ``l = min(L, UNFOLD_TOKENS)`` and
                ``n = ceil(L / l)`` (utterance-major). A host array or tensor
                (moved with :func:`~audiomask.transfer.to_device`) or a tensor
                on the encoder's device. ``feature_lengths`` still give the
                output lengths and, in ``"hard"`` mode, the real frames.

        Returns:
            ``outputs`` ``(B, L, D)`` with ``L = ceil(T / time_reduction)``
            (positions beyond an utterance's length hold finite padding values),
            and ``output_lengths`` ``(B,)`` int64 ``ceil(feature_lengths / time_reduction)``,
            both on the encoder's device (host features are moved with
            :func:`audiomask.transfer.to_device`, in the encoder's dtype).
        """
        mask_mode = check_mask_mode(mask_mode)
        chunk_size, left_chunk = self.chunking(chunk_size, left_chunk)
        if features.ndim != 3 or features.shape[2] != self.config.input_size:
            raise ValueError(f"features must have shape (B, T, {self.config.input_size}), got {tuple(features.shape)}")
        batch, frames, _ = features.shape
        device = next(self.parameters()).device
        lengths = batch_lengths("feature_lengths", feature_lengths, batch, frames, "T (features.shape[1])", device)
        token_lengths = self.output_lengths(lengths)
        reduction = self.config.time_reduction
        tokens = -(-frames // reduction)
        hidden = self.encoder_embedding(model_input(features, self))
        if tokens == 0:
            return hidden.new_zeros(batch, 0, self.config.hidden_size), lengths_on(token_lengths, device)
        if mask_mode == "hard":
            frame_valid = valid_positions(lengths, tokens * reduction, device)
            hidden = self.embed(F.pad(hidden, (0, 0, 0, tokens * reduction - frames)), frame_valid)
            if mask is None:
                mask = self._chunk_mask(valid_positions(token_lengths, tokens, device), chunk_size, left_chunk)
            hidden = self._encode(hidden, _given_mask(mask, (batch, tokens, tokens), device), hard=True)
        else:
            hidden = self._compat_encode(self.embed(hidden), token_lengths, chunk_size, left_chunk, mask)
        return hidden, lengths_on(token_lengths, device)

    def _compat_encode(
        self,
        hidden: torch.Tensor,
        token_lengths: np.ndarray | torch.Tensor,
        chunk_size: int,
        left_chunk: int,
        mask: object,
    ) -> torch.Tensor:
        """Upstream's blocks: sequences over ``UNFOLD_TOKENS`` are cut into zero-padded 500-token blocks."""
        batch, tokens, dim = hidden.shape
        block = min(tokens, UNFOLD_TOKENS)
        blocks = -(-tokens // block)
        hidden = F.pad(hidden, (0, 0, 0, blocks * block - tokens)).reshape(batch * blocks, block, dim)
        if mask is None:
            # Valid tokens of each block, batch-major as upstream's unfold orders them.
            on_device = isinstance(token_lengths, torch.Tensor)
            starts = block * (torch.arange(blocks, device=hidden.device) if on_device else np.arange(blocks))
            block_lengths = (token_lengths[:, None] - starts).clip(0, block).reshape(-1)
            mask = self._chunk_mask(valid_positions(block_lengths, block, hidden.device), chunk_size, left_chunk)
        hidden = self._encode(hidden, _given_mask(mask, (batch * blocks, block, block), hidden.device), hard=False)
        return hidden.reshape(batch, blocks * block, dim)[:, :tokens]

    @staticmethod
    def _chunk_mask(key_valid: torch.Tensor, chunk_size: int, left_chunk: int) -> torch.Tensor:
        """``(N, L, L)`` bool: the chunk band (built on the host, one ``(L, L)`` copy) AND ``key_valid`` ``(N, L)``.

        Equals :func:`audiomask.masks.phi4mm.hs_mask` of the same lengths: only keys are masked.
        """
        length = key_valid.shape[1]
        band = to_device(phi4mm.streaming_mask(length, 1, chunk_size, left_chunk), key_valid.device)
        return band & key_valid[:, None, :]

    def _encode(self, hidden: torch.Tensor, mask: torch.Tensor, *, hard: bool) -> torch.Tensor:
        """Run the blocks over ``hidden`` ``(N, L, D)`` under ``mask`` ``(N, L, L)`` on its device (True = may attend)."""
        length = hidden.shape[1]
        positions = torch.arange(length, device=hidden.device)
        relative = self.relative_attention_bias_layer(positions, positions)
        mask = mask.unsqueeze(1)
        if hard:  # finfo.min where masked: what relative + finfo.min rounds to, in one kernel
            bias = torch.where(mask, relative, torch.finfo(hidden.dtype).min)
        else:
            bias = relative + may_attend_to_compat_bias(mask, hidden.dtype)
        for block in self.encoders:
            hidden = block(hidden, bias)
        return hidden


def _given_mask(mask: object, shape: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    """``mask`` checked (bool, ``shape``) and on ``device``: a ``ValueError`` naming it otherwise."""
    dtype = getattr(mask, "dtype", None)
    if tuple(getattr(mask, "shape", ())) != shape or dtype not in (torch.bool, np.bool_):
        got = f"{dtype} of shape {tuple(mask.shape)}" if dtype is not None else type(mask).__name__  # type: ignore[attr-defined]
        raise ValueError(f"mask must be a bool array or tensor of shape {shape} (True = may attend), got {got}")
    if isinstance(mask, torch.Tensor) and mask.device.type != "cpu" and mask.device != device:
        raise ValueError(f"mask must be on the host or on the encoder's device ({device}), got {mask.device}")
    return to_device(mask, device)
