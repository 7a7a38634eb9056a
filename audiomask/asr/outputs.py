"""A stream's encoder output tokens as they are produced: :class:`EncoderChunk` pieces, delivered by a :class:`ChunkQueue`.

The consumer is whatever reads a stream's audio embeddings while the audio
still arrives: an LLM decoder (Qwen3-ASR and Phi-4-multimodal feed the audio
encoder's outputs to one), an aligner, a probe. The driver
(:class:`~audiomask.asr.driver.StreamingDriver`) hands every stream that asks
for them its chunks at each cycle's collection; the contract:

- **complete and in order**: a stream's chunks come in order, each exactly
  once; chunk ``i + 1`` starts where chunk ``i`` stops
  (``chunk.start + len(chunk)``), and concatenating them gives the encoder's
  streamed outputs of that stream (equal to the offline forward within the
  encoder's tolerances). A cycle that yields no token for a stream yields no
  chunk, except its last: every stream ends with exactly one chunk flagged
  ``final`` (empty when its last cycle yielded no token).
- **per stream**: a stream's chunks do not depend on which streams share its
  batch (as its outputs do not).
- **bounded**: each stream's queue holds at most ``max_pending`` chunks that
  its consumer has not taken. A chunk that finds it full is not queued: the
  queue fails with :class:`OutputError` (its consumer gets the chunks it
  holds, then the error), later chunks of that stream are dropped, and the
  stream refuses new samples (the error again); the other streams go on. A
  slow consumer so costs its own stream, never the batch; it keeps up by
  taking each chunk as it comes (or sizes ``max_pending`` for the audio it
  feeds ahead: one chunk per encoder chunk of audio at most).
- **freed at the end**: once the final chunk is delivered the driver holds no
  reference to the stream's chunks; they live as long as the consumer keeps them.

``on_output`` callables run on the driver's thread, inside its cycle: they
hand the chunk on (to a queue, a decoder's thread) and return; one that
raises fails its stream's outputs as an overflow does.

Embeddings: by default on the host, in pinned memory, copied with
:func:`audiomask.transfer.to_host` without blocking the driver (the copy has
landed before the chunk is delivered); with ``outputs_on="device"`` they
stay on the encoder's device for a consumer there (a copy on the driver's
compute stream, complete before delivery; a consumer on another CUDA stream
calls ``embeddings.record_stream`` on it). Either way ``embeddings`` is a
view of its cycle's ``(B, n, D)`` batch: ``.clone()`` what is kept for long.

>>> queue = ChunkQueue("caller-1", max_pending=2)
>>> queue.deliver(EncoderChunk("caller-1", 0, torch.zeros(3, 4), np.array([0.0, 40.0, 80.0]), final=False))
>>> queue.deliver(EncoderChunk("caller-1", 3, torch.zeros(1, 4), np.array([120.0]), final=True))
>>> [(chunk.start, len(chunk), chunk.final) for chunk in queue]
[(0, 3, False), (3, 1, True)]
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.streaming import EncoderSlots

__all__ = ["DEFAULT_MAX_PENDING", "ChunkQueue", "EncoderChunk", "OutputError", "TokenClock"]

DEFAULT_MAX_PENDING = 64  # chunks a consumer may leave untaken: 5 s of 80 ms chunks, 64 Qwen3-ASR windows


class OutputError(RuntimeError):
    """A stream's outputs could not be delivered (its queue overflowed or its ``on_output`` raised)."""


@dataclass(eq=False)
class EncoderChunk:
    """Encoder output tokens ``start .. start + n - 1`` of one stream, as one cycle produced them.

    Attributes:
        stream: the stream's name.
        start: the index of the first token in the stream's outputs (0 for its first chunk).
        embeddings: ``(n, D)`` output tokens, the encoder's dtype; on the host (pinned) or the encoder's device.
        times_ms: ``(n,)`` float64, where each token's audio starts, in ms from the stream's first sample.
        final: the stream's last chunk (no chunk follows it; it may be empty).
    """

    stream: str
    start: int
    embeddings: torch.Tensor
    times_ms: np.ndarray
    final: bool

    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def stop(self) -> int:
        """The index after the last token: the next chunk's ``start``."""
        return self.start + len(self)


class TokenClock:
    """Where each encoder output token of a stream starts, in ms: its chunk's start plus its place in the chunk.

    The slots' :class:`~audiomask.streaming.ChunkPlan` says its family's clock: a full chunk of
    ``chunk_ms`` yields ``chunk_tokens`` tokens (Qwen3-ASR: its conv chunk's, its steps returning 8 chunks'
    windows), each ``token_ms`` after the previous one.

    >>> from audiomask.asr.checkpoint import load_model
    >>> from audiomask.streaming import open_slots
    >>> clock = TokenClock(open_slots(load_model().encoder))  # the shipped model: 40 ms tokens, 320 ms chunks
    >>> clock.times_ms(7, 3).tolist()
    [280.0, 320.0, 360.0]
    """

    def __init__(self, slots: EncoderSlots) -> None:
        plan = slots.plan
        self.tokens_per_chunk, self.chunk_ms, self.token_ms = plan.chunk_tokens, plan.chunk_ms, plan.token_ms

    def times_ms(self, start: int, count: int) -> np.ndarray:
        """``(count,)`` float64: the start, in ms, of tokens ``start .. start + count - 1``."""
        return self.at_ms(np.arange(start, start + count))

    def start_s(self, token: int) -> float:
        """Where output token ``token`` starts, seconds (:meth:`at_ms` of one, without numpy: a server asks often)."""
        chunk, place = divmod(token, self.tokens_per_chunk)
        return (chunk * self.chunk_ms + place * self.token_ms) / 1000

    def at_ms(self, tokens: np.ndarray) -> np.ndarray:
        """``(n,)`` float64: the start, in ms, of output tokens ``tokens`` ``(n,)`` (indices from the stream's start)."""
        chunk, place = np.divmod(np.asarray(tokens, np.int64), self.tokens_per_chunk)
        return (chunk * self.chunk_ms + place * self.token_ms).astype(np.float64)


