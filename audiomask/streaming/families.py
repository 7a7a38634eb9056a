"""The slots of each encoder family, by encoder: :func:`chunk_plan`, :func:`open_slots`, :func:`default_frontend`.

The one place that maps encoder classes to their slots classes, so that drivers
and recognizers name no encoder family; what is a family's own (its sizes from
milliseconds, its token clock, its state bytes) is its slots class's. A
Phi-4MM encoder streams with
:class:`~audiomask.streaming.Phi4MMSlots` (chunks of any whole number of
tokens, chunk-causal attention), a Qwen3-ASR encoder with
:class:`~audiomask.streaming.Qwen3ASRSlots` (chunks of 1 s, attention in
windows of 8 chunks).
"""

from __future__ import annotations

from audiomask.features.frontend import Frontend
from audiomask.models.phi4mm import Phi4MMEncoder
from audiomask.models.qwen3_asr import Qwen3ASREncoder
from audiomask.streaming.phi4mm import Phi4MMSlots
from audiomask.streaming.plan import ChunkPlan
from audiomask.streaming.protocol import EncoderSlots
from audiomask.streaming.qwen3_asr import Qwen3ASRSlots

__all__ = ["chunk_plan", "default_frontend", "open_slots"]

_SLOTS_CLASSES: dict[type, type[EncoderSlots]] = {Phi4MMEncoder: Phi4MMSlots, Qwen3ASREncoder: Qwen3ASRSlots}


def _slots_class(encoder: object) -> type[EncoderSlots]:
    for encoder_class, slots_class in _SLOTS_CLASSES.items():
        if isinstance(encoder, encoder_class):
            return slots_class
    names = " or ".join(cls.__name__ for cls in _SLOTS_CLASSES)
    raise ValueError(f"encoder must be a {names}, got {type(encoder).__name__}")


def default_frontend(encoder: object) -> Frontend:
    """A new front end whose features ``encoder``'s family takes (``ValueError`` for any other object).

    >>> from audiomask.models import Qwen3ASRConfig, Qwen3ASREncoder
    >>> default_frontend(Qwen3ASREncoder(Qwen3ASRConfig(encoder_layers=1, d_model=8, encoder_attention_heads=2,
    ...     encoder_ffn_dim=8, downsample_hidden_size=2))).n_mels
    128
    """
    return _slots_class(encoder).default_frontend()


def chunk_plan(
    encoder: object,
    chunk_ms: int | None = None,
    left_chunks: int | None = None,
    *,
    cuda_graph: bool | None = None,
    frontend: Frontend | None = None,
) -> ChunkPlan:
    """The :class:`~audiomask.streaming.ChunkPlan` of ``encoder``'s slots: its family's sizes, nothing allocated.

    Args:
        encoder: a :class:`~audiomask.models.Phi4MMEncoder` or
            :class:`~audiomask.models.Qwen3ASREncoder`, on the device and in the dtype its slots will
            use (the state bytes are counted in that dtype).
        chunk_ms: milliseconds of audio per chunk step, at most :data:`~audiomask.streaming.plan.MAX_CHUNK_MS`.
            Phi-4MM: a multiple of one token (``10 * time_reduction`` ms); ``None``: the encoder config's
            ``chunk_size``. Qwen3-ASR: its conv chunk (``10 * 2 * n_window`` ms, 1000) or ``None``.
        left_chunks: chunks of left context (Phi-4MM; ``None``: the config's); ``(left_chunks + 1) *
            chunk_ms`` at most :data:`~audiomask.streaming.plan.MAX_CONTEXT_MS`. Qwen3-ASR attends inside its
            windows: ``None`` only.
        cuda_graph: replay the chunk step as CUDA graphs (Phi-4MM on CUDA); ``None``: where the encoder is
            on CUDA and the family has them.
        frontend: the front end whose framing sets the blocks of samples; ``None``: the family's.

    Bad values raise ``ValueError`` naming the argument and the value.
    """
    return _slots_class(encoder).make_plan(encoder, chunk_ms, left_chunks, cuda_graph=cuda_graph, frontend=frontend)


def open_slots(
    encoder: object,
    batch_size: int = 1,
    *,
    chunk_ms: int | None = None,
    left_chunks: int | None = None,
    cuda_graph: bool | None = None,
    plan: ChunkPlan | None = None,
) -> EncoderSlots:
    """The :class:`~audiomask.streaming.EncoderSlots` of ``encoder``'s family, ``batch_size`` slots.

    Args:
        encoder: as :func:`chunk_plan`'s, on the device the slots are to run on (the slots' caches are
            allocated there).
        batch_size: slots, ``>= 1``.
        chunk_ms, left_chunks, cuda_graph: the configuration, as :func:`chunk_plan` takes them.
        plan: instead of those three, the :func:`chunk_plan` of ``encoder`` to open (the slots hold it).

    >>> from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder
    >>> encoder = Phi4MMEncoder(Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1,
    ...     num_attention_heads=2, ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2))
    >>> slots = open_slots(encoder, 2, chunk_ms=160, left_chunks=1)
    >>> type(slots).__name__, slots.chunk_frames, slots.tokens_per_chunk, slots.left_chunk
    ('Phi4MMSlots', 16, 2, 1)
    """
    slots_class = _slots_class(encoder)
    if plan is None:
        plan = slots_class.make_plan(encoder, chunk_ms, left_chunks, cuda_graph=cuda_graph)
    elif (chunk_ms, left_chunks, cuda_graph) != (None, None, None):
        raise ValueError(
            f"chunk_ms, left_chunks and cuda_graph must be None with a plan (it holds them), got chunk_ms={chunk_ms}, "
            f"left_chunks={left_chunks}, cuda_graph={cuda_graph}"
        )
    return slots_class(encoder, batch_size, plan=plan)  # type: ignore[call-arg]
