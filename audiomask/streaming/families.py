"""The stream of each encoder family, by encoder: :func:`chunk_plan`, :func:`open_stream`, :func:`default_frontend`.

The one place that maps encoder classes to their streams, so that drivers and
recognizers name no encoder family; what is a family's own (its sizes from
milliseconds, its token clock, its state bytes) is its stream class's. A
Phi-4MM encoder streams with
:class:`~audiomask.streaming.Phi4MMStream` (chunks of any whole number of
tokens, chunk-causal attention), a Qwen3-ASR encoder with
:class:`~audiomask.streaming.Qwen3ASRStream` (chunks of 1 s, attention in
windows of 8 chunks).
"""

from __future__ import annotations

from audiomask.features.frontend import Frontend
from audiomask.models.phi4mm import Phi4MMEncoder
from audiomask.models.qwen3_asr import Qwen3ASREncoder
from audiomask.streaming.phi4mm import Phi4MMStream
from audiomask.streaming.plan import ChunkPlan
from audiomask.streaming.protocol import EncoderStream
from audiomask.streaming.qwen3_asr import Qwen3ASRStream

__all__ = ["chunk_plan", "default_frontend", "open_stream"]

_STREAMS: dict[type, type[EncoderStream]] = {Phi4MMEncoder: Phi4MMStream, Qwen3ASREncoder: Qwen3ASRStream}


def _stream_class(encoder: object) -> type[EncoderStream]:
    for encoder_class, stream_class in _STREAMS.items():
        if isinstance(encoder, encoder_class):
            return stream_class
    names = " or ".join(cls.__name__ for cls in _STREAMS)
    raise ValueError(f"encoder must be a {names}, got {type(encoder).__name__}")


def default_frontend(encoder: object) -> Frontend:
    """A new front end whose features ``encoder``'s family takes (``ValueError`` for any other object).

    >>> from audiomask.models import Qwen3ASRConfig, Qwen3ASREncoder
    >>> default_frontend(Qwen3ASREncoder(Qwen3ASRConfig(encoder_layers=1, d_model=8, encoder_attention_heads=2,
    ...     encoder_ffn_dim=8, downsample_hidden_size=2))).n_mels
    128
    """
    return _stream_class(encoder).default_frontend()


def chunk_plan(
    encoder: object,
    chunk_ms: int | None = None,
    left_chunks: int | None = None,
    *,
    cuda_graph: bool | None = None,
    frontend: Frontend | None = None,
) -> ChunkPlan:
    """The :class:`~audiomask.streaming.ChunkPlan` of ``encoder``'s streams: its family's sizes, nothing allocated.

    Args:
        encoder: a :class:`~audiomask.models.Phi4MMEncoder` or
            :class:`~audiomask.models.Qwen3ASREncoder`, on the device and in the dtype its streams will
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
    return _stream_class(encoder).make_plan(encoder, chunk_ms, left_chunks, cuda_graph=cuda_graph, frontend=frontend)


def open_stream(
    encoder: object,
    batch_size: int = 1,
    *,
    chunk_ms: int | None = None,
    left_chunks: int | None = None,
    cuda_graph: bool | None = None,
    plan: ChunkPlan | None = None,
) -> EncoderStream:
    """The :class:`~audiomask.streaming.EncoderStream` of ``encoder``'s family, ``batch_size`` slots.

    Args:
        encoder: as :func:`chunk_plan`'s, on the device the stream is to run on (the stream's caches are
            allocated there).
        batch_size: stream slots, ``>= 1``.
        chunk_ms, left_chunks, cuda_graph: the configuration, as :func:`chunk_plan` takes them.
        plan: instead of those three, the :func:`chunk_plan` of ``encoder`` to open (the stream holds it).

    >>> from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder
    >>> encoder = Phi4MMEncoder(Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1,
    ...     num_attention_heads=2, ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2))
    >>> stream = open_stream(encoder, 2, chunk_ms=160, left_chunks=1)
    >>> type(stream).__name__, stream.chunk_frames, stream.tokens_per_chunk, stream.left_chunk
    ('Phi4MMStream', 16, 2, 1)
    """
    stream_class = _stream_class(encoder)
    if plan is None:
        plan = stream_class.make_plan(encoder, chunk_ms, left_chunks, cuda_graph=cuda_graph)
    elif (chunk_ms, left_chunks, cuda_graph) != (None, None, None):
        raise ValueError(
            f"chunk_ms, left_chunks and cuda_graph must be None with a plan (it holds them), got chunk_ms={chunk_ms}, "
            f"left_chunks={left_chunks}, cuda_graph={cuda_graph}"
        )
    return stream_class(encoder, batch_size, plan=plan)  # type: ignore[call-arg]
