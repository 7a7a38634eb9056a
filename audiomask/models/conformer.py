"""The layers of the Phi-4MM audio Conformer (:class:`~audiomask.models.phi4mm.Phi4MMEncoder`).

Parameter names and shapes equal transformers' ``Phi4MultimodalAudioModel``
submodules. Every layer takes a whole sequence, or one streaming chunk with
its caches (what :class:`~audiomask.streaming.Phi4MMSlots` keeps per slot):

- :class:`MeanVarianceNorm`: per-mel-bin normalisation (``encoder_embedding``);
- :class:`ConvSubsampling`: NeMo ``dw_striding`` subsampling (``embed``), with
  per-stage caches of one input step and zeroing beyond each utterance;
- :class:`RelativeAttentionBias`: the T5-style relative position bias;
- :class:`ConformerBlock`: one block, with a key/value ring cache and a causal
  conv cache.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from audiomask.models import convs, fused
from audiomask.models.attention import attend, split_heads
from audiomask.models.config import Phi4MMAudioConfig
from audiomask.models.layers import activation, derived, joined_projections

__all__ = [
    "BLOCK_SLICE_BYTES",
    "SUBSAMPLING_SLICE_BYTES",
    "ConformerBlock",
    "ConvSubsampling",
    "MeanVarianceNorm",
    "RelativeAttentionBias",
    "block_slice_rows",
]

# The exact path's subsampling runs a larger batch in slices of utterances, each slice's first-stage output (the
# step's largest tensor, ~5 MB an utterance of a full-size Phi-4MM at 1.28 s chunks in bf16) at most this large:
# 102 utterances a slice there, the slices' kernels still filling the GPU.
SUBSAMPLING_SLICE_BYTES = 512 * 2**20
# A streaming step runs its blocks over a larger batch in slices of streams, each slice's widest activation (the
# feed-forward's gate and up product, 96 KiB a full-size stream at 1.28 s chunks in bf16) at most this large: 5,461
# such streams a slice, its products still filling the GPU.
BLOCK_SLICE_BYTES = 512 * 2**20


class MeanVarianceNorm(nn.Module):
    """``(x - global_mean) * global_invstd`` per mel bin; buffers of the checkpoint."""

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        self.register_buffer("global_mean", torch.zeros(config.input_size))
        self.register_buffer("global_invstd", torch.ones(config.input_size))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``(B, T, input_size)`` -> the same shape, normalised."""
        return (features - self.global_mean) * self.global_invstd


