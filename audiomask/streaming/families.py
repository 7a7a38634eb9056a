"""The stream of each encoder family, by encoder: :func:`open_stream` and :func:`default_frontend`.

The one place that maps encoder classes to their streams, so that drivers and
recognizers name no encoder family: a Phi-4MM encoder streams with
:class:`~audiomask.streaming.Phi4MMStream` (chunks of any whole number of
tokens, chunk-causal attention), a Qwen3-ASR encoder with
:class:`~audiomask.streaming.Qwen3ASRStream` (chunks of 1 s, attention in
windows of 8 chunks).
"""

from __future__ import annotations

from audiomask.checks import check_int
from audiomask.constants import FRAME_MS
from audiomask.features.frontend import Frontend
from audiomask.models.phi4mm import Phi4MMEncoder
from audiomask.models.qwen3_asr import Qwen3ASREncoder
from audiomask.streaming.phi4mm import Phi4MMStream
from audiomask.streaming.protocol import EncoderStream
from audiomask.streaming.qwen3_asr import Qwen3ASRStream

__all__ = ["default_frontend", "open_stream"]

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


def open_stream(
    encoder: object,
    batch_size: int = 1,
    *,
    chunk_ms: int | None = None,
    left_chunks: int | None = None,
    cuda_graph: bool | None = None,
) -> EncoderStream:
    """The :class:`~audiomask.streaming.EncoderStream` of ``encoder``'s family, ``batch_size`` slots.

    Args:
        encoder: a :class:`~audiomask.models.Phi4MMEncoder` or
            :class:`~audiomask.models.Qwen3ASREncoder`, on the device the
            stream is to run on (the stream's caches are allocated there).
        batch_size: stream slots, ``>= 1``.
        chunk_ms: milliseconds of audio per chunk step. Phi-4MM: a multiple of
            one token (``10 * time_reduction`` ms); ``None``: the encoder
            config's ``chunk_size``. Qwen3-ASR: its conv chunk
            (``10 * 2 * n_window`` ms, 1000) or ``None``.
        left_chunks: chunks of left context (Phi-4MM; ``None``: the config's).
            Qwen3-ASR attends inside its windows: ``None`` only.
        cuda_graph: replay the chunk step as CUDA graphs (Phi-4MM on CUDA);
            ``None``: where the encoder is on CUDA and the family has them.

    >>> from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder
    >>> encoder = Phi4MMEncoder(Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1,
    ...     num_attention_heads=2, ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2))
    >>> stream = open_stream(encoder, 2, chunk_ms=160, left_chunks=1)
    >>> type(stream).__name__, stream.chunk_frames, stream.tokens_per_chunk, stream.left_chunk
    ('Phi4MMStream', 16, 2, 1)
    """
    stream_class = _stream_class(encoder)
    cuda = next(encoder.parameters()).device.type == "cuda"  # type: ignore[attr-defined]
    if chunk_ms is not None:
        chunk_ms = check_int("chunk_ms", chunk_ms, minimum=1)
    if left_chunks is not None:
        left_chunks = check_int("left_chunks", left_chunks, minimum=0)
    if stream_class is Phi4MMStream:
        config = encoder.config  # type: ignore[attr-defined]
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
        graph = cuda if cuda_graph is None else bool(cuda_graph)
        return Phi4MMStream(encoder, batch_size, chunk_size, left_chunks, cuda_graph=graph)  # type: ignore[arg-type]
    chunk_frames = encoder.config.chunk_frames  # type: ignore[attr-defined]
    if chunk_ms not in (None, chunk_frames * FRAME_MS):
        raise ValueError(f"chunk_ms must be {chunk_frames * FRAME_MS} (Qwen3-ASR's conv chunk) or None, got {chunk_ms}")
    if left_chunks is not None:
        raise ValueError(f"left_chunks must be None for Qwen3-ASR (it attends inside fixed windows), got {left_chunks}")
    if cuda_graph:
        raise ValueError("cuda_graph must be False or None for Qwen3-ASR: its stream has no CUDA graph")
    return Qwen3ASRStream(encoder, batch_size)  # type: ignore[arg-type]
