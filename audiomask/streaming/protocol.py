"""The chunk-step protocol every encoder family's slots implement: what a streaming driver relies on.

An :class:`EncoderSlots` holds ``B`` *slots* of one encoder, batch rows with
their caches preallocated on the encoder's device. A driver fills the slots
with utterances' streams and advances all of them one chunk per :meth:`~EncoderSlots.step`:

- ``chunk_frames`` feature frames per slot and step, laid out as the front
  end makes them (:attr:`~EncoderSlots.time_dim`: 1 for ``(B, T, F)``, 2 for
  ``(B, F, T)``); a chunk's tokens need no frame beyond the chunk, so a
  driver steps as soon as every slot holds its next chunk (or has ended);
- the outputs of a step are at most ``tokens_per_chunk`` tokens per slot,
  ``(B, n, D)``, of which ``lengths[b]`` are real (they come first), and are
  final: no later step revises them;
- :meth:`~EncoderSlots.reset_slots` starts new utterances in some slots while
  the others go on; a slot's outputs do not depend on the other slots;
- :meth:`~EncoderSlots.default_frontend` is the front end whose features the
  family takes (its frames, mel bins and layout);
- :meth:`~EncoderSlots.make_plan` sizes a configuration of the family (a
  :class:`~audiomask.streaming.ChunkPlan`: chunk, tokens, blocks of samples,
  state bytes) without allocating; slots opened from it hold it as ``plan``.

``push``/``flush`` are the lock-step interface for callers that hold whole
batches of frames (every slot starts together; any piece sizes).

Implementations: :class:`~audiomask.streaming.Phi4MMSlots`,
:class:`~audiomask.streaming.Qwen3ASRSlots`;
:func:`~audiomask.streaming.open_slots` opens the one of an encoder.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.features.frontend import Frontend
from audiomask.streaming.plan import ChunkPlan

__all__ = ["LANE_ATTRIBUTES", "EncoderSlots", "as_lanes", "share_graph_memory"]


class EncoderSlots(ABC):
    """``batch_size`` slots of one encoder, advanced one chunk step at a time (see the module docstring).

    Attributes every implementation sets:

    - ``batch_size`` (``B``), ``device``, ``dtype``: the slots and where (and
      in which dtype) their caches and outputs live: the encoder's.
    - ``feature_size``: mel bins per frame; ``time_dim``: the axis of time in
      a chunk, 1 (``(B, T, F)``) or 2 (``(B, F, T)``).
    - ``chunk_frames``: feature frames (10 ms each) per slot and step.
    - ``tokens_per_chunk``: the most tokens per slot one step returns.
    - ``output_size``: ``D``, the width of the output tokens.
    - ``left_chunk``: chunks of left context each chunk attends to, or
      ``None`` where the family's attention is not chunk-causal.
    - ``last_lengths``: ``(B,)`` int64, the real tokens of each slot in the
      outputs of the last ``step``, ``push`` or ``flush``.
    - ``plan``: the :class:`~audiomask.streaming.ChunkPlan` of its sizes
      (``chunk_frames``, ``tokens_per_chunk`` and ``left_chunk`` are its).
    """

    batch_size: int
    device: torch.device
    dtype: torch.dtype
    feature_size: int
    time_dim: int
    chunk_frames: int
    tokens_per_chunk: int
    output_size: int
    left_chunk: int | None
    last_lengths: np.ndarray
    plan: ChunkPlan

    @property
    def chunk_shape(self) -> tuple[int, int, int]:
        """The shape of the chunk :meth:`step` takes: ``(B, chunk_frames, F)`` or ``(B, F, chunk_frames)``."""
        if self.time_dim == 1:
            return (self.batch_size, self.chunk_frames, self.feature_size)
        return (self.batch_size, self.feature_size, self.chunk_frames)

    @classmethod
    @abstractmethod
    def default_frontend(cls) -> Frontend:
        """A new front end of the family: the features its slots take (frames, mel bins, layout)."""

    @classmethod
    def make_plan(
        cls,
        encoder: object,
        chunk_ms: int | None = None,
        left_chunks: int | None = None,
        *,
        cuda_graph: bool | None = None,
        frontend: Frontend | None = None,
    ) -> ChunkPlan:
        """The sizes of ``encoder``'s slots of this family: chunks of ``chunk_ms`` ms, ``left_chunks`` of context.

        ``chunk_ms``: a positive integer (the family says which); ``None``: the encoder's. ``left_chunks``:
        ``>= 0``, ``None``: the encoder's. ``cuda_graph``: replay steps as CUDA graphs; ``None``: where the
        encoder is on CUDA and the family has them. ``frontend``: the front end whose framing sets the blocks of
        samples (default :meth:`default_frontend`). Bad values raise ``ValueError`` naming the argument.
        """
        if chunk_ms is not None:
            chunk_ms = check_int("chunk_ms", chunk_ms, minimum=1)
        if left_chunks is not None:
            left_chunks = check_int("left_chunks", left_chunks, minimum=0)
        frontend = cls.default_frontend() if frontend is None else frontend
        return cls._plan(encoder, chunk_ms, left_chunks, cuda_graph, frontend)

    @classmethod
    @abstractmethod
    def _plan(
        cls, encoder: object, chunk_ms: int | None, left_chunks: int | None, cuda_graph: bool | None, frontend: Frontend
    ) -> ChunkPlan:
        """:meth:`make_plan` once its arguments are checked integers (or ``None``): the family's own sizes."""

    @abstractmethod
    def reset_slots(self, slots: object) -> None:
        """Start new utterances in ``slots`` (slot indices) from the next step on; the other slots go on.

        The slots' caches are cleared and their positions count from the next
        step, so a slot's outputs equal the offline forward of its own
        utterance whichever step it starts at.
        """

    @abstractmethod
    def step(
        self, chunk: object, valid: object, final: object = None, active: object = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Encode one chunk of every active slot: ``(outputs (B, n, D), lengths (B,) int64)``, ``n <= tokens_per_chunk``.

        Args:
            chunk: :attr:`chunk_shape` frames, a host array or tensor (moved
                with :func:`~audiomask.transfer.to_device`) or a tensor on
                :attr:`device`; each slot's real frames first, zeros after them.
            valid: ``(B,)`` real frames per slot, ``<= chunk_frames`` (host).
                Fewer than ``chunk_frames`` only in an utterance's last chunk.
            final: ``(B,)`` bool (host), the slot's utterance ends with this
                chunk; ``None``: no slot's does. Families whose outputs wait
                for more chunks (Qwen3-ASR's windows) emit them then.
            active: ``(B,)`` bool (host); ``None``: every slot. An inactive
                slot (one whose utterance's next chunk has not arrived) is left
                exactly as it was, as if the step had not happened for it:
                its ``valid`` is 0, it is not ``final``, its ``lengths`` is 0.
                The step still computes over all ``B`` rows (static shapes):
                skipping a slot lets the others go on, it saves no compute.

        ``lengths`` (also :attr:`last_lengths`) counts each slot's real tokens;
        they come first in its row. Nothing here waits for the device.
        """

    def use_graph_pool(self, pool: object) -> bool:
        """Capture this slots' CUDA graphs into ``pool``, a ``torch.cuda.graph_pool_handle()`` that slots which
        are never stepped at the same time, nor on another CUDA stream, share. Returns whether they will be:
        ``False`` for slots with no graphs still to capture (none, as this default has, or captured already,
        at the first step, in a pool of their own)."""
        del pool  # no graphs here
        return False

    @abstractmethod
    def push(self, features: torch.Tensor, lengths: object = None) -> torch.Tensor:
        """Append frames to every slot in lock step (any piece size); returns the outputs now final, ``(B, n, D)``."""

    @abstractmethod
    def flush(self) -> torch.Tensor:
        """End every slot's utterance: the remaining outputs ``(B, n, D)``; then the slots start afresh."""


# What every lane of a driver must share: its slots' steps and outputs are interchangeable.
LANE_ATTRIBUTES = ("device", "dtype", "feature_size", "time_dim", "chunk_frames", "tokens_per_chunk", "output_size")


def as_lanes(slots: object) -> tuple[EncoderSlots, ...]:
    """``slots`` (one :class:`EncoderSlots`, or a sequence of several of one encoder's) as a driver's lanes.

    Lanes must agree on every attribute a step's batch depends on (:data:`LANE_ATTRIBUTES`), so that an
    utterance's outputs are the same in any of them; their ``batch_size`` may differ. Raises
    :class:`ValueError` naming the first lane that differs.
    """
    lanes = (slots,) if isinstance(slots, EncoderSlots) else tuple(slots) if isinstance(slots, Sequence) else ()
    if not lanes or not all(isinstance(lane, EncoderSlots) for lane in lanes):
        raise ValueError(
            f"slots must be an EncoderSlots (audiomask.streaming) or a non-empty sequence of them, got "
            f"{type(slots).__name__}"
        )
    first = lanes[0]
    for index, lane in enumerate(lanes[1:], 1):
        if type(lane) is not type(first) or lane is first:
            raise ValueError(f"slots[{index}] must be another {type(first).__name__}, got {lane!r}")
        for name in LANE_ATTRIBUTES:
            if getattr(lane, name) != getattr(first, name):
                raise ValueError(
                    f"slots[{index}].{name} must equal slots[0]'s ({getattr(first, name)!r}): lanes step alike, "
                    f"got {getattr(lane, name)!r}"
                )
    return lanes


def share_graph_memory(lanes: tuple[EncoderSlots, ...]) -> tuple[EncoderSlots, ...]:
    """Give a driver's ``lanes`` (:func:`as_lanes`) one memory pool for their CUDA graphs; returns ``lanes``.

    A driver steps its lanes one at a time, in turn, on its one CUDA stream, so one lane's step has finished
    with its activations before the next lane's step begins: the lanes' graphs can take them from one pool
    instead of each keeping its own (each pool holds the largest activations of its step, gigabytes for
    thousands of full-size Phi-4MM slots). Only for lanes stepped so. Lanes off CUDA, without graphs, or whose
    graphs are captured already, are left as they are.
    """
    if len(lanes) > 1 and lanes[0].device.type == "cuda":
        pool = torch.cuda.graph_pool_handle()
        for lane in lanes:
            lane.use_graph_pool(pool)
    return lanes
