"""Streaming of the Qwen3-ASR audio encoder: conv chunks as they complete, attention once per window.

Completed attention windows equal the offline forward; the last window of an
utterance (its last chunk zero-padded) equals it when the offline input is
zero beyond each length, as the front end's padding makes it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from audiomask.constants import FRAME_MS
from audiomask.features import WhisperFrontend
from audiomask.features.frontend import Frontend
from audiomask.models.qwen3_asr import Qwen3ASREncoder
from audiomask.streaming.buffer import BufferedSlots
from audiomask.streaming.plan import ChunkPlan, block_samples
from audiomask.transfer import to_device

__all__ = ["Qwen3ASRSlots"]


class Qwen3ASRSlots(BufferedSlots):
    """Streaming of :class:`~audiomask.models.qwen3_asr.Qwen3ASREncoder`, one conv chunk at a time.

    Args:
        encoder: the encoder (its device and dtype are the slots').
        batch_size: slots ``B``, ``>= 1``.
        plan: a :class:`~audiomask.streaming.ChunkPlan` of this family (:meth:`make_plan`); ``None``: the
            encoder's (its chunk is fixed).

    Each completed chunk of ``2 * n_window`` frames (100) goes through the
    conv stack once and its tokens (13) join its slot's current attention
    window. When a window is complete (8 chunks, 104 tokens) the transformer
    layers run over it once, and its outputs are final: they equal the offline
    forward's. :meth:`partial` re-attends only the current, incomplete window
    (the tokens of its completed chunks plus the chunk in progress) for a
    provisional look; :meth:`flush` ends the utterances and returns the last
    window, its last chunk zero-padded (equal to the offline forward when the
    offline input is zero beyond each length).

    ``push(features (B, 128, t), lengths=None) -> (B, n, D)``: ``n`` a
    multiple of the window length, possibly 0. :meth:`step` takes one chunk of
    every slot (a driver's batch) and returns the windows it completes: each
    slot's own (its 8th chunk since :meth:`reset_slots`, or its ``final`` one).

    >>> from audiomask.models import Qwen3ASRConfig, Qwen3ASREncoder
    >>> config = Qwen3ASRConfig(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=8, d_model=8,
    ...                         downsample_hidden_size=2)
    >>> slots = Qwen3ASRSlots(Qwen3ASREncoder(config).eval())
    >>> tuple(slots.push(torch.randn(1, 128, 850)).shape)  # 8 chunks of 100 frames: one window
    (1, 104, 8)
    >>> tuple(slots.partial().shape), tuple(slots.flush().shape)  # 50 frames left: 7 tokens
    ((1, 7, 8), (1, 7, 8))
    """

    def __init__(self, encoder: Qwen3ASREncoder, batch_size: int = 1, *, plan: ChunkPlan | None = None) -> None:
        if not isinstance(encoder, Qwen3ASREncoder):
            raise ValueError(f"encoder must be a Qwen3ASREncoder, got {type(encoder).__name__}")
        config = encoder.config
        plan = self.make_plan(encoder) if plan is None else self._given_plan(plan)
        super().__init__(encoder, batch_size, config.num_mel_bins, time_dim=2, output_size=config.d_model, plan=plan)
        self.encoder = encoder
        self._window = torch.zeros(
            self.batch_size, config.window_tokens, config.d_model, device=self.device, dtype=self.dtype
        )
        self._window_tokens = np.zeros(self.batch_size, np.int64)  # valid tokens in each slot's current window
        # Per slot: the chunks of its utterance added so far (reset_slots and flush restart it).
        self._position = np.zeros(self.batch_size, np.int64)

    @classmethod
    def default_frontend(cls) -> WhisperFrontend:
        """The Qwen3-ASR front end (:meth:`WhisperFrontend.qwen3_asr`): 128 mels, ``(128, T)``, centred frames."""
        return WhisperFrontend.qwen3_asr()

    @classmethod
    def _plan(
        cls, encoder: object, chunk_ms: int | None, left_chunks: int | None, cuda_graph: bool | None, frontend: Frontend
    ) -> ChunkPlan:
        """Chunks of the conv chunk (``2 * n_window`` frames) only, no left context (windows), no CUDA graphs.

        A step returns whole windows (``tokens_per_chunk``: a window's tokens); the state per slot is its
        window ``(window_tokens, D)``; the tokens of a window are bidirectional, so no chunk-causal context.
        """
        if not isinstance(encoder, Qwen3ASREncoder):
            raise ValueError(f"encoder must be a Qwen3ASREncoder, got {type(encoder).__name__}")
        config = encoder.config
        chunk = config.chunk_frames * FRAME_MS
        if chunk_ms not in (None, chunk):
            raise ValueError(f"chunk_ms must be {chunk} (Qwen3-ASR's conv chunk) or None, got {chunk_ms}")
        if left_chunks is not None:
            raise ValueError(
                f"left_chunks must be None for Qwen3-ASR (it attends inside fixed windows), got {left_chunks}"
            )
        if cuda_graph:
            raise ValueError("cuda_graph must be False or None for Qwen3-ASR: its slots have no CUDA graph")
        first_block, block = block_samples(frontend, config.chunk_frames)
        return ChunkPlan(
            family=cls.__name__,
            chunk_ms=chunk,
            chunk_frames=config.chunk_frames,
            tokens_per_chunk=config.window_tokens,
            chunk_tokens=config.chunk_tokens,
            left_chunks=None,
            left_tokens=None,
            first_block_samples=first_block,
            block_samples=block,
            cuda_graph=False,
            slot_bytes=config.window_tokens * config.d_model * next(encoder.parameters()).element_size(),
            shared_bytes=0,
        )

    def push(self, features: torch.Tensor, lengths: object = None) -> torch.Tensor:
        """Append ``features`` ``(B, num_mel_bins, t)``; returns the windows completed, ``(B, n, D)``.

        ``lengths`` ``(B,)``: how many of the ``t`` frames are real in each slot (default all).
        """
        self._push_frames(features, lengths)
        return self._emit(self._encode_chunks(lambda counts: counts.min() >= self.chunk_frames))

    @torch.no_grad()
    def partial(self) -> torch.Tensor:
        """Provisional outputs of the current window, ``(B, m, D)``; changes nothing.

        The frames waiting in the buffer (up to the window's end, the last
        chunk zero-padded) are conv-encoded on the fly; only the current
        window is attended, as the offline forward of the frames so far would.
        """
        filled = self._window_chunks()
        room = (self.encoder.config.chunks_per_window - filled) * self.chunk_frames
        pending = np.minimum(self._buffer.counts, room)
        window = self._window
        if pending.max(initial=0) > 0:
            window = window.clone()
            self._embed_into(window, self._buffer.frames[:, : int(pending.max())], filled)
        lengths = self._window_tokens + self.encoder.output_lengths(pending)
        return self.encoder.encode_windows(window, lengths)[:, : lengths.max(initial=0)]

    def flush(self) -> torch.Tensor:
        """End the utterances: encode the rest (the last chunk zero-padded) and reset; ``(B, n, D)``.

        Trimmed so that all outputs since the previous flush number the
        offline forward's ``N_max`` tokens.
        """
        windows = self._encode_chunks(lambda counts: counts.max(initial=0) > 0)
        if self._window_chunks().max(initial=0) > 0:
            windows.append(self._close_windows(np.ones(self.batch_size, bool)))
        outputs = self._emit(windows, final=True)
        self._position[:] = 0
        return outputs

    def reset_slots(self, slots: object) -> None:
        """Start new utterances in ``slots`` (slot indices) while the other slots go on.

        The slots' windows are emptied and their chunks count from the next
        step, so each slot's windows are those of its own utterance. The slots
        must hold no buffered frames. For drivers that manage slots one by one
        with :meth:`step`; mixing this with :meth:`push` is not supported.
        """
        index = self._check_slots(slots)
        if index.size == 0:
            return
        with torch.no_grad():
            self._window.index_fill_(0, to_device(index, self.device), 0)
        self._window_tokens[index] = 0
        self._frames[index] = 0
        self._position[index] = 0

    @torch.no_grad()
    def step(
        self, chunk: object, valid: object, final: object = None, active: object = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Add one chunk to every active slot's window: ``(outputs (B, n, D), lengths (B,))``, ``n`` 0 or 104.

        ``chunk``: ``(B, num_mel_bins, 2 * n_window)`` frames, a host array or
        tensor (moved with :func:`~audiomask.transfer.to_device`) or a device
        tensor, zero after each slot's ``valid`` ``(B,)`` real frames. A slot's
        window is emitted (and emptied) with its 8th chunk or its ``final``
        ``(B,)`` one; the outputs hold every slot's window when any is emitted,
        ``lengths`` counting the real tokens of the emitted ones (0 for the others).
        ``active`` ``(B,)``: the slots that take this chunk (default all); the
        others keep their windows (see :meth:`~audiomask.streaming.EncoderSlots.step`).
        Only the windows that close are attended. The slots must hold no buffered frames.
        """
        valid, final, active = self._check_step(chunk, valid, final, active)
        frames = self._chunk_on_device(chunk).transpose(1, 2)  # (B, chunk_frames, mel), as the buffer holds them
        filled = self._add_chunk(frames, valid, active)
        self._frames += valid
        closing = active & ((filled == self.encoder.config.chunks_per_window) | final)
        lengths = np.where(closing, self._window_tokens, 0)
        outputs = self._close_windows(closing) if lengths.any() else self._no_outputs()
        self._window_tokens[closing] = 0
        self.last_lengths = lengths
        return outputs, lengths

    def _valid_tokens(self) -> np.ndarray:
        return self.encoder.output_lengths(self._frames)

    def _window_chunks(self) -> np.ndarray:
        """``(B,)`` chunks in each slot's current window."""
        return self._position % self.encoder.config.chunks_per_window

    def _embed_into(self, window: torch.Tensor, frames: torch.Tensor, first: np.ndarray) -> None:
        """Conv-encode ``frames`` ``(B, t, mel)`` (whole chunks, the last zero-padded) into each slot's window.

        Slot ``b``'s tokens go after its first ``first[b]`` chunks' places.
        """
        config = self.encoder.config
        chunks = -(-frames.shape[1] // config.chunk_frames)
        frames = torch.nn.functional.pad(frames, (0, 0, 0, chunks * config.chunk_frames - frames.shape[1]))
        batch, _, bins = frames.shape
        chunked = frames.reshape(batch * chunks, config.chunk_frames, bins).transpose(1, 2)
        tokens = self.encoder.embed_chunks(chunked).reshape(batch, chunks * config.chunk_tokens, -1)
        starts = first * config.chunk_tokens
        if (starts == starts[0]).all():  # lock step: one slice for every slot
            window[:, starts[0] : starts[0] + tokens.shape[1]] = tokens
            return
        columns = starts[:, None] + np.arange(tokens.shape[1])
        rows, columns = to_device(np.stack(np.broadcast_arrays(np.arange(batch)[:, None], columns)), self.device)
        window[rows, columns] = tokens

    def _add_chunk(self, frames: torch.Tensor, valid: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
        """Embed one chunk of every (``active``) slot ``(B, chunk_frames, mel)`` into its window; ``(B,)`` chunks there.

        An inactive slot's row is embedded too (one batched call), at its next
        chunk's place, beyond its window's real tokens: the attention never
        sees it, and its real next chunk overwrites it.
        """
        filled = self._window_chunks()
        self._embed_into(self._window, frames, filled)
        self._window_tokens += self.encoder.output_lengths(valid)
        moved = 1 if active is None else active
        self._position += moved
        return filled + moved

    @torch.no_grad()
    def _encode_chunks(self, more: Callable[[np.ndarray], bool]) -> list[torch.Tensor]:
        """Conv-encode chunks into the windows while ``more(buffered frame counts)``; the windows completed."""
        windows = []
        while more(self._buffer.counts):
            chunk, valid = self._buffer.take(self.chunk_frames)
            filled = self._add_chunk(chunk, valid)
            if filled.max() == self.encoder.config.chunks_per_window:  # lock step: every slot's window is full
                windows.append(self._close_windows(np.ones(self.batch_size, bool)))
        return windows

    @torch.no_grad()
    def _close_windows(self, closing: np.ndarray) -> torch.Tensor:
        """Attend the ``closing`` slots' windows and start them anew: ``(B, window_tokens, D)``, zero elsewhere.

        Only the closing windows are attended (utterances that started at
        different times close their windows at different steps, so a step
        attends about one window in eight per slot, not every slot's).
        """
        if closing.all():
            outputs = self.encoder.encode_windows(self._window, self._window_tokens)
            self._window.zero_()
        else:
            slots = np.flatnonzero(closing)
            rows = to_device(slots, self.device)
            outputs = torch.zeros_like(self._window)
            outputs.index_copy_(0, rows, self.encoder.encode_windows(self._window[rows], self._window_tokens[slots]))
            self._window.index_fill_(0, rows, 0)
        self._window_tokens[closing] = 0
        return outputs