class ChunkQueue:
    """One stream's delivered chunks: the driver :meth:`deliver`\\ s, a consumer iterates or :meth:`get`\\ s.

    Thread-safe: the consumer usually runs on a thread of its own.

    Args:
        name: the stream's name (for error messages).
        max_pending: the most chunks held untaken (see the module docstring); ``None``: no bound
            (the driver's ``keep_outputs``); ``0``: none held, chunks go to ``on_output`` only.
        on_output: called with each chunk on the driver's thread, before it is queued.
    """

    def __init__(
        self,
        name: str,
        max_pending: int | None = DEFAULT_MAX_PENDING,
        on_output: Callable[[EncoderChunk], object] | None = None,
    ) -> None:
        if max_pending is not None:
            max_pending = check_int("max_pending", max_pending, minimum=0)
        if on_output is not None and not callable(on_output):
            raise ValueError(f"on_output must be callable or None, got {type(on_output).__name__}")
        if max_pending == 0 and on_output is None:
            raise ValueError("max_pending=0 keeps no chunk: it needs an on_output callable to hand them to")
        self.name, self.max_pending, self.on_output = name, max_pending, on_output
        self.error: OutputError | None = None  # why delivery stopped, if it did
        self.delivered = 0  # chunks delivered (queued or handed to on_output), the final one included
        self._chunks: deque[EncoderChunk] = deque()
        self._final = False  # the final chunk has been delivered
        self._changed = threading.Condition()

    def __repr__(self) -> str:
        return f"ChunkQueue({self.name!r}, pending={len(self)}, final={self._final}, error={self.error is not None})"

    def __len__(self) -> int:
        """Chunks delivered and not yet taken."""
        with self._changed:
            return len(self._chunks)

    @property
    def finished(self) -> bool:
        """No chunk will be delivered any more (the final one was, or delivery failed)."""
        return self._final or self.error is not None

    # -- the driver's side ---------------------------------------------------------------------

    def deliver(self, chunk: EncoderChunk) -> None:
        """Hand ``chunk`` to ``on_output`` and queue it; never raises (a failure is kept in :attr:`error`)."""
        if self.finished:
            return
        if self.on_output is not None:
            try:
                self.on_output(chunk)
            except Exception as error:  # noqa: BLE001 (the consumer's fault, whatever it is: fails this stream only)
                failure = OutputError(f"on_output of stream {self.name!r} raised {type(error).__name__}: {error}")
                failure.__cause__ = error
                self.fail(failure)
                return
        with self._changed:
            if self.max_pending is not None and 0 < self.max_pending <= len(self._chunks):
                self._fail_locked(
                    OutputError(
                        f"stream {self.name!r}: its consumer left {len(self._chunks)} chunks untaken "
                        f"(max_pending={self.max_pending}); later chunks are dropped: take them as they come "
                        "or open the stream with a larger max_pending"
                    )
                )
                return
            if self.max_pending != 0:
                self._chunks.append(chunk)
            self.delivered += 1
            self._final = chunk.final
            self._changed.notify_all()

    def fail(self, error: OutputError) -> None:
        """Stop delivery: the consumer gets the chunks held, then ``error``."""
        with self._changed:
            self._fail_locked(error)

    def _fail_locked(self, error: OutputError) -> None:
        if self.error is None and not self._final:
            self.error = error
            self._changed.notify_all()

    # -- the consumer's side -------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> EncoderChunk:
        """The next chunk, waiting up to ``timeout`` seconds for it (``None``: as long as it takes).

        Raises:
            TimeoutError: none came within ``timeout``.
            EOFError: the final chunk has been taken already.
            OutputError: delivery failed and every chunk before the failure has been taken.
        """
        with self._changed:
            if not self._changed.wait_for(lambda: self._chunks or self.finished, timeout):
                raise TimeoutError(f"no chunk of stream {self.name!r} within {timeout} s")
            if self._chunks:
                return self._chunks.popleft()
            if self.error is not None:
                raise self.error
            raise EOFError(f"stream {self.name!r} has no more chunks: its final chunk was taken")

    def take(self) -> list[EncoderChunk]:
        """Every chunk delivered and not yet taken, without waiting (an empty list if none)."""
        with self._changed:
            chunks = list(self._chunks)
            self._chunks.clear()
            return chunks

    def peek(self) -> list[EncoderChunk]:
        """The chunks held, in order, left in the queue."""
        with self._changed:
            return list(self._chunks)

    def __iter__(self) -> Iterator[EncoderChunk]:
        """Each chunk as it comes, up to the final one (waits for them; raises :class:`OutputError` on failure)."""
        while True:
            try:
                chunk = self.get()
            except EOFError:
                return
            yield chunk
            if chunk.final:
                return