class ConvSubsampling(nn.Module):
    """NeMo ``dw_striding`` subsampling: ``(B, T, F)`` frames -> ``(B, T / time_reduction, D)`` tokens."""

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        channels = config.nemo_conv_channels
        layers: list[nn.Module] = [
            nn.Conv2d(1, channels, kernel_size=3, stride=2, padding=1),
            activation(config.nemo_activation, "nemo_activation"),
        ]
        for _ in range(config.subsampling_stages - 1):
            layers += [
                nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=1, groups=channels),
                nn.Conv2d(channels, channels, kernel_size=1),
                activation(config.nemo_activation, "nemo_activation"),
            ]
        self.conv = nn.Sequential(*layers)  # indices as upstream: conv.0, conv.2, conv.3, ...
        self.out = nn.Linear(channels * config.nemo_final_size, config.hidden_size)

    def strided_convs(self) -> list[nn.Conv2d]:
        """The stride-2 convs, one per stage, in order."""
        return [m for m in self.conv if isinstance(m, nn.Conv2d) and m.stride[0] == 2]

    def forward(
        self,
        features: torch.Tensor,
        frame_valid: torch.Tensor | None = None,
        caches: list[torch.Tensor] | None = None,
        *,
        exact: bool = False,
    ) -> torch.Tensor:
        """Subsample normalised features ``(B, T, F)`` to tokens ``(B, L, D)``.

        Args:
            features: ``(B, T, F)`` float.
            frame_valid: ``(B, T)`` bool, ``True`` on each utterance's frames,
                ``T`` a multiple of ``r = time_reduction``: every stage's input
                beyond the utterance is zeroed, as if it were alone, and
                ``L = T / r``. ``None`` and not ``exact``: upstream's computation
                (``L = ceil(T / r)``, padding values take part).
            caches: with ``frame_valid`` or ``exact``, one ``(B, C_in, 1, F_in)``
                tensor per stage holding the last input step of the previous
                chunk (zeros at the start of an utterance); updated in place.
                ``None``: zeros (a whole utterance).
            exact: the exact computation with every frame real (no masking:
                the caller knows on the host that no frame is padding).
        """
        hidden = features.unsqueeze(1)  # (B, 1, T, F): time on dim 2, mel bins on dim 3
        if frame_valid is None and not exact:  # the stack as it is, channels-last (audiomask.models.convs)
            return self._tokens(self._exact(hidden, None, None))
        first = self.conv[0]
        _, _, frames, bins = hidden.shape
        # The stages' outputs are the largest tensors of a step: slices of the batch keep them from bounding how
        # many slots fit (what is left beside the slots' caches is the step's activations).
        utterance_bytes = first.out_channels * -(-frames // 2) * -(-bins // 2) * hidden.element_size()
        rows = max(1, SUBSAMPLING_SLICE_BYTES // utterance_bytes)
        if len(hidden) <= rows:
            return self._tokens(self._exact(hidden, frame_valid, caches))
        slices = [slice(start, start + rows) for start in range(0, len(hidden), rows)]
        return torch.cat(
            [
                self._tokens(
                    self._exact(
                        hidden[rows],
                        None if frame_valid is None else frame_valid[rows],
                        None if caches is None else [cache[rows] for cache in caches],
                    )
                )
                for rows in slices
            ]
        )

    def _tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """The last stage's ``(B, C, L, F')`` output as tokens ``(B, L, D)``."""
        batch, channels, length, bins = hidden.shape
        return self.out(hidden.transpose(1, 2).reshape(batch, length, channels * bins))

    def _exact(
        self, hidden: torch.Tensor, frame_valid: torch.Tensor | None, caches: list[torch.Tensor] | None
    ) -> torch.Tensor:
        """``frame_valid`` ``None`` here: every frame is real (the caller knows it on the host), no masking."""
        stride = 1  # input frames per step of `hidden`
        # Without autograd the activation and the masking run in place on the conv's output: the
        # first stage's output is the step's largest tensor (1024 channels x T/2 x F/2, ~5 MB per
        # slot in bf16 at 1.28 s chunks), and one copy of it alive instead of three is what lets
        # a CUDA-graph step hold thousands of slots.
        in_place = not torch.is_grad_enabled()
        if frame_valid is not None:
            hidden = hidden * frame_valid[:, None, :, None]
        modules = list(self.conv)
        activated = False  # the conv before the activation module took it
        for index, module in enumerate(modules):
            after = modules[index + 1] if index + 1 < len(modules) else None
            if isinstance(module, nn.Conv2d):
                # A conv followed by its activation takes it, and the zeroing beyond the utterance that ends the
                # stage, where its output is written (where the kernels of audiomask.models.fused run; else the
                # ops, in place without autograd).
                taken = _KERNEL_ACTIVATIONS.get(type(after))
                activated = taken is not None
                out_stride = stride * module.stride[0]
                valid = frame_valid[:, ::out_stride] if activated and frame_valid is not None else None
            if isinstance(module, nn.Conv2d) and module.stride[0] == 2:
                # Output p reads inputs 2p - 1 .. 2p + 1: the one step before this even-aligned
                # block is zero padding (a whole utterance) or comes from the cache. The conv runs
                # on the block itself with zero padding, and the cached step's contribution to
                # output 0 is added after (no concatenated copy of the stage input; the first
                # stage's patches read the cached step as their top row). Channels-last throughout.
                stage = stride.bit_length() - 1
                cache = None if caches is None else caches[stage]
                if module.in_channels == 1:
                    out = convs.patch_conv(module, hidden, cache, activation=taken, valid=valid)
                else:
                    # A depthwise conv's bias goes through the pointwise conv after it (_folded_bias).
                    bias = None if _bias_folds(module, after) else module.bias
                    out = F.conv2d(hidden, convs.conv_weight(module), bias, stride=2, padding=1, groups=module.groups)
                    if cache is not None:
                        top_tap = module.weight[:, :, :1]
                        out[:, :, :1] += F.conv2d(
                            cache, top_tap, None, stride=(1, 2), padding=(0, 1), groups=module.groups
                        )
                    out = convs.activate(out, taken, valid)
                if cache is not None:
                    cache.copy_(hidden[:, :, -1:])
                hidden = out
                del out  # the stage input is freed as soon as `hidden` moves on
                stride *= 2
            elif isinstance(module, nn.Conv2d):
                before = modules[index - 1]
                bias = _folded_bias(before, module) if _bias_folds(before, module) else module.bias
                hidden = convs.conv_activation(module, hidden, taken, bias, valid)
            elif not activated:  # the activation ends a stage: zero its outputs beyond the utterance
                activate_in_place = _IN_PLACE_ACTIVATIONS.get(type(module)) if in_place else None
                hidden = activate_in_place(hidden) if activate_in_place else module(hidden)
                if frame_valid is not None:
                    hidden = convs.activate(hidden, None, frame_valid[:, ::stride])
        return hidden


def _bias_folds(conv: nn.Module, after: nn.Module | None) -> bool:
    """Whether ``conv``, a strided conv of several input channels (NeMo's depthwise one), runs without its bias and
    the 1 x 1 conv ``after`` it with :func:`_folded_bias` (both with biases; nothing between them)."""
    pointwise = isinstance(after, nn.Conv2d) and after.kernel_size == (1, 1) and after.stride == (1, 1)
    return (
        pointwise and isinstance(conv, nn.Conv2d) and conv.in_channels > 1
        and conv.bias is not None and after.bias is not None
    )  # fmt: skip


def _folded_bias(depthwise: nn.Conv2d, pointwise: nn.Conv2d) -> torch.Tensor:
    """The bias of ``pointwise(depthwise(x))`` with ``depthwise`` run without its own: ``pointwise.bias +
    W_pointwise @ depthwise.bias`` (both linear, nothing between them), summed in float32, in the weights' dtype.
    One bias pass fewer over the stage's output; the same values to the dtype's rounding."""

    def build() -> torch.Tensor:
        folded = pointwise.weight[:, :, 0, 0].float() @ depthwise.bias.float()
        return (folded + pointwise.bias.float()).to(pointwise.bias.dtype)

    return derived(pointwise, (pointwise.weight, pointwise.bias, depthwise.bias), build, "folded bias")


# The activation modules whose op the conv stacks take where a conv's output is written, by their
# audiomask.models.fused.ACTIVATIONS names (nn.GELU as layers.activation makes it: exact, erf).
_KERNEL_ACTIVATIONS: dict[type[nn.Module], str] = {nn.ReLU: "relu", nn.GELU: "gelu"}


# The other activations of layers.activation that have an in-place form (the conv before a ReLU or a GELU
# takes it: _KERNEL_ACTIVATIONS).
_IN_PLACE_ACTIVATIONS: dict[type[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = {
    nn.SiLU: functools.partial(F.silu, inplace=True),
    nn.Sigmoid: torch.sigmoid_,
    nn.Tanh: torch.tanh_,
}


class RelativeAttentionBias(nn.Module):
    """T5-style relative position bias: one learned value per head and clipped key-minus-query distance."""

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        self.max_distance = config.bias_max_distance
        self.symmetric = config.bias_symmetric
        self.num_buckets = self.max_distance if self.symmetric else 2 * self.max_distance
        self.bias_values = nn.Embedding(self.num_buckets, config.num_attention_heads)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """Bias ``(1, H, T_q, T_k)`` for token positions ``(T_q,)`` and ``(T_k,)`` (int64).

        Only differences count, so a streaming chunk and its cached keys get
        the bias of the same tokens in the whole-utterance forward.
        """
        relative = (key_positions[None, :] - query_positions[:, None]).clamp(-self.max_distance, self.max_distance - 1)
        index = relative.abs() if self.symmetric else relative + self.num_buckets // 2
        return self.bias_values(index).permute(2, 0, 1).unsqueeze(0)


class _FeedForward(nn.Module):
    """LayerNorm, gated linear unit (``up * act(gate)``), down projection."""

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.hidden_size)
        self.act_fn = activation(config.activation, "activation")
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(_gated(self.gate_up_proj(self.layer_norm(hidden)), self.act_fn))


class _Attention(nn.Module):
    """Multi-head self-attention with an additive bias and an optional key/value cache."""

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        dim = config.hidden_size
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)

    def forward(
        self, hidden: torch.Tensor, bias: torch.Tensor, cache: torch.Tensor | None = None, slot: int | None = None
    ) -> torch.Tensor:
        """``hidden`` ``(B, T, D)``, ``bias`` ``(B or 1, H, T, T_k)``.

        ``cache`` ``(2, B, H, S, D / H)``: keys and values of the ``S`` tokens
        of the left context, a ring in any order; the queries attend to them
        and to the ``T`` new tokens, ``T_k = S + T`` (``bias``'s columns: the
        ring's slots, then the new tokens). Afterwards the new tokens overwrite
        slots ``slot .. slot + T - 1`` (a host int; ``None``: the cache is only
        read): nothing else of the cache is moved, whatever its size.
        ``None``: the queries attend to the ``T`` tokens, ``T_k = T``.
        """
        weight, bias_qkv = joined_projections(self, (self.q_proj, self.k_proj, self.v_proj))
        # One GEMM for queries, keys and values.
        query, key, value = (
            split_heads(part, self.num_heads) for part in F.linear(hidden, weight, bias_qkv).chunk(3, dim=-1)
        )
        if cache is None:
            return self.o_proj(attend(query, key, value, bias))
        new = hidden.shape[1]
        # A streaming chunk's few queries over its ring and its own keys: both read once and the ring written,
        # in one kernel (fused.chunk_attention).
        if (
            fused.fuses(hidden.device)
            and new <= fused.ATTENTION_MAX_QUERIES
            and cache.shape[3] <= fused.ATTENTION_MAX_KEYS
        ):
            return self.o_proj(fused.chunk_attention(query, key, value, cache[0], cache[1], bias, write_slot=slot))
        mixed = attend(query, torch.cat([cache[0], key], dim=2), torch.cat([cache[1], value], dim=2), bias)
        if slot is not None:
            cache[0, :, :, slot : slot + new].copy_(key)
            cache[1, :, :, slot : slot + new].copy_(value)
        return self.o_proj(mixed)


class _GluPointwiseConv(nn.Module):
    """Pointwise conv to ``2 D`` channels, ``(a + b1) * act(g + b2)``."""

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        channels = config.ext_pw_out_channel
        self.ext_pw_conv_1d = nn.Conv1d(config.hidden_size, 2 * channels, kernel_size=1)
        self.glu_act = activation(config.conv_glu_type, "conv_glu_type")
        self.b1 = nn.Parameter(torch.zeros(1, channels, 1))
        self.b2 = nn.Parameter(torch.zeros(1, channels, 1))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` -> ``(B, T, D)``, time-major: the pointwise conv is one GEMM (no transposes),
        with ``b1`` and ``b2`` folded into its bias."""
        conv = self.ext_pw_conv_1d
        sources = (self.b1, self.b2) if conv.bias is None else (self.b1, self.b2, conv.bias)

        def fold() -> torch.Tensor:
            bias = torch.cat([self.b1, self.b2], dim=1).flatten()
            return bias if conv.bias is None else conv.bias + bias

        bias = derived(self, sources, fold)
        return _gated(F.linear(hidden, conv.weight.flatten(1), bias), self.glu_act)


def _gated(projected: torch.Tensor, act: nn.Module) -> torch.Tensor:
    """``up * act(gate)`` of ``projected`` ``(..., 2 C)`` (``up`` first): one kernel for SiLU on GPUs (fused)."""
    if isinstance(act, nn.SiLU) and fused.fuses(projected.device):
        return fused.silu_gate(projected, gate_first=False)
    up, gate = projected.chunk(2, dim=-1)
    return up * act(gate)


def _pointwise(conv: nn.Conv1d, hidden: torch.Tensor) -> torch.Tensor:
    """A kernel-1 ``Conv1d`` applied time-major, ``(B, T, C_in) -> (B, T, C_out)``: one GEMM."""
    return F.linear(hidden, conv.weight.flatten(1), conv.bias)


class _DepthwiseSeparableConv(nn.Module):
    """Depthwise conv over time, then pointwise; the caller supplies the causal left padding."""

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        dim = config.hidden_size
        # Upstream pads both sides and drops the right end; here the input
        # arrives already left-padded (zeros or the slot's cache), so no padding.
        self.multiplier = config.depthwise_multiplier
        self.dw_conv = nn.Conv1d(dim, dim * config.depthwise_multiplier, config.kernel_size, groups=dim)
        self.pw_conv = nn.Conv1d(dim * config.depthwise_multiplier, config.depthwise_separable_out_channel, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Time-major ``(B, T + kernel_size - 1, D)`` -> ``(B, T, D)``.

        The depthwise conv is ``kernel_size`` multiply-adds of shifted views
        (elementwise, no layout change; one kernel on GPUs,
        :func:`~audiomask.models.fused.causal_depthwise`), the pointwise conv one GEMM.
        """
        if self.multiplier > 1:
            hidden = hidden.repeat_interleave(self.multiplier, dim=-1)  # output channel o reads input o // m
        weight, kernel = self.dw_conv.weight, self.dw_conv.kernel_size[0]
        if fused.fuses(hidden.device):  # the taps and the bias in one pass
            return _pointwise(self.pw_conv, fused.causal_depthwise(hidden, weight[:, 0], self.dw_conv.bias))
        length = hidden.shape[1] - kernel + 1
        if self.dw_conv.bias is None:
            out = hidden[:, :length] * weight[:, 0, 0]
        else:
            out = torch.addcmul(self.dw_conv.bias, hidden[:, :length], weight[:, 0, 0])
        for tap in range(1, kernel):
            out.addcmul_(hidden[:, tap : tap + length], weight[:, 0, tap])
        return _pointwise(self.pw_conv, out)


class _ConvModule(nn.Module):
    """LayerNorm, GLU, causal depthwise-separable conv, activation, pointwise conv."""

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        self.context = config.kernel_size - 1  # past tokens each output reads
        self.layer_norm = nn.LayerNorm(config.hidden_size)
        self.glu = _GluPointwiseConv(config)
        self.dw_sep_conv_1d = _DepthwiseSeparableConv(config)
        self.act = activation(config.conv_activation, "conv_activation")
        self.ext_pw_conv_1d = nn.Conv1d(config.hidden_size, config.ext_pw_out_channel, kernel_size=1)

    def forward(self, hidden: torch.Tensor, cache: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T, D)`` -> ``(B, T, D)``; ``cache`` ``(B, kernel_size - 1, D)``: the GLU outputs of the
        previous tokens (zeros at the start), updated in place; ``None``: zeros. Time-major throughout."""
        glu = self.glu(self.layer_norm(hidden))  # (B, T, D)
        if cache is None:
            joined = F.pad(glu, (0, 0, self.context, 0))
        else:
            joined = torch.cat([cache, glu], dim=1)
            cache.copy_(joined[:, joined.shape[1] - self.context :])
        return _pointwise(self.ext_pw_conv_1d, self.act(self.dw_sep_conv_1d(joined)))


def block_slice_rows(config: Phi4MMAudioConfig, tokens: int, element_size: int) -> int:
    """Streams per slice of the blocks' batch (:data:`BLOCK_SLICE_BYTES`), ``>= 1``: a stream's widest activation
    in a block is ``tokens`` rows of the widest of the feed-forward's gate and up product, the joined query, key and
    value product and the conv module's GLU input, ``element_size`` bytes a value.

    >>> block_slice_rows(Phi4MMAudioConfig(), tokens=16, element_size=2)
    5461
    """
    width = max(2 * config.intermediate_size, 3 * config.hidden_size, 2 * config.ext_pw_out_channel)
    return max(1, BLOCK_SLICE_BYTES // (tokens * width * element_size))


class ConformerBlock(nn.Module):
    """Half feed-forward, self-attention under an additive bias, causal conv module, half feed-forward, LayerNorm.

    Without caches it encodes whole sequences; with them, one streaming chunk.
    """

    def __init__(self, config: Phi4MMAudioConfig) -> None:
        super().__init__()
        self.feed_forward_in = _FeedForward(config)
        self.self_attn = _Attention(config)
        self.conv = _ConvModule(config)
        self.feed_forward_out = _FeedForward(config)
        self.layer_norm_att = nn.LayerNorm(config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size)

    def forward(
        self,
        hidden: torch.Tensor,
        bias: torch.Tensor,
        kv_cache: torch.Tensor | None = None,
        conv_cache: torch.Tensor | None = None,
        kv_slot: int | None = None,
    ) -> torch.Tensor:
        """One block over ``hidden`` ``(B, T, D)`` -> ``(B, T, D)``.

        Args:
            hidden: ``(B, T, D)`` tokens.
            bias: additive attention bias ``(B or 1, H, T, T_k)`` in ``hidden``'s dtype (relative
                positions plus the mask: ``finfo.min`` or the compat ``+1`` on the keys that may be attended).
            kv_cache: ``(2, B, H, S, D / H)`` keys and values of the left context's ``S`` tokens (a ring),
                attended with the ``T`` new tokens (``T_k = S + T``), which then overwrite slots
                ``kv_slot .. kv_slot + T - 1``. ``None``: ``T_k = T``.
            conv_cache: ``(B, kernel_size - 1, D)``, the conv module's previous GLU outputs, updated in
                place. ``None``: zeros (a sequence's start).
            kv_slot: the first ring slot of the new tokens (a host int); ``None``: the ring is only read.
        """
        # add(alpha=0.5): one kernel, the same rounding as hidden + 0.5 * x (scaling by 0.5 is exact).
        residual = torch.add(hidden, self.feed_forward_in(hidden), alpha=0.5)
        hidden = residual + self.self_attn(self.layer_norm_att(residual), bias, kv_cache, kv_slot)
        hidden = hidden + self.conv(hidden, conv_cache)
        hidden = torch.add(hidden, self.feed_forward_out(hidden), alpha=0.5)
        return self.layer_norm(hidden)
