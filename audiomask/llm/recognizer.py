"""A streaming recogniser over an LLM checkpoint, with the stream interface the CLI drives: :class:`LLMRecognizer`.

``open_stream(name)`` gives a stream that ``accept``s samples as they come,
shows its ``partial()`` text (updated every chunk of the
:class:`~audiomask.llm.streaming.StreamPolicy`) and ``finish()``es with the
model's offline answer for the whole utterance. Streams are driven on the
caller's thread: an ``accept`` that completes a chunk runs that update.

Usage (with a checkpoint directory on disk)::

    with LLMRecognizer.from_pretrained("Qwen3-ASR-0.6B", "cuda", language="en") as recognizer:
        stream = recognizer.open_stream("talk")
        stream.accept(samples)  # partials: stream.partial()
        print(stream.finish())
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from audiomask.llm.checkpoint import load
from audiomask.llm.model import AudioLM
from audiomask.llm.refeed import streams_for
from audiomask.llm.streaming import StreamPolicy

__all__ = ["DEFAULT_LLM_STREAMS", "LLMRecognizer", "LLMStream"]

DEFAULT_LLM_STREAMS = 4  # concurrent streams (cache slots) a recogniser holds by default


class LLMStream:
    """One utterance of an :class:`LLMRecognizer`: ``accept`` samples, read ``partial()``, ``finish()``."""

    def __init__(self, recognizer: LLMRecognizer, name: str) -> None:
        self._recognizer, self.name = recognizer, name
        self._text = ""
        self._final: str | None = None

    def accept(self, samples: object) -> None:
        """Append ``samples`` (1-D float32, 16 kHz); each whole chunk buffered is decoded now."""
        if self._final is not None:
            raise ValueError(f"stream {self.name!r} has finished: open a new one")
        streams = self._recognizer.streams
        streams.feed(self.name, samples)
        while self.name in streams.due():
            (partial,) = streams.update([self.name])
            self._text = partial.text

    def partial(self) -> str:
        """The text after the last chunk decoded ("" before the first)."""
        return self._text if self._final is None else self._final

    def finish(self) -> str:
        """End the utterance: the model's offline answer for all of it (the stream's slot is freed)."""
        if self._final is None:
            (final,) = self._recognizer.streams.finish([self.name])
            self._final = final.text
        return self._final


class LLMRecognizer:
    """Streams of one LLM recogniser (:class:`~audiomask.llm.model.AudioLM`), ``max_streams`` at once."""

    def __init__(
        self,
        model: AudioLM,
        *,
        max_streams: int = DEFAULT_LLM_STREAMS,
        policy: StreamPolicy | None = None,
        context: str = "",
        language: str | None = None,
    ) -> None:
        self.model = model
        self.streams = streams_for(model, max_streams, policy=policy, context=context, language=language)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: torch.device | str = "cpu",
        *,
        dtype: torch.dtype | None = None,
        **options: object,
    ) -> LLMRecognizer:
        """The recogniser of checkpoint directory ``path`` on ``device`` (float32 on a CPU, bfloat16 on a GPU)."""
        if dtype is None:
            dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
        return cls(load(path, device=device, dtype=dtype), **options)  # type: ignore[arg-type]

    @property
    def block_samples(self) -> int:
        """Samples per chunk of the streaming policy (16 kHz): what to ``accept`` at a time."""
        return self.streams.policy.chunk_samples

    def open_stream(self, name: str) -> LLMStream:
        """A new stream named ``name`` (``ValueError`` when ``max_streams`` are open)."""
        self.streams.open(name)
        return LLMStream(self, name)

    def transcribe(self, samples: object) -> str:
        """The offline answer for one whole utterance (1-D float32, 16 kHz)."""
        return self.model.transcribe(
            [np.asarray(samples, np.float32)], context=self.streams.context, language=self.streams.language
        )[0].text

    def close(self) -> None:
        """Drop the model and the cache (streams still open are abandoned)."""
        if self.streams is not None:
            self.streams.close()
        self.streams = None  # type: ignore[assignment]

    def __enter__(self) -> LLMRecognizer:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()
