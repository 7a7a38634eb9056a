"""Cache-aware chunk-by-chunk streaming of the encoders.

Both streams take a fixed batch of ``B`` stream slots that advance in lock
step: a chunk step runs once every slot holds a whole chunk of frames, and
``flush()`` ends all utterances (slots that have fewer frames are padded, as
the shorter utterances of an offline batch are). The step itself has static
shapes (preallocated caches, the same ``B`` every step), so it can later be
captured in a CUDA graph; the masks it needs are built in numpy on the host
and moved with :func:`audiomask.transfer.to_device`.

- :class:`Phi4MMStream` (``Phi4MMEncoder.stream``): outputs equal the
  whole-utterance forward with ``mask_mode="hard"``.
- :class:`Qwen3ASRStream` (``Qwen3ASREncoder.stream``): outputs of completed
  attention windows equal the offline forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.masks import padding_mask
from audiomask.models.layers import FrameBuffer, host_lengths
from audiomask.transfer import parallel_copy_bytes, to_device, torch_dtype_of

if TYPE_CHECKING:
    from audiomask.models.phi4mm import Phi4MMEncoder
    from audiomask.models.qwen3_asr import Qwen3ASREncoder

__all__ = ["Phi4MMStream", "Qwen3ASRStream"]


class _Stream:
    """Input checks and the frame buffer common to both streams; time on ``time_dim`` of the input."""

    def __init__(
        self, module: torch.nn.Module, batch_size: int, feature_size: int, time_dim: int, output_size: int
    ) -> None:
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        parameter = next(module.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self._feature_size, self._time_dim, self._output_size = feature_size, time_dim, output_size
        self._buffer = FrameBuffer(self.batch_size, feature_size, self.device, self.dtype)
        self._frames = np.zeros(self.batch_size, np.int64)  # frames pushed per slot since the last flush
        self._emitted = 0  # output tokens (per slot, valid or padding) since the last flush
        #: ``(B,)`` int64: how many of the tokens returned by the last ``push``/``flush``
        #: are real in each slot (they come first; the rest is padding).
        self.last_lengths = np.zeros(self.batch_size, np.int64)

    def _push_frames(self, features: torch.Tensor, lengths: object) -> None:
        """Check ``features`` and append them to the buffer (time on dim 1 there)."""
        feature_dim = 3 - self._time_dim
        if (
            not isinstance(features, torch.Tensor)
            or features.ndim != 3
            or features.shape[0] != self.batch_size
            or features.shape[feature_dim] != self._feature_size
        ):
            shape = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
            layout = ["t", "t"]
            layout[feature_dim - 1] = str(self._feature_size)
            raise ValueError(
                f"features must be a tensor of shape ({self.batch_size}, {', '.join(layout)}), got {shape}"
            )
        frames = features.shape[self._time_dim]
        lengths = np.full(self.batch_size, frames) if lengths is None else host_lengths("lengths", lengths, frames, "t")
        if lengths.size != self.batch_size:
            raise ValueError(f"lengths must have {self.batch_size} entries (batch_size), got {lengths.size}")
        self._buffer.push(features.transpose(1, self._time_dim), lengths)
        self._frames += lengths

    def _valid_tokens(self) -> np.ndarray:
        """``(B,)`` output tokens of the frames pushed to each slot since the last flush (per encoder)."""
        raise NotImplementedError

    def _emit(self, pieces: list[torch.Tensor], *, final: bool = False) -> torch.Tensor:
        """Join the step outputs over time (``(B, 0, D)`` when none) and count the valid ones in :attr:`last_lengths`.

        ``final``: the flush; trim the outputs since the last flush to the
        longest utterance's tokens, then start new utterances.
        """
        if pieces:
            outputs = torch.cat(pieces, dim=1)
        else:
            outputs = torch.zeros(self.batch_size, 0, self._output_size, device=self.device, dtype=self.dtype)
        valid = self._valid_tokens()
        if final:
            outputs = outputs[:, : int(valid.max(initial=0)) - self._emitted]
        self.last_lengths = np.clip(valid - self._emitted, 0, outputs.shape[1])
        self._emitted += outputs.shape[1]
        if final:
            self._frames[:] = 0
            self._emitted = 0
        return outputs


class Phi4MMStream(_Stream):
    """Cache-aware streaming of :class:`~audiomask.models.phi4mm.Phi4MMEncoder`, chunk by chunk.

    State per slot: for every block the keys/values of the last
    ``(left_chunk + 1) * chunk_size`` tokens ``(2, B, H, S, D / H)`` and the
    conv module's last ``kernel_size - 1`` GLU outputs; for every stride-2
    stage of the subsampling its last input step. The key/value cache is a
    ring of ``left_chunk + 1`` chunks (a step writes only its own chunk's
    keys). A chunk's
    ``chunk_size * time_reduction`` frames are all its tokens need (the
    subsampling has no lookahead beyond them), so each chunk is emitted as
    soon as its frames are in. The relative position bias depends only on
    key-minus-query distances: one ``(H, C, S)`` tensor per ring phase serves every step.
    Every length and mask is built on the host; masks that are all True
    (full chunks, full caches) are not built, moved or applied.

    ``push(features (B, t, 80), lengths=None) -> (B, n, D)``: ``n`` is a
    multiple of ``chunk_size``, possibly 0. ``flush() -> (B, n, D)``: the rest,
    the last chunk padded; afterwards the stream is empty and starts new
    utterances. Concatenated over time the outputs are ``(B, ceil(T / 8), D)``,
    ``T`` the longest utterance, and equal ``encoder(..., mask_mode="hard")``
    on each utterance's valid tokens; ``last_lengths`` counts the valid ones of each call.

    >>> from audiomask.models.phi4mm import Phi4MMAudioConfig, Phi4MMEncoder
    >>> config = Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1, num_attention_heads=2,
    ...                            ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2)
    >>> stream = Phi4MMEncoder(config).eval().stream(chunk_size=2, left_chunk=1)
    >>> [tuple(stream.push(torch.randn(1, 10, 80)).shape) for _ in range(3)]  # 16 frames per chunk
    [(1, 0, 8), (1, 2, 8), (1, 0, 8)]
    >>> tuple(stream.flush().shape)  # 30 frames in all -> 4 tokens
    (1, 2, 8)
    """

    def __init__(
        self, encoder: Phi4MMEncoder, batch_size: int, chunk_size: int, left_chunk: int, *, cuda_graph: bool = False
    ) -> None:
        config = encoder.config
        super().__init__(encoder, batch_size, config.input_size, time_dim=1, output_size=config.hidden_size)
        self.chunk_size = check_int("chunk_size", chunk_size, minimum=1)
        self.left_chunk = check_int("left_chunk", left_chunk, minimum=0)
        self.encoder = encoder
        self._chunk_frames = self.chunk_size * config.time_reduction
        self._blocks = self.left_chunk + 1  # chunks held by the key/value ring
        self._keys = self._blocks * self.chunk_size  # S: cached tokens plus the chunk's own
        batch, heads = self.batch_size, config.num_attention_heads
        like = {"device": self.device, "dtype": self.dtype}
        self._kv = [
            torch.zeros(2, batch, heads, self._keys, config.hidden_size // heads, **like) for _ in encoder.encoders
        ]
        self._conv = [torch.zeros(batch, config.kernel_size - 1, config.hidden_size, **like) for _ in encoder.encoders]
        self._subsampling = []
        bins = config.input_size
        for conv in encoder.embed.strided_convs():
            self._subsampling.append(torch.zeros(batch, conv.in_channels, 1, bins, **like))
            bins = -(-bins // 2)
        # The key/value cache is a ring of `blocks` chunks: chunk c goes to block c % blocks, so a
        # step writes only its own keys. Per phase p = c % blocks, key slot j holds the token
        # c * C + offsets[p, j] (offsets <= 0 for the older chunks), and the relative bias depends
        # only on these offsets: one (H, C, S) tensor per phase serves every step.
        block = np.arange(self._blocks)
        back = (np.arange(self._blocks)[:, None] - block[None, :]) % self._blocks  # (phase, block): chunks ago
        self._offsets = (-back[:, :, None] * self.chunk_size + np.arange(self.chunk_size)).reshape(self._blocks, -1)
        with torch.no_grad():
            queries = to_device(np.arange(self.chunk_size), self.device)
            offsets = to_device(self._offsets, self.device)
            layer = encoder.relative_attention_bias_layer
            self._bias = torch.cat([layer(queries, offsets[p]) for p in range(self._blocks)])  # (blocks, H, C, S)
        self._chunks = 0  # chunk steps since the last flush
        # Per slot: the chunk step at which its utterance began (reset_slots); 0 for all after a flush.
        self._start = np.zeros(self.batch_size, np.int64)
        # CUDA graphs of the chunk step, one per ring phase, captured on first use (None: eager).
        self._graphs: list[tuple[torch.cuda.CUDAGraph, torch.Tensor]] | None = None
        if cuda_graph:
            if self.device.type != "cuda":
                raise ValueError(f"cuda_graph needs the encoder on a CUDA device, got {self.device}")
            self._graphs = []
            self._static_chunk = torch.zeros(batch, self._chunk_frames, config.input_size, **like)
            self._static_masks = torch.ones(
                batch, self._chunk_frames + self._keys, dtype=torch.bool, device=self.device
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
        while self._buffer.counts.min() >= self._chunk_frames:
            steps.append(self._step())
        return self._emit(steps)

    def flush(self) -> torch.Tensor:
        """End the utterances: encode what is left (the last chunk zero-padded) and reset the stream.

        Returns ``(B, n, D)``, trimmed so that all outputs since the previous
        flush number ``ceil(max frames / time_reduction)``.
        """
        steps = []
        while self._buffer.counts.max(initial=0) > 0:
            steps.append(self._step())
        for cache in (*self._kv, *self._conv, *self._subsampling):
            cache.zero_()
        self._chunks = 0
        self._start[:] = 0
        return self._emit(steps, final=True)

    def reset_slots(self, slots: object) -> None:
        """Start new utterances in ``slots`` (slot indices) while the other slots go on.

        The slots' caches are zeroed and their token positions count from the
        next step, so a slot's outputs equal the forward of its own utterance
        whichever step it starts at. The slots must hold no buffered frames.
        For drivers that manage slots one by one with :meth:`step`; mixing this
        with :meth:`push`'s lock-step accounting (``last_lengths``) is not supported.
        """
        index = np.unique(np.asarray(slots, dtype=np.int64).reshape(-1))
        if index.size == 0:
            return
        if index.min() < 0 or index.max() >= self.batch_size:
            raise ValueError(f"slots must lie in [0, {self.batch_size}), got {index.tolist()}")
        if self._buffer.counts[index].any():
            raise ValueError(f"slots must hold no buffered frames to be reset, got {index.tolist()}")
        rows = to_device(index, self.device)
        with torch.no_grad():
            for kv in self._kv:
                kv[:, rows] = 0
            for cache in (*self._conv, *self._subsampling):
                cache[rows] = 0
        self._frames[index] = 0
        self._start[index] = self._chunks

    def step(self) -> torch.Tensor:
        """Encode the next chunk of every slot now: ``(B, chunk_size, D)``.

        Slots holding fewer than a chunk of frames are zero-padded, as the last
        chunk of an utterance is (a driver calls this only when each slot holds
        a whole chunk, its utterance's last frames, or nothing).
        :attr:`last_lengths` counts each slot's real tokens of this chunk.
        """
        valid = self._next_chunk_tokens()
        outputs = self._step()
        self.last_lengths = valid
        return outputs

    def _next_chunk_tokens(self) -> np.ndarray:
        """``(B,)`` real tokens of each slot in the next chunk, from the frames pushed so far."""
        position = self._chunks - self._start  # each slot's chunk index within its utterance
        return np.clip(self._valid_tokens() - position * self.chunk_size, 0, self.chunk_size)

    def step_frames(self, chunk: object, valid: object) -> torch.Tensor:
        """Encode one chunk given whole, bypassing the frame buffer: ``(B, chunk_size, D)``.

        For drivers that assemble each step's batch themselves (one chunk per
        slot per step). ``chunk``: ``(B, chunk_size * time_reduction, F)``
        frames, a host array or tensor (moved with
        :func:`~audiomask.transfer.to_device`) or a device tensor; ``valid``
        ``(B,)``: real frames per slot, at the start of its row (the rest is
        ignored). The stream must hold no buffered frames. Equals
        ``push(chunk, valid)`` followed by :meth:`step`.
        """
        if self._buffer.counts.any():
            raise ValueError("step_frames needs an empty frame buffer: finish what push() buffered with flush()")
        shape = (self.batch_size, self._chunk_frames, self._feature_size)
        if tuple(getattr(chunk, "shape", ())) != shape:
            raise ValueError(f"chunk must have shape {shape}, got {tuple(getattr(chunk, 'shape', ()))}")
        valid = host_lengths("valid", valid, self._chunk_frames, "chunk_size * time_reduction")
        if valid.size != self.batch_size:
            raise ValueError(f"valid must have {self.batch_size} entries (batch_size), got {valid.size}")
        self._frames += valid
        tokens = self._next_chunk_tokens()
        outputs = self._encode_chunk(chunk, valid)
        self.last_lengths = tokens
        return outputs

    def _step(self) -> torch.Tensor:
        """Encode the next chunk of every slot from the frame buffer: ``(B, chunk_size, D)``."""
        return self._encode_chunk(*self._buffer.take(self._chunk_frames))

    @torch.no_grad()
    def _encode_chunk(self, chunk: object, valid: np.ndarray) -> torch.Tensor:
        """Encode ``chunk`` ``(B, chunk_frames, F)`` with ``valid`` real frames per slot; advance one chunk."""
        phase = self._chunks % self._blocks
        # Token held by each key slot; valid from token 0 to each utterance's last (host numpy).
        tokens = ((self._chunks - self._start) * self.chunk_size)[:, None] + self._offsets[phase]
        keys_valid = (tokens >= 0) & (tokens < self._valid_tokens()[:, None])
        if self._graphs is not None:
            if not self._graphs:
                self._capture()
            self._chunk_on_device(chunk, out=self._static_chunk)
            to_device(
                np.concatenate([padding_mask(valid, self._chunk_frames), keys_valid], axis=1),
                self.device,
                out=self._static_masks,
            )
            graph, outputs = self._graphs[phase]
            graph.replay()
            self._chunks += 1
            return outputs.clone()  # the graph's output is overwritten by its next replay
        chunk = self._chunk_on_device(chunk)
        frames_full, keys_full = bool(valid.min() == self._chunk_frames), bool(keys_valid.all())
        # The masks that are not all True, in one host array and one copy.
        host = ([] if frames_full else [padding_mask(valid, self._chunk_frames)]) + ([] if keys_full else [keys_valid])
        masks = to_device(np.concatenate(host, axis=1), self.device) if host else None
        frame_valid = None if frames_full else masks[:, : self._chunk_frames]  # type: ignore[index]
        key_mask = None if keys_full else masks[:, masks.shape[1] - self._keys :]  # type: ignore[index]
        outputs = self._run_chunk(chunk, frame_valid, key_mask, phase)
        self._chunks += 1
        return outputs

    def _chunk_on_device(self, chunk: object, out: torch.Tensor | None = None) -> torch.Tensor:
        """``chunk`` on the device in the encoder's dtype (written into ``out`` where given).

        A host chunk of another dtype (float32 features for a bf16 encoder)
        under :func:`~audiomask.transfer.parallel_copy_bytes` is copied as it is
        and cast on the device: a cast on the host runs on torch's intra-op
        pool, whose threads then spin on the cores that a front-end process
        computes on (bench/results/latency_pipeline_full_h200.json: the driver's
        front end in its own process beside a bf16 encoder ran 4.9x slower than
        alone, B = 16: 655 KB of frames). From that size the staging memcpy runs
        on that pool anyway, and a cast while staging halves the bytes that
        cross the bus and the pinned memory they take.
        """
        host = chunk if isinstance(chunk, torch.Tensor) else np.asarray(chunk)
        host_dtype = host.dtype if isinstance(host, torch.Tensor) else torch_dtype_of(host.dtype)
        on_device = isinstance(host, torch.Tensor) and host.device == self.device
        nbytes = host.numel() * host.element_size() if isinstance(host, torch.Tensor) else host.nbytes
        if on_device or host_dtype in (None, self.dtype) or nbytes >= parallel_copy_bytes():
            return to_device(chunk, self.device, dtype=self.dtype, out=out)
        staged = to_device(chunk, self.device)
        if out is None:
            return staged.to(self.dtype)
        return out.copy_(staged)

    def _run_chunk(
        self, chunk: torch.Tensor, frame_valid: torch.Tensor | None, key_mask: torch.Tensor | None, phase: int
    ) -> torch.Tensor:
        """The device work of a chunk step (``None`` masks: all True); what a CUDA graph captures per phase."""
        encoder = self.encoder
        hidden = encoder.embed(encoder.encoder_embedding(chunk), frame_valid, self._subsampling, exact=True)
        bias = self._bias[phase : phase + 1]  # (1, H, C, S)
        if key_mask is not None:
            bias = torch.where(key_mask[:, None, None], bias, torch.finfo(self.dtype).min)  # (B, H, C, S)
        slot = phase * self.chunk_size
        for block, kv, conv in zip(encoder.encoders, self._kv, self._conv):
            hidden = block(hidden, bias, kv, conv, slot)
        return hidden

    def _capture(self) -> None:
        """Capture one CUDA graph of :meth:`_run_chunk` per key/value ring phase, on static inputs.

        The graphs always apply both masks (an all-True mask changes no value),
        so one graph per phase serves every step. Capturing needs warm-up runs,
        which write the caches; it happens before the first chunk is encoded,
        when every cache is still zero (made so, reset or flushed), so zeroing
        them afterwards restores them (a saved copy would cost as much device
        memory as the caches: ~8 MB per stream for the full-size encoder). The
        warm-up's activations are handed back to the device before capture, so
        that the graphs' pool can take that memory rather than leave it cached
        for eager work that a graph-driven stream never runs.
        """
        caches = (*self._kv, *self._conv, *self._subsampling)
        frame_valid = self._static_masks[:, : self._chunk_frames]
        key_mask = self._static_masks[:, self._chunk_frames :]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for phase in range(self._blocks):  # warm-up: lazy initialisation stays out of the graphs
                self._run_chunk(self._static_chunk, frame_valid, key_mask, phase)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        pool = torch.cuda.graph_pool_handle()
        for phase in range(self._blocks):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs = self._run_chunk(self._static_chunk, frame_valid, key_mask, phase)
            self._graphs.append((graph, outputs))
        for cache in caches:
            cache.zero_()


class Qwen3ASRStream(_Stream):
    """Streaming of :class:`~audiomask.models.qwen3_asr.Qwen3ASREncoder`, one conv chunk at a time.

    Each completed chunk of ``2 * n_window`` frames (100) goes through the
    conv stack once and its tokens (13) join the current attention window.
    When a window is complete (8 chunks, 104 tokens) the transformer layers
    run over it once, and its outputs are final: they equal the offline
    forward's. :meth:`partial` re-attends only the current, incomplete window
    (the tokens of its completed chunks plus the chunk in progress) for a
    provisional look; :meth:`flush` ends the utterances and returns the last
    window, its last chunk zero-padded (equal to the offline forward when the
    offline input is zero beyond each length).

    ``push(features (B, 128, t), lengths=None) -> (B, n, D)``: ``n`` a
    multiple of the window length, possibly 0.

    >>> from audiomask.models.qwen3_asr import Qwen3ASRConfig, Qwen3ASREncoder
    >>> config = Qwen3ASRConfig(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=8, d_model=8,
    ...                         downsample_hidden_size=2)
    >>> stream = Qwen3ASREncoder(config).eval().stream()
    >>> tuple(stream.push(torch.randn(1, 128, 850)).shape)  # 8 chunks of 100 frames: one window
    (1, 104, 8)
    >>> tuple(stream.partial().shape), tuple(stream.flush().shape)  # 50 frames left: 7 tokens
    ((1, 7, 8), (1, 7, 8))
    """

    def __init__(self, encoder: Qwen3ASREncoder, batch_size: int) -> None:
        config = encoder.config
        super().__init__(encoder, batch_size, config.num_mel_bins, time_dim=2, output_size=config.d_model)
        self.encoder = encoder
        self._window = torch.zeros(
            self.batch_size, config.window_tokens, config.d_model, device=self.device, dtype=self.dtype
        )
        self._window_tokens = np.zeros(self.batch_size, np.int64)  # valid tokens in the current window
        self._window_chunks = 0  # chunks in the current window

    def push(self, features: torch.Tensor, lengths: object = None) -> torch.Tensor:
        """Append ``features`` ``(B, num_mel_bins, t)``; returns the windows completed, ``(B, n, D)``.

        ``lengths`` ``(B,)``: how many of the ``t`` frames are real in each slot (default all).
        """
        self._push_frames(features, lengths)
        return self._emit(self._encode_chunks(lambda counts: counts.min() >= self.encoder.config.chunk_frames))

    @torch.no_grad()
    def partial(self) -> torch.Tensor:
        """Provisional outputs of the current window, ``(B, m, D)``; changes nothing.

        The frames waiting in the buffer (up to the window's end, the last
        chunk zero-padded) are conv-encoded on the fly; only the current
        window is attended, as the offline forward of the frames so far would.
        """
        config = self.encoder.config
        room = (config.chunks_per_window - self._window_chunks) * config.chunk_frames
        pending = np.minimum(self._buffer.counts, room)
        window = self._window
        if pending.max(initial=0) > 0:
            window = window.clone()
            self._embed_into(window, self._buffer.frames[:, : int(pending.max())])
        lengths = self._window_tokens + self.encoder.output_lengths(pending)
        return self.encoder.encode_windows(window, lengths)[:, : lengths.max(initial=0)]

    def flush(self) -> torch.Tensor:
        """End the utterances: encode the rest (the last chunk zero-padded) and reset; ``(B, n, D)``.

        Trimmed so that all outputs since the previous flush number the
        offline forward's ``N_max`` tokens.
        """
        windows = self._encode_chunks(lambda counts: counts.max(initial=0) > 0)
        if self._window_chunks:
            windows.append(self._close_window())
        return self._emit(windows, final=True)

    def _valid_tokens(self) -> np.ndarray:
        return self.encoder.output_lengths(self._frames)

    def _embed_into(self, window: torch.Tensor, frames: torch.Tensor) -> None:
        """Conv-encode ``frames`` ``(B, t, mel)`` (whole chunks, the last zero-padded) into the window's next places."""
        config = self.encoder.config
        chunks = -(-frames.shape[1] // config.chunk_frames)
        frames = torch.nn.functional.pad(frames, (0, 0, 0, chunks * config.chunk_frames - frames.shape[1]))
        batch, _, bins = frames.shape
        chunked = frames.reshape(batch * chunks, config.chunk_frames, bins).transpose(1, 2)
        start = self._window_chunks * config.chunk_tokens
        tokens = self.encoder.embed_chunks(chunked).reshape(batch, chunks * config.chunk_tokens, -1)
        window[:, start : start + tokens.shape[1]] = tokens

    @torch.no_grad()
    def _encode_chunks(self, more: Callable[[np.ndarray], bool]) -> list[torch.Tensor]:
        """Conv-encode chunks into the window while ``more(buffered frame counts)``; the windows completed."""
        config = self.encoder.config
        windows = []
        while more(self._buffer.counts):
            chunk, valid = self._buffer.take(config.chunk_frames)
            self._embed_into(self._window, chunk)
            self._window_tokens += self.encoder.output_lengths(valid)
            self._window_chunks += 1
            if self._window_chunks == config.chunks_per_window:
                windows.append(self._close_window())
        return windows

    @torch.no_grad()
    def _close_window(self) -> torch.Tensor:
        """The outputs of the current window ``(B, window_tokens, D)``; starts the next one."""
        outputs = self.encoder.encode_windows(self._window, self._window_tokens)
        self._window.zero_()
        self._window_tokens[:] = 0
        self._window_chunks = 0
        return outputs
