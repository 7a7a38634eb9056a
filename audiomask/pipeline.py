"""The streaming-ASR API: :class:`StreamingRecognizer` over the :mod:`audiomask.stream` driver.

Names follow sherpa-onnx / WeNet / NeMo habits: a recognizer built once from
a model, a stream per utterance that ``accept``\\ s 16 kHz float samples,
``partial()`` for the text so far and ``finish()`` for the final text, and
``transcribe`` for whole files or arrays.

>>> import numpy as np
>>> from audiomask.decode import CTCHead, CharTokenizer
>>> from audiomask.encoders.phi4mm import Phi4MMAudioConfig, Phi4MMEncoder
>>> config = Phi4MMAudioConfig(hidden_size=8, intermediate_size=8, num_blocks=1, num_attention_heads=2,
...                            ext_pw_out_channel=8, depthwise_separable_out_channel=8, nemo_conv_channels=2)
>>> tokenizer = CharTokenizer("abc ")
>>> model = ASRModel(Phi4MMEncoder(config).eval(), CTCHead(8, tokenizer.vocab_size).eval(), tokenizer)
>>> recognizer = StreamingRecognizer(model, chunk_ms=160, left_chunks=2)
>>> stream = recognizer.open_stream()
>>> stream.accept(np.zeros(8000, np.float32))
>>> isinstance(stream.partial(), str), isinstance(stream.finish(), str)
(True, True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from audiomask._validate import check_int
from audiomask.audio import load
from audiomask.decode import CharTokenizer, CTCHead
from audiomask.encoders.phi4mm import Phi4MMEncoder
from audiomask.features import Phi4MMFrontend
from audiomask.features.frontend import as_samples
from audiomask.stream import DriverStream, RunStats, StreamingDriver

__all__ = ["ASRModel", "RecognizerStream", "StreamingRecognizer"]

FRAME_MS = 10  # one feature frame per 10 ms


@dataclass
class ASRModel:
    """What a recognizer needs: encoder, CTC head over its outputs, tokenizer, and the front end."""

    encoder: Phi4MMEncoder
    head: CTCHead
    tokenizer: CharTokenizer
    frontend: Phi4MMFrontend = field(default_factory=Phi4MMFrontend)

    def __post_init__(self) -> None:
        if self.head.proj.in_features != self.encoder.config.hidden_size:
            raise ValueError(
                f"head input_size ({self.head.proj.in_features}) must equal the encoder's hidden_size "
                f"({self.encoder.config.hidden_size})"
            )
        if self.head.proj.out_features != self.tokenizer.vocab_size:
            raise ValueError(
                f"head vocab_size ({self.head.proj.out_features}) must equal the tokenizer's "
                f"({self.tokenizer.vocab_size})"
            )


class RecognizerStream:
    """One utterance: ``accept(samples)`` as they arrive, ``partial()`` any time, ``finish()`` once."""

    def __init__(self, recognizer: StreamingRecognizer, inner: DriverStream) -> None:
        self._recognizer, self._inner = recognizer, inner

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def finished(self) -> bool:
        return self._inner.ended

    def __repr__(self) -> str:
        return f"RecognizerStream({self.name!r}, finished={self.finished})"

    def accept(self, samples: object) -> None:
        """Append 16 kHz mono float samples in [-1, 1] (any count); runs every chunk that became complete."""
        if self._inner.ended:
            raise ValueError(f"accept after finish: stream {self.name!r} has ended")
        self._recognizer._driver.feed(self._inner, samples)
        self._recognizer._driver.advance()

    def partial(self) -> str:
        """The text of the chunks encoded so far (final for them: greedy CTC never revises)."""
        return self._recognizer.model.tokenizer.decode(self._inner.ids)

    def input_finished(self) -> None:
        """No more samples will come (sherpa-onnx's name); runs what can run, returns at once.

        With several streams in a recognizer, call this on each before
        :meth:`finish`: a chunk step runs only when every active stream has its
        next chunk or has ended.
        """
        if not self._inner.ended:
            self._recognizer._driver.end(self._inner)
        self._recognizer._driver.advance()

    def finish(self) -> str:
        """End the utterance: encode the rest and return the final text. Calling it again returns the same text."""
        driver = self._recognizer._driver
        if not self._inner.ended:
            driver.end(self._inner)
        while not self._inner.done:
            if driver.advance() == 0:
                raise RuntimeError(
                    f"stream {self.name!r} cannot finish: other streams of this recognizer hold the batch "
                    "(feed or finish them; a cycle runs when every active stream has its next chunk)"
                )
        return self.partial()


class StreamingRecognizer:
    """Streaming CTC recognition with a chunked, cache-aware encoder; many streams share each encoder step.

    Args:
        model: an :class:`ASRModel`; its encoder and head are moved to ``device``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        chunk_ms: milliseconds of audio per encoder chunk, a multiple of
            ``10 * time_reduction`` (80 ms for Phi-4MM); default: the encoder config's chunk.
        left_chunks: chunks of left context each chunk attends to; default: the config's.
        max_streams: encoder slots: streams decoded together in one step (more wait for a free slot).
        overlap: compute the next chunk's features on a worker thread while the encoder runs.
    """

    def __init__(
        self,
        model: ASRModel,
        device: object = "cpu",
        chunk_ms: int | None = None,
        left_chunks: int | None = None,
        *,
        max_streams: int = 1,
        overlap: bool = True,
    ) -> None:
        if not isinstance(model, ASRModel):
            raise ValueError(f"model must be an ASRModel, got {type(model).__name__}")
        self.model = model
        self.device = torch.device(device)
        reduction = model.encoder.config.time_reduction
        chunk_size = None
        if chunk_ms is None and model.encoder.config.chunk_size < 1:
            raise ValueError(
                "chunk_ms must be given: the encoder config's chunk_size means full attention"
            )
        if chunk_ms is not None:
            chunk_ms = check_int("chunk_ms", chunk_ms, minimum=1)
            unit = FRAME_MS * reduction
            if chunk_ms % unit:
                raise ValueError(
                    f"chunk_ms must be a multiple of {unit} (one encoder token), got {chunk_ms}"
                )
            chunk_size = chunk_ms // unit
        if left_chunks is not None:
            left_chunks = check_int("left_chunks", left_chunks, minimum=0)
        model.encoder.to(self.device).eval()
        model.head.to(self.device).eval()
        self._driver = StreamingDriver(
            model.encoder,
            model.head,
            model.frontend,
            batch_size=check_int("max_streams", max_streams, minimum=1),
            chunk_size=chunk_size,
            left_chunk=left_chunks,
            overlap=overlap,
        )
        self.chunk_ms = self._driver.chunk_size * FRAME_MS * reduction
        self.left_chunks = self._driver.left_chunk

    @property
    def stats(self) -> RunStats:
        """Per-chunk timings and the overlap figure of everything run so far."""
        return self._driver.stats

    def open_stream(self, name: str | None = None) -> RecognizerStream:
        """A new utterance."""
        return RecognizerStream(self, self._driver.open(name))

    def transcribe(self, path_or_samples: str | os.PathLike | object) -> str:
        """The text of a whole audio file (any rate, resampled to 16 kHz) or of 16 kHz float samples."""
        if isinstance(path_or_samples, (str, os.PathLike)):
            samples, _ = load(path_or_samples)
        else:
            samples = as_samples("path_or_samples", path_or_samples)
        stream = self.open_stream()
        stream.accept(samples)
        return stream.finish()

    def close(self) -> None:
        """Stop the feature worker thread."""
        self._driver.close()

    def __enter__(self) -> StreamingRecognizer:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()
