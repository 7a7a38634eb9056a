"""The causal language model of an LLM recogniser, decoding many streams at once over a :class:`KVCache`.

:class:`CausalLM` is the decoder stack of Qwen3 (Qwen3-ASR's language
model) and of Phi-4-mini (Phi-4-multimodal's), weight-compatible with
transformers' ``Qwen3ForCausalLM``: token embedding, ``layers`` of RMSNorm,
grouped-query attention with rotary positions (an RMSNorm on each query and
key head when ``qk_norm``), RMSNorm and a SiLU-gated MLP, a final RMSNorm and
the head. Query, key and value projections are one fused ``qkv_proj`` and
the MLP's gate and up one ``gate_up_proj`` (Phi-4's own layout; Qwen3's
separate weights are fused on reading, :func:`fuse_projections`).

One forward takes the next ``n`` input embeddings of ``B`` cache slots, of
different lengths and at different positions: each row continues its slot
from the slot's length, so streams join, roll back (:meth:`KVCache.crop`) and
leave independently. Positions are each slot's own; the rotary tables come
from transformers' own functions for the checkpoint's ``rope_parameters``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from audiomask.asr.capacity import free_bytes
from audiomask.checks import check_int
from audiomask.llm.attention import reads_in_place, slot_attention
from audiomask.llm.cache import CacheIndex, KVCache
from audiomask.llm.pointwise import fuses, norm_rotate, rms_norm
from audiomask.models.fused import silu_gate
from audiomask.ragged import ragged_index
from audiomask.transfer import to_device

__all__ = ["ATTENTION_BACKENDS", "CausalLM", "LMConfig", "fuse_projections", "pack_indices"]

# SDPA kernels for the decoder's masked, grouped-query attention where slot_attention does not run (the CPU), and for
# an LLM recogniser's audio encoder. cuDNN's is left out: it builds an execution plan for every new shape (~1.5 ms of
# host time a call, holding the interpreter lock), and a recogniser's shapes change with every utterance and update.
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass(frozen=True)
class LMConfig:
    """The sizes of a :class:`CausalLM` (read from a transformers text config by :meth:`from_transformers`).

    ``inv_freq`` ``(rotary_dim // 2,)`` float32: the rotary inverse frequencies; ``rope_scale``: the factor on
    their cos and sin (LongRoPE's attention factor; 1 otherwise); ``max_positions``: the positions the tables hold
    (for LongRoPE, its original context: its short factors hold there).
    """

    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    qk_norm: bool
    tie_word_embeddings: bool
    inv_freq: tuple[float, ...]
    rope_scale: float
    max_positions: int

    @classmethod
    def from_transformers(cls, config: Any, *, qk_norm: bool) -> LMConfig:
        """The sizes of a transformers text config (``Qwen3Config``, ``Phi4MultimodalConfig``).

        The rotary frequencies are transformers' own (``ROPE_INIT_FUNCTIONS`` for the config's
        ``rope_parameters``); LongRoPE's short factors are used, so positions stay below its
        ``original_max_position_embeddings``.
        """
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rope = dict(config.rope_parameters or {})
        rope_type = rope.get("rope_type", "default")
        max_positions = config.max_position_embeddings
        if rope_type == "default":
            base = rope["rope_theta"]
            dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
            scale = 1.0
        elif rope_type == "longrope":
            inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), seq_len=None)
            max_positions = rope["original_max_position_embeddings"]
        else:
            raise ValueError(f"rope_parameters' rope_type must be 'default' or 'longrope', got {rope_type!r}")
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            qk_norm=qk_norm,
            tie_word_embeddings=bool(config.tie_word_embeddings),
            inv_freq=tuple(inv_freq.tolist()),
            rope_scale=float(scale),
            max_positions=max_positions,
        )


# transformers' separate projections -> the fused weight holding them, rows in this order (Phi-4's own layout)
_FUSED = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def fuse_projections(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A decoder state dict in transformers' Qwen3 names with each layer's q/k/v and gate/up weights fused.

    :class:`CausalLM` holds one ``qkv_proj`` (query, key, value rows) and one ``gate_up_proj`` (gate, up rows)
    per layer: one matrix product each instead of three and two. Weights already fused pass through; a layer
    missing some of the separate weights keeps the ones it has (the shape check names what is missing).

    >>> state = {"layers.0.mlp.gate_proj.weight": torch.ones(2, 3), "layers.0.mlp.up_proj.weight": torch.zeros(2, 3)}
    >>> {name: tuple(tensor.shape) for name, tensor in fuse_projections(state).items()}
    {'layers.0.mlp.gate_up_proj.weight': (4, 3)}
    """
    out = dict(state)
    layers = {name.split(".")[1] for name in state if name.startswith("layers.")}
    for layer in sorted(layers):
        for fused, parts in _FUSED.items():
            names = [f"layers.{layer}.{part}" for part in parts]
            if all(name in out for name in names):
                out[f"layers.{layer}.{fused}"] = torch.cat([out.pop(name) for name in names])
    return out


class _RMSNorm(nn.Module):
    """RMSNorm computed in float32, as transformers' (``weight * x / rms(x)``)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fuses(x.device):
            return rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class _Attention(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.sizes = (
            config.heads * config.head_dim,
            config.kv_heads * config.head_dim,
            config.kv_heads * config.head_dim,
        )
        self.qkv_proj = nn.Linear(config.hidden_size, sum(self.sizes), bias=False)
        self.o_proj = nn.Linear(config.heads * config.head_dim, config.hidden_size, bias=False)
        if config.qk_norm:
            self.q_norm = _RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = _RMSNorm(config.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], step: _Step) -> torch.Tensor:
        total = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        q = q.view(total, self.heads, self.head_dim)
        k = k.view(total, self.kv_heads, self.head_dim)
        v = v.view(total, self.kv_heads, self.head_dim)
        q = _position(q, self.q_norm if self.qk_norm else None, rotary)
        k = _position(k, self.k_norm if self.qk_norm else None, rotary)
        cache, layer, where = step.cache, step.layer, step.where
        cache.store(layer, where, k, v)
        if step.mask is None:  # on a GPU: each row reads its own slot in place
            out = slot_attention(
                q, cache.keys[layer], cache.values[layer], where.read_slots, where.first, where.count, where.starts,
                step.width,
            )  # fmt: skip
        else:  # SDPA over the rows' slots: queries padded to (B, heads, n, head_dim)
            padded = q.new_zeros(step.mask.shape[0], step.width, self.heads, self.head_dim)
            padded[where.rows, where.inputs] = q
            keys, values = cache.read(layer, where)
            with sdpa_kernel(ATTENTION_BACKENDS):
                out = F.scaled_dot_product_attention(
                    padded.transpose(1, 2), keys, values, attn_mask=step.mask, enable_gqa=self.heads != self.kv_heads
                )
            out = out.transpose(1, 2)[where.rows, where.inputs]
        return self.o_proj(out.reshape(total, self.heads * self.head_dim))


class _MLP(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fuses(x.device):
            return self.down_proj(silu_gate(self.gate_up_proj(x), gate_first=True))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class _Layer(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.input_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = _MLP(config)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], step: _Step) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, step)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class _Step:
    """What every layer of one forward shares: the cache, where the inputs go in it, the attention mask."""

    cache: KVCache
    layer: int
    where: CacheIndex
    mask: torch.Tensor | None  # (B, 1, n, span) bool, True = may attend; None: slot_attention reads the slots
    width: int  # n: inputs of the longest row


def _position(x: torch.Tensor, norm: _RMSNorm | None, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The heads of ``x`` ``(N, H, D)`` normalised by ``norm`` (when given), then turned to their positions."""
    if fuses(x.device):
        return norm_rotate(x, None if norm is None else norm.weight, 0.0 if norm is None else norm.eps, *rotary)
    return _rotate(x if norm is None else norm(x), *rotary)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on the first ``cos.shape[-1]`` dims of each head of ``x`` ``(N, H, D)`` (``cos``: ``(N, dim)``)."""
    dim = cos.shape[-1]
    rotated, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    turned = torch.cat((-rotated[..., half:], rotated[..., :half]), dim=-1)
    out = rotated * cos[:, None] + turned * sin[:, None]
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


class CausalLM(nn.Module):
    """A decoder-only language model over a slot-indexed :class:`KVCache` (see the module docstring).

    >>> config = LMConfig(vocab_size=11, hidden_size=8, layers=1, heads=2, kv_heads=1, head_dim=4,
    ...     intermediate_size=16, rms_norm_eps=1e-6, qk_norm=True, tie_word_embeddings=True,
    ...     inv_freq=(1.0, 0.01), rope_scale=1.0, max_positions=64)
    >>> lm = CausalLM(config).eval()
    >>> cache = lm.new_cache(slots=2, capacity=16)
    >>> logits = lm(lm.embed(torch.tensor([[1, 2, 3], [4, 5, 0]])), torch.tensor([0, 1]), np.array([3, 2]), cache)
    >>> tuple(logits.shape), cache.lengths.tolist()  # the logits of each row's last real input
    ((2, 11), [3, 2])
    """

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.layers))
        self.norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", torch.tensor(config.inv_freq, dtype=torch.float32), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, slots: int, capacity: int) -> KVCache:
        """An empty cache of ``slots`` sequences of up to ``capacity`` positions each, on this model's device."""
        capacity = check_int("capacity", capacity, minimum=1)
        if capacity > self.config.max_positions:
            raise ValueError(
                f"capacity must be <= {self.config.max_positions} (the model's rotary positions), got {capacity}"
            )
        config = self.config
        return KVCache(config.layers, slots, config.kv_heads, capacity, config.head_dim, self.device, self.dtype)

    def cache_slot_bytes(self, capacity: int) -> int:
        """Bytes one slot of :meth:`new_cache` with ``capacity`` positions holds (keys and values, every layer)."""
        config = self.config
        return 2 * config.layers * config.kv_heads * capacity * config.head_dim * self.dtype.itemsize

    def cache_slots_fitting(self, capacity: int, reserve_bytes: int = 0, reserve_per_slot: int = 0) -> int:
        """How many slots of ``capacity`` positions fit in the memory free on this model's device with
        ``reserve_bytes`` plus ``reserve_per_slot`` a slot left beside them (what the cache's users allocate as
        they run)."""
        free = free_bytes(self.device)
        return max(0, free - reserve_bytes) // (self.cache_slot_bytes(capacity) + reserve_per_slot)

    def check_cache_fits(self, slots: int, capacity: int, reserve_bytes: int = 0, reserve_per_slot: int = 0) -> None:
        """Raise ``ValueError`` unless ``slots`` slots fit (:meth:`cache_slots_fitting`); the message says how many
        do."""
        fitting = self.cache_slots_fitting(capacity, reserve_bytes, reserve_per_slot)
        if slots <= fitting:
            return
        per_slot = self.cache_slot_bytes(capacity)
        raise ValueError(
            f"{slots} cache slots of {capacity} positions ({per_slot / 2**20:.1f} MiB each, "
            f"{slots * per_slot / 2**30:.1f} GiB) and the {(reserve_bytes + slots * reserve_per_slot) / 2**30:.1f} "
            f"GiB their updates need are more than the {free_bytes(self.device) / 2**30:.1f} GiB free on "
            f"{self.device}: about {fitting} such slots fit"
        )

    def embed(self, ids: torch.Tensor | np.ndarray | list[int]) -> torch.Tensor:
        """Token embeddings ``(..., hidden_size)`` of token ids ``ids`` (int64, any shape; on the host or the device)."""
        if not (isinstance(ids, torch.Tensor) and ids.device == self.device):
            ids = to_device(np.asarray(ids, np.int64) if not isinstance(ids, torch.Tensor) else ids, self.device)
        return self.embed_tokens(ids)

    def forward(
        self, embeds: torch.Tensor, slots: object, counts: np.ndarray, cache: KVCache, *, all_logits: bool = False
    ) -> torch.Tensor:
        """Append ``embeds`` ``(B, n, hidden_size)`` to the cache slots ``slots`` ``(B,)`` (host ints, distinct);
        the next-token logits.

        Row ``b`` holds ``counts[b]`` real inputs (``0 < counts[b] <= n``; the rest is padding, never
        written), placed at positions ``cache.lengths[slots[b]] ..``; the slot's length grows by
        ``counts[b]``. Returns float32 logits ``(B, vocab_size)`` of each row's last real input, or
        ``(B, n, vocab_size)`` of every input with ``all_logits``.
        """
        batch, n, _ = embeds.shape
        counts = np.asarray(counts, np.int64)
        if counts.shape != (batch,) or (counts < 1).any() or (counts > n).any():
            raise ValueError(f"counts must be {batch} integers in [1, {n}], got {counts.tolist()}")
        host_slots = np.asarray(slots, np.int64)
        starts = cache.lengths[host_slots]
        ends = starts + counts
        if ends.max() > cache.capacity:
            raise ValueError(
                f"the inputs would grow a slot to {ends.max()} positions, over the cache's {cache.capacity}"
            )
        packed = to_device(pack_indices(host_slots, starts, counts), self.device)
        leading = bool((host_slots == np.arange(batch)).all())
        logits = self.run(embeds, packed, cache, int(counts.sum()), int(ends.max()), leading, all_logits=all_logits)
        cache.lengths[host_slots] = ends
        return logits

    def run(
        self,
        embeds: torch.Tensor,
        packed: torch.Tensor,
        cache: KVCache,
        total: int,
        span: int,
        leading: bool,
        *,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """:meth:`forward` on the device alone: ``packed`` (:func:`pack_indices`, on the device) says where the
        inputs go; ``total`` real inputs, keys ``0 .. span - 1`` read. Nothing waits for the device, nothing is
        allocated on the host, and the cache's host lengths are not updated: a CUDA graph can hold it."""
        batch, n, _ = embeds.shape
        rows_at, inputs_at, slots_at, positions_at = packed[: 4 * total].view(4, total)
        read_slots, first, count = packed[4 * total :].view(3, batch)
        starts = torch.cumsum(count, 0) - count  # row b's inputs are x[starts[b] : starts[b] + count[b]]
        cache_rows = cache.rows(slots_at, positions_at)
        where = CacheIndex(rows_at, inputs_at, cache_rows, read_slots, first, count, starts, span, leading)
        device = self.device
        mask = None
        if not reads_in_place(device):
            offsets = torch.arange(n, device=device)
            positions = first[:, None] + offsets
            valid = offsets < count[:, None]
            keys = torch.arange(span, device=device)
            # Query i of row b sees its slot's keys up to its own position; a padded query sees key 0 (no NaN).
            mask = ((keys <= positions[:, :, None]) & (valid[:, :, None] | (keys == 0)))[:, None]
        angles = positions_at[:, None].float() * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        scale = self.config.rope_scale
        rotary = ((angles.cos() * scale).to(self.dtype), (angles.sin() * scale).to(self.dtype))
        step = _Step(cache, 0, where, mask, n)
        # Only the real inputs go through the layers, packed: (total, hidden), row after row.
        x = embeds.to(device, self.dtype)[rows_at, inputs_at]
        for index, layer in enumerate(self.layers):
            step.layer = index
            x = layer(x, rotary, step)
        if all_logits:
            padded = x.new_zeros(batch, n, x.shape[-1])
            padded[rows_at, inputs_at] = x
            return self.lm_head(self.norm(padded)).float()
        return self.lm_head(self.norm(x[starts + count - 1])).float()


def pack_indices(slots: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Every index one forward needs, in one int64 array (moved to the device in one copy, no per-layer sync).

    Rows ``b`` of ``slots``/``starts``/``counts`` ``(B,)``: ``counts[b]`` inputs for slot ``slots[b]`` from
    position ``starts[b]``. Layout: per real input its row, its index in the row, its slot and position
    (``4 * sum(counts)``), then per row its slot, first position and count (``3 * B``).

    >>> pack_indices(np.array([3, 1]), np.array([5, 0]), np.array([1, 2])).tolist()
    [0, 1, 1, 0, 0, 1, 3, 1, 1, 5, 0, 1, 3, 1, 5, 0, 1, 2]
    """
    rows, inputs = ragged_index(counts)
    return np.concatenate((rows, inputs, slots[rows], starts[rows] + inputs, slots, starts, counts)).astype(np.int64)
