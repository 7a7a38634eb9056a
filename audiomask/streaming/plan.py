"""A streaming configuration's sizes, worked out once: :class:`ChunkPlan`, and the bounds every plan is within.

An encoder family's slots class turns an encoder, a chunk length in
milliseconds and a left context into a plan
(:meth:`~audiomask.streaming.EncoderSlots.make_plan`, for any encoder
through :func:`~audiomask.streaming.chunk_plan`): the chunk in frames and
tokens, the samples a driver gathers for each chunk, where each output token
starts, and the bytes of state its slots hold, by arithmetic on the config
(nothing is allocated). Slots are opened from a plan
(``open_slots(encoder, batch_size, plan=plan)``), and a recognizer, its memory
checks and its callers read their sizes from it.

>>> from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder
>>> from audiomask.streaming import chunk_plan
>>> encoder = Phi4MMEncoder(Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1,
...     num_attention_heads=2, ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2))
>>> plan = chunk_plan(encoder, chunk_ms=160, left_chunks=1)
>>> plan.chunk_frames, plan.tokens_per_chunk, plan.left_tokens, plan.first_block_samples, plan.block_samples
(16, 2, 2, 2800, 2560)
>>> plan.state_bytes(4) == plan.shared_bytes + 4 * plan.slot_bytes
True
"""

from __future__ import annotations

from dataclasses import dataclass

from audiomask.checks import check_int
from audiomask.constants import FRAME_MS
from audiomask.features.frontend import Frontend

__all__ = ["MAX_CHUNK_MS", "MAX_CONTEXT_MS", "MS_PER_S", "ChunkPlan", "block_samples"]

MS_PER_S = 1000
# Audio an utterance's chunk attends to, (left_chunks + 1) * chunk_ms: ten minutes (7,500 tokens of
# 80 ms) is far beyond any streaming setting; larger settings are refused before anything is allocated.
MAX_CONTEXT_MS = 10 * 60 * MS_PER_S
# Audio of one encoder chunk: a minute is far beyond any streaming setting (Qwen3-ASR's chunk is 1 s).
MAX_CHUNK_MS = 60 * MS_PER_S


def block_samples(frontend: Frontend, chunk_frames: int) -> tuple[int, int]:
    """16 kHz samples of an utterance's first block and of each later one: exactly ``chunk_frames`` frames each.

    The first chunk's last frame ends at ``hop * (chunk_frames - 1) + win`` samples of the padded signal.

    >>> from audiomask.features import Phi4MMFrontend
    >>> block_samples(Phi4MMFrontend(), 32)
    (5360, 5120)
    """
    framing = frontend.framing
    return framing.hop * (chunk_frames - 1) + framing.win - framing.pad, chunk_frames * framing.hop


@dataclass(frozen=True)
class ChunkPlan:
    """The sizes of one streaming configuration of an encoder (made by its family: see the module docstring).

    Attributes:
        family: the name of the slots class whose slots the plan opens (``"Phi4MMSlots"``, ...).
        chunk_ms: milliseconds of audio per chunk step, ``1 <= chunk_ms <= MAX_CHUNK_MS``.
        chunk_frames: feature frames (10 ms each) per slot and step: ``chunk_ms / 10``.
        tokens_per_chunk: the most output tokens one step returns per slot (Qwen3-ASR: a window's, 104).
        chunk_tokens: the output tokens one chunk of audio yields (Qwen3-ASR: a conv chunk's, 13).
        left_chunks: chunks of left context each chunk attends to; ``None`` where the family's attention
            is not chunk-causal (Qwen3-ASR attends inside windows). ``(left_chunks + 1) * chunk_ms`` is at
            most :data:`MAX_CONTEXT_MS`.
        left_tokens: output tokens of that left context (``None`` with ``left_chunks``).
        first_block_samples, block_samples: 16 kHz samples of an utterance's first chunk of audio and of each
            later one, for the front end the plan was made for (:func:`block_samples`).
        cuda_graph: the slots replay their chunk step as CUDA graphs.
        slot_bytes: bytes of state each slot holds on the encoder's device, in its dtype
            (Phi-4MM: the key/value cache of the context and the conv and subsampling caches of every
            block, and with CUDA graphs the step's static inputs; Qwen3-ASR: its attention window).
        shared_bytes: bytes a batch of slots holds on that device whatever its size (Phi-4MM: the relative
            position bias of each key/value ring phase). Besides these the slots keep a few int64
            counters per slot on the host.
    """

    family: str
    chunk_ms: int
    chunk_frames: int
    tokens_per_chunk: int
    chunk_tokens: int
    left_chunks: int | None
    left_tokens: int | None
    first_block_samples: int
    block_samples: int
    cuda_graph: bool
    slot_bytes: int
    shared_bytes: int

    def __post_init__(self) -> None:
        check_int("chunk_ms", self.chunk_ms, minimum=1, maximum=MAX_CHUNK_MS)
        left = self.left_chunks
        if left is not None and (left + 1) * self.chunk_ms > MAX_CONTEXT_MS:
            raise ValueError(
                f"left_chunks={left} with chunk_ms={self.chunk_ms}: a chunk attends to (left_chunks + 1) * "
                f"chunk_ms = {(left + 1) * self.chunk_ms} ms of audio, more than MAX_CONTEXT_MS = {MAX_CONTEXT_MS}"
            )

    @property
    def token_ms(self) -> int:
        """Milliseconds between two output tokens of a chunk: ``ceil(chunk_frames / chunk_tokens)`` frames."""
        return -(-self.chunk_frames // self.chunk_tokens) * FRAME_MS

    def state_bytes(self, slots: int) -> int:
        """Bytes of state a batch of ``slots`` slots holds on the encoder's device."""
        return self.shared_bytes + slots * self.slot_bytes
