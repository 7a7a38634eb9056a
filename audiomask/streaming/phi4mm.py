"""Cache-aware streaming of the Phi-4MM Conformer: each chunk emitted as soon as its frames are in.

The outputs equal the whole-utterance forward with ``mask_mode="hard"`` and
the same chunk settings, on every utterance's real tokens. The chunk step has
static shapes (preallocated caches, the same ``B`` every step), so it can be
replayed as CUDA graphs; the masks it needs are built in numpy on the host and
moved with :func:`audiomask.transfer.to_device`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.constants import FRAME_MS
from audiomask.features import Phi4MMFrontend
from audiomask.features.frontend import Frontend
from audiomask.masks import padding_mask
from audiomask.models.conformer import block_slice_rows
from audiomask.models.phi4mm import Phi4MMEncoder
from audiomask.streaming.buffer import BufferedSlots
from audiomask.streaming.plan import ChunkPlan, block_samples
from audiomask.transfer import to_device

__all__ = ["Phi4MMSlots"]

_BOOL_BYTES = 1  # a torch.bool mask element


class Phi4MMSlots(BufferedSlots):
    """Cache-aware streaming of :class:`~audiomask.models.phi4mm.Phi4MMEncoder`, chunk by chunk.

    Args:
        encoder: the encoder (its device and dtype are the slots').
        batch_size: slots ``B``, ``>= 1``.
        chunk_size: tokens per chunk, ``>= 1``; ``None``: the encoder config's.
        left_chunk: chunks of left context, ``>= 0``; ``None``: the config's.
        cuda_graph: replay the chunk step as CUDA graphs (one launch instead
            of hundreds; CUDA only), captured at the first step.
        plan: instead of the three above, a :class:`~audiomask.streaming.ChunkPlan`
            of this family (:meth:`make_plan`), which the slots then hold.

    State per slot: for every block the keys/values of the left context, the
    last ``S = left_chunk * chunk_size`` tokens ``(2, B, H, S, D / H)``, and
    the conv module's last ``kernel_size - 1`` GLU outputs; for every stride-2
    stage of the subsampling its last input step. The key/value cache is a
    ring of ``left_chunk`` chunks: a step attends to it and to its own chunk's
    keys, then writes those over the oldest chunk's. A chunk's
    ``chunk_size * time_reduction`` frames are all its tokens need (the
    subsampling has no lookahead beyond them), so each chunk is emitted as
    soon as its frames are in. The relative position bias depends only on
    key-minus-query distances: one ``(H, C, S + C)`` tensor per ring phase
    serves every step. Every length and mask is built on the host; masks that
    are all True (full chunks, full caches) are not built, moved or applied.

    ``push(features (B, t, 80), lengths=None) -> (B, n, D)``: ``n`` is a
    multiple of ``chunk_size``, possibly 0. ``flush() -> (B, n, D)``: the rest,
    the last chunk padded; afterwards the slots are empty and start new
    utterances. Concatenated over time the outputs are ``(B, ceil(T / 8), D)``,
    ``T`` the longest utterance, and equal ``encoder(..., mask_mode="hard")``
    on each utterance's valid tokens; ``last_lengths`` counts the valid ones of
    each call. :meth:`step` encodes one chunk given whole (a driver's batch).

    >>> from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder
    >>> config = Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1, num_attention_heads=2,
    ...                            ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2)
    >>> slots = Phi4MMSlots(Phi4MMEncoder(config).eval(), chunk_size=2, left_chunk=1)
    >>> [tuple(slots.push(torch.randn(1, 10, 80)).shape) for _ in range(3)]  # 16 frames per chunk
    [(1, 0, 8), (1, 2, 8), (1, 0, 8)]
    >>> tuple(slots.flush().shape)  # 30 frames in all -> 4 tokens
    (1, 2, 8)
    """

    def __init__(
        self,
        encoder: Phi4MMEncoder,
        batch_size: int = 1,
        chunk_size: int | None = None,
        left_chunk: int | None = None,
        *,
        cuda_graph: bool = False,
        plan: ChunkPlan | None = None,
    ) -> None:
        if not isinstance(encoder, Phi4MMEncoder):
            raise ValueError(f"encoder must be a Phi4MMEncoder, got {type(encoder).__name__}")
        if plan is None:
            plan = self._sized(encoder, chunk_size, left_chunk, cuda_graph, self.default_frontend())
        elif (chunk_size, left_chunk, cuda_graph) != (None, None, False):
            raise ValueError(
                f"chunk_size, left_chunk and cuda_graph are the plan's: leave them out with a plan, got "
                f"chunk_size={chunk_size}, left_chunk={left_chunk}, cuda_graph={cuda_graph}"
            )
        config = encoder.config
        plan = self._given_plan(plan)
        super().__init__(encoder, batch_size, config.input_size, time_dim=1, output_size=config.hidden_size, plan=plan)
        self.chunk_size = self.tokens_per_chunk
        self.encoder = encoder
        # Ring phases: chunk c writes block c % phases of the key/value ring (of left_chunk blocks; none without
        # left context, which one phase serves).
        self._phases = max(self.left_chunk, 1)
        self._keys = (self.left_chunk + 1) * self.chunk_size  # S + C: the keys a chunk's queries attend to
        batch, heads = self.batch_size, config.num_attention_heads
        like = {"device": self.device, "dtype": self.dtype}
        # Every block's caches are views of one tensor per kind, so that a step's bookkeeping over the slots
        # (reset, hold) is a few device calls whatever the depth: each call releases the interpreter lock,
        # which a server's other threads then hold for up to a switch interval.
        layers = len(encoder.encoders)
        ring = self.left_chunk * self.chunk_size  # S
        self._kv_all = torch.zeros(layers, 2, batch, heads, ring, config.hidden_size // heads, **like)
        self._conv_all = torch.zeros(layers, batch, config.kernel_size - 1, config.hidden_size, **like)
        self._kv, self._conv = list(self._kv_all.unbind()), list(self._conv_all.unbind())
        self._subsampling = []
        bins = config.input_size
        for conv in encoder.embed.strided_convs():
            self._subsampling.append(torch.zeros(batch, conv.in_channels, 1, bins, **like))
            bins = -(-bins // 2)
        # The key/value ring holds the left_chunk chunks before chunk c, chunk c - k in block (c - k) % phases;
        # chunk c attends to them and to itself, then writes block c % phases. Per phase p = c % phases, key j
        # (the ring's slots, then the chunk's own tokens) is token c * C + offsets[p, j] (< 0 for the older
        # chunks), and the relative bias depends only on these offsets: one (H, C, S + C) tensor per phase
        # serves every step.
        block = np.arange(self.left_chunk)
        back = (np.arange(self._phases)[:, None] - block[None, :] - 1) % self._phases + 1  # (phase, block): chunks ago
        older = (-back[:, :, None] * self.chunk_size + np.arange(self.chunk_size)).reshape(self._phases, -1)
        own = np.broadcast_to(np.arange(self.chunk_size), (self._phases, self.chunk_size))
        self._offsets = np.concatenate([older, own], axis=1)
        with torch.no_grad():
            queries = to_device(np.arange(self.chunk_size), self.device)
            offsets = to_device(self._offsets, self.device)
            layer = encoder.relative_attention_bias_layer
            self._bias = torch.cat([layer(queries, offsets[p]) for p in range(self._phases)])  # (phases, H, C, S + C)
        self._chunks = 0  # chunk steps since the last flush: the ring phase is self._chunks % phases
        # Per slot: the chunks of its utterance encoded so far (reset_slots and flush restart it).
        self._position = np.zeros(self.batch_size, np.int64)
        # CUDA graphs of the chunk step, one per ring phase, captured on first use (None: eager).
        self._graphs: list[tuple[torch.cuda.CUDAGraph, torch.Tensor]] | None = None
        self._graph_pool: object | None = None  # shared with other slots (use_graph_pool); None: a pool of its own
        if plan.cuda_graph:
            self._graphs = []
            self._static_chunk = torch.zeros(batch, self.chunk_frames, config.input_size, **like)
            self._static_masks = torch.ones(batch, self.chunk_frames + self._keys, dtype=torch.bool, device=self.device)

    def use_graph_pool(self, pool: object) -> bool:
        """Capture this slots' CUDA graphs into ``pool`` (see :meth:`~audiomask.streaming.EncoderSlots.use_graph_pool`);
        ``False`` without CUDA graphs or once they are captured (at the first step, in the pool they keep)."""
        if self._graphs is None or self._graphs:
            return False
        self._graph_pool = pool
        return True

    @classmethod
    def default_frontend(cls) -> Phi4MMFrontend:
        """The Phi-4MM front end: 80 mels, ``(T, 80)`` frames of 25 ms every 10 ms, no centring."""
        return Phi4MMFrontend()

    @classmethod
    def _plan(
        cls, encoder: object, chunk_ms: int | None, left_chunks: int | None, cuda_graph: bool | None, frontend: Frontend
    ) -> ChunkPlan:
        """Chunks of any whole number of tokens (``10 * time_reduction`` ms); ``None``: the config's chunk."""
        if not isinstance(encoder, Phi4MMEncoder):
            raise ValueError(f"encoder must be a Phi4MMEncoder, got {type(encoder).__name__}")
        config = encoder.config
        chunk_size = None
        if chunk_ms is None and config.chunk_size < 1:
            raise ValueError(
                f"chunk_ms must be given: the encoder config's chunk_size ({config.chunk_size}) means full attention"
            )
        if chunk_ms is not None:
            token_ms = FRAME_MS * config.time_reduction
            if chunk_ms % token_ms:
                raise ValueError(f"chunk_ms must be a multiple of {token_ms} (one encoder token), got {chunk_ms}")
            chunk_size = chunk_ms // token_ms
        return cls._sized(encoder, chunk_size, left_chunks, cuda_graph, frontend)

    @classmethod
    def _sized(
        cls,
        encoder: Phi4MMEncoder,
        chunk_size: int | None,
        left_chunk: int | None,
        cuda_graph: bool | None,
        frontend: Frontend,
    ) -> ChunkPlan:
        """The plan of chunks of ``chunk_size`` tokens and ``left_chunk`` chunks of context (the config's: ``None``).

        The state is what :meth:`__init__` allocates: per slot the key/value ring ``(layers, 2, H, S, D / H)``
        (``S = left_chunk * C``), the conv caches ``(layers, kernel_size - 1, D)``, each stride-2 subsampling
        stage's last input step, and with CUDA graphs the step's static chunk and masks; shared by the slots the
        bias ``(max(left_chunk, 1), H, C, S + C)``.
        """
        chunk_size, left_chunk = encoder.chunking(chunk_size, left_chunk)
        chunk_size = check_int("chunk_size", chunk_size, minimum=1)
        parameter = next(encoder.parameters())
        graph = parameter.device.type == "cuda" if cuda_graph is None else bool(cuda_graph)
        if graph and parameter.device.type != "cuda":
            raise ValueError(f"cuda_graph needs the encoder on a CUDA device, got {parameter.device}")
        config, width = encoder.config, parameter.element_size()
        frames, ring, heads = chunk_size * config.time_reduction, left_chunk * chunk_size, config.num_attention_heads
        keys = ring + chunk_size  # attended by a chunk's queries: the ring's and its own
        layers = len(encoder.encoders)
        elements = layers * (
            2 * ring * heads * (config.hidden_size // heads) + (config.kernel_size - 1) * config.hidden_size
        )
        bins = config.input_size
        for conv in encoder.embed.strided_convs():
            elements += conv.in_channels * bins
            bins = -(-bins // 2)
        graph_bytes = (frames * config.input_size * width + (frames + keys) * _BOOL_BYTES) if graph else 0
        first_block, block = block_samples(frontend, frames)
        return ChunkPlan(
            family=cls.__name__,
            chunk_ms=frames * FRAME_MS,
            chunk_frames=frames,
            tokens_per_chunk=chunk_size,
            chunk_tokens=chunk_size,
            left_chunks=left_chunk,
            left_tokens=left_chunk * chunk_size,
            first_block_samples=first_block,
            block_samples=block,
            cuda_graph=graph,
            slot_bytes=elements * width + graph_bytes,
            shared_bytes=max(left_chunk, 1) * heads * chunk_size * keys * width,
        )

    def _valid_tokens(self) -> np.ndarray:
        return -(-self._frames // self.encoder.config.time_reduction)

    def push(self, features: torch.Tensor, lengths: object = None) -> torch.Tensor:
        """Append ``features`` ``(B, t, input_size)`` and encode every chunk now complete in all slots.

        ``lengths`` ``(B,)``: how many of the ``t`` frames are real in each
        slot (default all). Returns ``(B, n, D)``, ``n`` a multiple of ``chunk_size``.
        Nothing here waits for the GPU: every length and index is on the host.
        """
        self._push_frames(features, lengths)
        steps = []
        while self._buffer.counts.min() >= self.chunk_frames:
            steps.append(self._encode_chunk(*self._buffer.take(self.chunk_frames)))
        return self._emit(steps)

    def flush(self) -> torch.Tensor:
        """End the utterances: encode what is left (the last chunk zero-padded) and reset the slots.

        Returns ``(B, n, D)``, trimmed so that all outputs since the previous
        flush number ``ceil(max frames / time_reduction)``.
        """
        steps = []
        while self._buffer.counts.max(initial=0) > 0:
            steps.append(self._encode_chunk(*self._buffer.take(self.chunk_frames)))
        for cache in (self._kv_all, self._conv_all, *self._subsampling):
            cache.zero_()
        self._chunks = 0
        self._position[:] = 0
        return self._emit(steps, final=True)

    def reset_slots(self, slots: object) -> None:
        """Start new utterances in ``slots`` (slot indices) while the other slots go on.

        The slots' caches are zeroed and their token positions count from the
        next step, so a slot's outputs equal the forward of its own utterance
        whichever step it starts at. The slots must hold no buffered frames.
        For drivers that manage slots one by one with :meth:`step`; mixing this
        with :meth:`push`'s lock-step accounting (``last_lengths``) is not supported.
        """
        index = self._check_slots(slots)
        if index.size == 0:
            return
        rows = to_device(index, self.device)
        with torch.no_grad():
            self._kv_all.index_fill_(2, rows, 0)
            self._conv_all.index_fill_(1, rows, 0)
            for cache in self._subsampling:
                cache.index_fill_(0, rows, 0)
        self._frames[index] = 0
        self._position[index] = 0

    def step(
        self, chunk: object, valid: object, final: object = None, active: object = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Encode one chunk of every active slot given whole: ``(outputs (B, chunk_size, D), lengths (B,))``.

        ``chunk``: ``(B, chunk_size * time_reduction, F)`` frames, a host array
        or tensor (moved with :func:`~audiomask.transfer.to_device`) or a device
        tensor; ``valid`` ``(B,)``: real frames per slot, at the start of its
        row (the rest is ignored); ``final`` is checked and not needed (every
        chunk's tokens are final when emitted); ``active`` ``(B,)``: the slots
        that take this chunk (default all), the others keep their state (see
        :meth:`~audiomask.streaming.EncoderSlots.step`). The slots must hold
        no buffered frames. Equals pushing ``chunk`` with ``valid`` as lengths
        when the buffer held nothing.
        """
        valid, _, active = self._check_step(chunk, valid, final, active)
        self._frames += valid
        lengths = np.clip(self._valid_tokens() - self._position * self.chunk_size, 0, self.chunk_size)
        lengths[~active] = 0
        outputs = self._encode_chunk(chunk, valid, None if active.all() else np.flatnonzero(~active))
        self.last_lengths = lengths
        return outputs, lengths

    @torch.no_grad()
    def _encode_chunk(self, chunk: object, valid: np.ndarray, held: np.ndarray | None = None) -> torch.Tensor:
        """Encode ``chunk`` ``(B, chunk_frames, F)`` with ``valid`` real frames per slot; advance one chunk.

        ``held``: slots (indices) that keep their state, as if the step had not happened for them.
        """
        phase = self._chunks % self._phases
        # Token held by each key slot; valid from token 0 to each utterance's last (host numpy).
        tokens = (self._position * self.chunk_size)[:, None] + self._offsets[phase]
        keys_valid = (tokens >= 0) & (tokens < self._valid_tokens()[:, None])
        with self._holding(held, phase):
            return self._run_step(chunk, valid, keys_valid, phase)

    @contextlib.contextmanager
    def _holding(self, held: np.ndarray | None, phase: int) -> Iterator[None]:
        """Around one step at ``phase``: the ``held`` slots leave it with the state they entered it with, shifted one
        phase.

        The step computes every row, so a held slot's conv and subsampling
        caches and the ring block the step overwrites (block ``phase``, its
        oldest chunk) are saved before and written back after. Its key/value
        ring is then rolled by one chunk: at phase ``p + 1`` each block must
        hold what the block before it held at ``p``, so that the slot's chunks
        keep their distances to the ring phase, which the relative bias and the
        key mask are built from.
        """
        if held is None or held.size == 0:
            yield
            self._position += 1
            return
        rows = to_device(held, self.device)
        kv = self._kv_all  # (layers, 2, B, H, S, d): S holds the ring
        written = slice(phase * self.chunk_size, (phase + 1) * self.chunk_size)
        states = ((self._conv_all, 1), *((state, 0) for state in self._subsampling))  # (cache, its slot dim)
        saved = [state.index_select(dim, rows) for state, dim in states]
        saved_block = kv[:, :, rows, :, written]
        yield
        for (state, dim), before in zip(states, saved):
            state.index_copy_(dim, rows, before)
        if self.left_chunk:
            ring = kv[:, :, rows]
            ring[..., written, :] = saved_block
            kv[:, :, rows] = ring.roll(self.chunk_size, dims=4)
        moved = np.ones(self.batch_size, bool)
        moved[held] = False
        self._position += moved

    def _run_step(self, chunk: object, valid: np.ndarray, keys_valid: np.ndarray, phase: int) -> torch.Tensor:
        """The step's device work, as a CUDA graph replay or eagerly; advances the ring phase."""
        if self._graphs is not None:
            if not self._graphs:
                self._capture()
            self._chunk_on_device(chunk, out=self._static_chunk)
            to_device(
                np.concatenate([padding_mask(valid, self.chunk_frames), keys_valid], axis=1),
                self.device,
                out=self._static_masks,
            )
            graph, outputs = self._graphs[phase]
            graph.replay()
            self._chunks += 1
            return outputs.clone()  # the graph's output is overwritten by its next replay
        chunk = self._chunk_on_device(chunk)
        frames_full, keys_full = bool(valid.min() == self.chunk_frames), bool(keys_valid.all())
        # The masks that are not all True, in one host array and one copy.
        host = ([] if frames_full else [padding_mask(valid, self.chunk_frames)]) + ([] if keys_full else [keys_valid])
        masks = to_device(np.concatenate(host, axis=1), self.device) if host else None
        frame_valid = None if frames_full else masks[:, : self.chunk_frames]  # type: ignore[index]
        key_mask = None if keys_full else masks[:, masks.shape[1] - self._keys :]  # type: ignore[index]
        outputs = self._run_chunk(chunk, frame_valid, key_mask, phase)
        self._chunks += 1
        return outputs

    def _run_chunk(
        self, chunk: torch.Tensor, frame_valid: torch.Tensor | None, key_mask: torch.Tensor | None, phase: int
    ) -> torch.Tensor:
        """The device work of a chunk step (``None`` masks: all True); what a CUDA graph captures per phase."""
        encoder = self.encoder
        hidden = encoder.embed(encoder.encoder_embedding(chunk), frame_valid, self._subsampling, exact=True)
        bias = self._bias[phase : phase + 1]  # (1, H, C, S + C)
        if key_mask is not None:
            bias = torch.where(key_mask[:, None, None], bias, torch.finfo(self.dtype).min)  # (B, H, C, S + C)
        slot = phase * self.chunk_size if self.left_chunk else None  # the ring block this chunk replaces
        blocks = list(zip(encoder.encoders, self._kv, self._conv))
        rows = block_slice_rows(encoder.config, self.chunk_size, hidden.element_size())
        if len(hidden) <= rows:
            for block, kv, conv in blocks:
                hidden = block(hidden, bias, kv, conv, slot)
            return hidden
        # Beside the slots' caches a step holds its activations: slices of streams keep the blocks' from
        # bounding how many slots fit. The slices follow from the batch size alone, so a slot's rows meet the
        # same kernels whatever the other slots do.
        outputs = torch.empty_like(hidden)
        for start in range(0, len(hidden), rows):
            part = slice(start, start + rows)
            sliced, sliced_bias = hidden[part], bias if len(bias) == 1 else bias[part]
            for block, kv, conv in blocks:
                sliced = block(sliced, sliced_bias, kv[:, part], conv[part], slot)
            outputs[part] = sliced
        return outputs

    def _capture(self) -> None:
        """Capture one CUDA graph of :meth:`_run_chunk` per key/value ring phase, on static inputs.

        The graphs always apply both masks (an all-True mask changes no value),
        so one graph per phase serves every step. Capturing needs warm-up runs,
        which write the caches; it happens before the first chunk is encoded,
        when every cache is still zero (made so, reset or flushed), so zeroing
        them afterwards restores them (a saved copy would cost as much device
        memory as the caches: ~8 MB per slot for the full-size encoder). The
        warm-up's activations are handed back to the device before capture, so
        that the graphs' pool can take that memory rather than leave it cached
        for eager work that graph-driven slots never run.
        """
        caches = (self._kv_all, self._conv_all, *self._subsampling)
        frame_valid = self._static_masks[:, : self.chunk_frames]
        key_mask = self._static_masks[:, self.chunk_frames :]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for phase in range(self._phases):  # warm-up: lazy initialisation stays out of the graphs
                self._run_chunk(self._static_chunk, frame_valid, key_mask, phase)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        # The phases' graphs replay one at a time on one stream: their activations share one pool.
        pool = torch.cuda.graph_pool_handle() if self._graph_pool is None else self._graph_pool
        for phase in range(self._phases):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs = self._run_chunk(self._static_chunk, frame_valid, key_mask, phase)
            self._graphs.append((graph, outputs))
        for cache in caches:
            cache.zero_()
