"""What the slots of every encoder family share: the frame buffer, lock-step ``push`` accounting, input checks.

:class:`FrameBuffer` holds the feature frames pushed to each slot until they
fill a chunk; :class:`BufferedSlots` is the base of
:class:`~audiomask.streaming.Phi4MMSlots` and
:class:`~audiomask.streaming.Qwen3ASRSlots`: the checks of ``push`` and
``step`` inputs, the count of real tokens per slot, the move of a chunk to
the device.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch
from torch import nn

from audiomask.checks import check_int
from audiomask.models.layers import host_lengths
from audiomask.ragged import ragged_index
from audiomask.streaming.plan import ChunkPlan
from audiomask.streaming.protocol import EncoderSlots
from audiomask.transfer import parallel_copy_bytes, to_device, torch_dtype_of

__all__ = ["BufferedSlots", "FrameBuffer"]


class FrameBuffer:
    """Feature frames pushed to each slot, waiting to fill a chunk.

    ``frames`` is a ``(B, P, F)`` tensor on the encoder's device; slot ``b``
    holds ``counts[b]`` frames at its start and zeros after them (the zeros
    are the end-of-utterance padding of a final partial chunk).
    """

    def __init__(self, batch_size: int, feature_size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.frames = torch.zeros(batch_size, 0, feature_size, device=device, dtype=dtype)
        self.counts = np.zeros(batch_size, np.int64)

    def push(self, features: torch.Tensor, lengths: np.ndarray) -> None:
        """Append the first ``lengths[b]`` frames of ``features[b]`` ``(B, t, F)`` to slot ``b``."""
        batch, capacity, feature_size = self.frames.shape
        if batch and (lengths == lengths[0]).all() and (self.counts == self.counts[0]).all():
            # Lock step (every slot holds as many frames and gets as many): append along time,
            # no scatter and no index arrays to move. (The common case: equal pushes, full chunks.)
            count, length = int(self.counts[0]), int(lengths[0])
            moved = to_device(features[:, :length], self.frames.device, dtype=self.frames.dtype)
            if count:
                self.frames = torch.cat([self.frames[:, :count], moved], dim=1)
            else:  # an empty buffer: the moved frames are the buffer (a copy, never the caller's tensor)
                self.frames = moved.clone() if moved.data_ptr() == features.data_ptr() else moved
            self.counts += length
            return
        needed = int((self.counts + lengths).max(initial=0))
        if needed > capacity:
            grown = self.frames.new_zeros(batch, needed - capacity, feature_size)
            self.frames = torch.cat([self.frames, grown], dim=1)
        # One scatter for all slots, whatever their lengths: (slot, source frame) -> (slot, count + frame).
        slots, source = ragged_index(lengths)
        slots, source, target = to_device(np.stack([slots, source, source + self.counts[slots]]), self.frames.device)
        features = to_device(features, self.frames.device, dtype=self.frames.dtype)
        self.frames[slots, target] = features[slots, source]
        self.counts += lengths

    def take(self, frames: int) -> tuple[torch.Tensor, np.ndarray]:
        """Remove the first ``frames`` frames of every slot: ``(chunk (B, frames, F), valid (B,))``.

        Slots with fewer frames give what they hold, zero-padded; ``valid``
        counts the real ones.
        """
        short = frames - self.frames.shape[1]
        if short > 0:
            self.frames = nn.functional.pad(self.frames, (0, 0, 0, short))
        chunk, self.frames = self.frames[:, :frames], self.frames[:, frames:]
        valid = np.minimum(self.counts, frames)
        self.counts -= valid
        return chunk, valid


class BufferedSlots(EncoderSlots):
    """The shared part of the slots classes: the batch, the frame buffer, input checks and ``last_lengths`` accounting.

    :attr:`chunk_frames`, :attr:`tokens_per_chunk` and :attr:`left_chunk` are
    the ``plan``'s. A subclass implements :meth:`_valid_tokens` (real output
    tokens of the frames pushed to each slot) besides the protocol's methods.
    """

    def __init__(
        self, module: nn.Module, batch_size: int, feature_size: int, time_dim: int, output_size: int, plan: ChunkPlan
    ) -> None:
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.plan = plan
        self.chunk_frames, self.tokens_per_chunk, self.left_chunk = (
            plan.chunk_frames,
            plan.tokens_per_chunk,
            plan.left_chunks,
        )
        parameter = next(module.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.feature_size, self.time_dim, self.output_size = feature_size, time_dim, output_size
        self._buffer = FrameBuffer(self.batch_size, feature_size, self.device, self.dtype)
        self._frames = np.zeros(self.batch_size, np.int64)  # frames per slot since its utterance began
        self._emitted = 0  # output tokens (per slot, valid or padding) push/flush returned since the last flush
        self.last_lengths = np.zeros(self.batch_size, np.int64)

    @classmethod
    def _given_plan(cls, plan: object) -> ChunkPlan:
        """``plan`` checked: a :class:`~audiomask.streaming.ChunkPlan` of this class's slots."""
        if not isinstance(plan, ChunkPlan):
            raise ValueError(f"plan must be a ChunkPlan of a {cls.__name__}, got {type(plan).__name__}")
        if plan.family != cls.__name__:
            raise ValueError(f"plan must be a ChunkPlan of a {cls.__name__}, got one of a {plan.family}")
        return plan

    def _push_frames(self, features: torch.Tensor, lengths: object) -> None:
        """Check ``features`` and append them to the buffer (time on dim 1 there)."""
        feature_dim = 3 - self.time_dim
        if (
            not isinstance(features, torch.Tensor)
            or features.ndim != 3
            or features.shape[0] != self.batch_size
            or features.shape[feature_dim] != self.feature_size
        ):
            shape = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
            layout = ["t", "t"]
            layout[feature_dim - 1] = str(self.feature_size)
            raise ValueError(
                f"features must be a tensor of shape ({self.batch_size}, {', '.join(layout)}), got {shape}"
            )
        frames = features.shape[self.time_dim]
        lengths = np.full(self.batch_size, frames) if lengths is None else host_lengths("lengths", lengths, frames, "t")
        if lengths.size != self.batch_size:
            raise ValueError(f"lengths must have {self.batch_size} entries (batch_size), got {lengths.size}")
        self._buffer.push(features.transpose(1, self.time_dim), lengths)
        self._frames += lengths

    @abstractmethod
    def _valid_tokens(self) -> np.ndarray:
        """``(B,)`` output tokens of the frames pushed to each slot since its utterance began (per encoder)."""

    def _emit(self, pieces: list[torch.Tensor], *, final: bool = False) -> torch.Tensor:
        """Join the step outputs over time (``(B, 0, D)`` when none) and count the valid ones in :attr:`last_lengths`.

        ``final``: the flush; trim the outputs since the last flush to the
        longest utterance's tokens, then start new utterances.
        """
        if pieces:
            outputs = torch.cat(pieces, dim=1)
        else:
            outputs = self._no_outputs()
        valid = self._valid_tokens()
        if final:
            outputs = outputs[:, : int(valid.max(initial=0)) - self._emitted]
        self.last_lengths = np.clip(valid - self._emitted, 0, outputs.shape[1])
        self._emitted += outputs.shape[1]
        if final:
            self._frames[:] = 0
            self._emitted = 0
        return outputs

    def _no_outputs(self) -> torch.Tensor:
        """``(B, 0, D)``: the outputs of a call that completed nothing."""
        return torch.zeros(self.batch_size, 0, self.output_size, device=self.device, dtype=self.dtype)

    def _check_slots(self, slots: object) -> np.ndarray:
        """``slots`` as sorted unique slot indices, each in ``[0, B)`` and holding no buffered frames."""
        index = np.unique(np.asarray(slots, dtype=np.int64).reshape(-1))
        if index.size and (index.min() < 0 or index.max() >= self.batch_size):
            raise ValueError(f"slots must lie in [0, {self.batch_size}), got {index.tolist()}")
        if self._buffer.counts[index].any():
            raise ValueError(f"slots must hold no buffered frames to be reset, got {index.tolist()}")
        return index

    def _check_step(
        self, chunk: object, valid: object, final: object, active: object = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The checked ``valid`` ``(B,)`` int64, ``final`` and ``active`` ``(B,)`` bool of a :meth:`step`."""
        if self._buffer.counts.any():
            raise ValueError("step needs an empty frame buffer: finish what push() buffered with flush()")
        if tuple(getattr(chunk, "shape", ())) != self.chunk_shape:
            raise ValueError(f"chunk must have shape {self.chunk_shape}, got {tuple(getattr(chunk, 'shape', ()))}")
        valid = host_lengths("valid", valid, self.chunk_frames, "chunk_frames")
        if valid.size != self.batch_size:
            raise ValueError(f"valid must have {self.batch_size} entries (batch_size), got {valid.size}")
        final, active = (self._slot_flags(name, flags) for name, flags in (("final", final), ("active", active)))
        if final is None:
            final = np.zeros(self.batch_size, bool)
        if active is None:
            return valid, final, np.ones(self.batch_size, bool)
        skipped = np.flatnonzero(~active & ((valid > 0) | final))
        if skipped.size:
            raise ValueError(
                f"slot {int(skipped[0])} is not active but has valid={int(valid[skipped[0]])} frames or final=True: "
                "an inactive slot takes no frames and cannot end"
            )
        return valid, final, active

    def _slot_flags(self, name: str, flags: object) -> np.ndarray | None:
        """``flags`` checked as ``None`` or a ``(B,)`` bool host array."""
        if flags is None:
            return None
        flags = np.asarray(flags)
        if flags.dtype != np.bool_ or flags.shape != (self.batch_size,):
            raise ValueError(
                f"{name} must be None or a ({self.batch_size},) bool array, got {flags.dtype} {flags.shape}"
            )
        return flags

    def _chunk_on_device(self, chunk: object, out: torch.Tensor | None = None) -> torch.Tensor:
        """``chunk`` on the device in the encoder's dtype (written into ``out`` where given).

        A host chunk of another dtype (float32 features for a bf16 encoder)
        under :func:`~audiomask.transfer.parallel_copy_bytes` is copied as it is
        and cast on the device: a cast on the host runs on torch's intra-op
        pool, whose threads then spin on the cores that a front-end process
        computes on (on the H200 a driver's front end in its own process beside
        a bf16 encoder ran 4.9x slower than alone, B = 16: 655 KB of frames).
        From that size the staging memcpy runs on that pool anyway, and a cast
        while staging halves the bytes that cross the bus and the pinned memory
        they take.
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
