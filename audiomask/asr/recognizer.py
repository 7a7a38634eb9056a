"""The streaming-ASR API: :class:`StreamingRecognizer` over the :mod:`audiomask.asr.driver` driver.

Names follow sherpa-onnx / WeNet / NeMo habits: a recognizer built once from
a model, a stream per utterance that ``accept``\\ s 16 kHz float samples,
``partial()`` for the text so far and ``finish()`` for the final text, and
``transcribe`` for whole files or arrays. A stream opened with
``outputs=True`` also delivers its encoder output tokens as they are produced
(:class:`~audiomask.asr.outputs.EncoderChunk`, in order, exactly once, the
last flagged ``final``): the audio embeddings an LLM decoder consumes.

>>> import numpy as np
>>> from audiomask.asr.checkpoint import load_model
>>> recognizer = StreamingRecognizer(load_model(), chunk_ms=160, left_chunks=2)   # the shipped model
>>> stream = recognizer.open_stream()
>>> stream.accept(np.zeros(8000, np.float32))
>>> isinstance(stream.partial(), str), isinstance(stream.finish(), str)
(True, True)
>>> stream = recognizer.open_stream("caller-1", outputs=True)
>>> stream.accept(np.zeros(8000, np.float32)); _ = stream.finish()
>>> [(chunk.start, len(chunk), chunk.final) for chunk in stream.outputs()]  # 40 ms tokens, 160 ms chunks
[(0, 4, False), (4, 4, False), (8, 4, False), (12, 0, True)]
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import torch

from audiomask.asr.driver import DriverStream, RunStats, StreamingDriver
from audiomask.asr.model import ASRModel
from audiomask.asr.outputs import DEFAULT_MAX_PENDING, ChunkQueue, EncoderChunk
from audiomask.audio import load
from audiomask.checks import check_int
from audiomask.constants import FRAME_MS
from audiomask.features.frontend import as_samples
from audiomask.streaming import open_stream
from audiomask.transfer import resolve_device

__all__ = ["RecognizerStream", "StreamingRecognizer"]

_clock = time.monotonic  # seconds; the idle timeout's clock (tests replace it)


class RecognizerStream:
    """One utterance: ``accept(samples)`` as they arrive, ``partial()`` any time, ``finish()`` once.

    Every method may be called from any thread (see :class:`StreamingRecognizer`).
    """

    def __init__(self, recognizer: StreamingRecognizer, inner: DriverStream) -> None:
        self._recognizer, self._inner = recognizer, inner
        self._accepted = 0  # samples accepted so far: where the next ones start, for error messages
        self._last_audio = _clock()  # when samples last came (or the stream opened)
        self._timed_out = False  # ended by the recognizer's idle timeout

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def finished(self) -> bool:
        return self._inner.ended

    def __repr__(self) -> str:
        return f"RecognizerStream({self.name!r}, finished={self.finished})"

    def accept(self, samples: object) -> None:
        """Append 16 kHz mono float samples in [-1, 1] (any count); runs every chunk that became complete.

        Refused, whole, with nothing queued (the stream goes on with what it
        had): samples that are not 1-D floats (``ValueError``), or that hold
        NaN, Inf or values beyond ``+-2^31`` (:class:`~audiomask.AudioError`
        naming the stream and the sample's position). After :meth:`finish`,
        :meth:`input_finished` or the idle timeout: ``ValueError``.
        """
        recognizer = self._recognizer
        with recognizer._changed:
            recognizer._check_usable()
            if self._inner.ended:
                if self._timed_out:
                    raise ValueError(
                        f"accept after the idle timeout: stream {self.name!r} was ended after "
                        f"{recognizer.idle_timeout_s} s without audio (idle_timeout_s)"
                    )
                raise ValueError(f"accept after finish: stream {self.name!r} has ended")
            array = as_samples(
                f"samples for stream {self.name!r}", samples, source=f"stream {self.name!r}", offset=self._accepted
            )
            recognizer._driver.feed(self._inner, array)
            self._accepted += len(array)
            self._last_audio = _clock()
            recognizer._advance()

    def outputs(self) -> ChunkQueue:
        """The stream's encoder output chunks as they are produced: iterate it (it waits for each, and ends
        after the final one), or ``get(timeout)``; from any thread. The stream must be opened with ``outputs=True``.
        """
        if self._inner.chunks is None or self._inner.chunks.max_pending == 0:
            raise ValueError(f"stream {self.name!r} was opened without outputs=True: it queues no encoder outputs")
        return self._inner.chunks

    def partial(self) -> str:
        """The text of the chunks encoded so far (final for them: greedy CTC never revises)."""
        with self._recognizer._changed:
            return self._recognizer.model.tokenizer.decode(self._inner.ids)

    def input_finished(self) -> None:
        """No more samples will come (sherpa-onnx's name); runs what can run, returns at once.

        With several streams in a recognizer, call this on each before
        :meth:`finish`: a chunk step runs only when every active stream has its
        next chunk or has ended.
        """
        recognizer = self._recognizer
        with recognizer._changed:
            recognizer._check_usable()
            recognizer._end(self)
            recognizer._advance()

    def finish(self, timeout: float | None = 0.0) -> str:
        """End the utterance: encode the rest and return the final text. Calling it again returns the same text.

        Args:
            timeout: seconds to wait while other streams of the recognizer hold
                the batch (they have neither their next chunk nor ended): ``0``
                raises at once (one thread: nobody else can feed them), ``None``
                waits as long as it takes (streams fed by other threads).

        Raises:
            RuntimeError: the other streams still hold the batch after
                ``timeout`` (the message names them), or the recognizer stopped
                after an error.
        """
        recognizer = self._recognizer
        with recognizer._changed:
            if self._inner.done:
                return self.partial()
            recognizer._check_usable()
            recognizer._end(self)
            deadline = None if timeout is None else _clock() + timeout
            while not self._inner.done:
                if recognizer._advance():
                    continue
                wait_s = recognizer._wait_s(deadline)
                if wait_s is not None and wait_s <= 0:
                    others = ", ".join(repr(s.name) for s in recognizer._streams) or "none"
                    raise RuntimeError(
                        f"stream {self.name!r} cannot finish: other streams of this recognizer hold the batch "
                        f"(not ended: {others}); feed them or call input_finished() on them, pass "
                        "finish(timeout=...) when other threads feed them, or set idle_timeout_s"
                    )
                recognizer._changed.wait(wait_s)
            return self.partial()


class StreamingRecognizer:
    """Streaming CTC recognition with a chunked, cache-aware encoder; many streams share each encoder step.

    Args:
        model: an :class:`ASRModel`; its encoder and head are moved to ``device``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``. A CUDA device on a machine
            without CUDA raises ``ValueError`` (no silent fallback to the CPU:
            a server sized for a GPU would not keep up on the CPU).
        chunk_ms: milliseconds of audio per encoder chunk; default: the encoder's. Phi-4MM: a multiple of
            one token, ``10 * time_reduction`` ms (80 for the released model); default: the config's chunk.
            Qwen3-ASR: its fixed conv chunk, 1000 ms (see :func:`~audiomask.streaming.open_stream`).
        left_chunks: chunks of left context each chunk attends to; default: the config's (Qwen3-ASR:
            ``None`` only, it attends inside windows of 8 chunks).
        max_streams: encoder slots: streams decoded together in one step (more wait for a free slot).
        overlap: compute the next chunk's features on a worker thread while the encoder runs.
        frontend_process: with ``overlap``, compute them in processes of their own instead, which share no
            interpreter lock with the encoder's thread (for servers: seconds to start, once; see
            :class:`~audiomask.asr.driver.StreamingDriver`). :meth:`close` (or ``with``) stops them.
        frontend_workers: with ``frontend_process``, how many processes share the streams' slots
            (default: one per four cores this process may run on, at most ``max_streams``); the text is
            the same whatever the count.
        outputs_on: where the embeddings of delivered encoder outputs live: ``"host"`` (pinned memory,
            the default) or ``"device"`` (``device``, for a consumer there); see :mod:`audiomask.asr.outputs`.
        cuda_graph: replay the encoder's chunk step as CUDA graphs (default: on CUDA, for the families
            that have them: Phi-4MM); their memory is taken once, at the first step, so later steps never
            allocate for the encoder.
        idle_timeout_s: a stream that has not sent audio for this many seconds
            is ended (as by :meth:`RecognizerStream.input_finished`) the next
            time any stream of the recognizer is used or waits, so that it no
            longer holds the others' batch; its later ``accept`` raises
            ``ValueError``. ``None`` (default): streams never time out.

    Thread safety: streams may be fed, finished and read from several threads
    at once. One lock serialises every call into the recognizer (encoder steps
    included; the feature worker thread runs beside them), so the results are
    those of some serial order of the calls, and each stream's text does not
    depend on the others. A thread that calls ``finish`` while other threads
    still feed their streams passes ``finish(timeout=None)`` (or a bound) to
    wait for them.

    Failures: an error inside an encoder step (CUDA out of memory, a device
    fault, Ctrl-C) leaves the step half done, so the recognizer stops: that
    call raises (out of memory as ``torch.OutOfMemoryError`` naming what to
    reduce), later calls raise ``RuntimeError``; ``partial()`` still returns
    each stream's text so far, and the output queues of unfinished streams
    fail with :class:`~audiomask.asr.outputs.OutputError` once their chunks are taken.
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
        frontend_process: bool = False,
        frontend_workers: int | None = None,
        outputs_on: str = "host",
        cuda_graph: bool | None = None,
        idle_timeout_s: float | None = None,
    ) -> None:
        if not isinstance(model, ASRModel):
            raise ValueError(f"model must be an ASRModel, got {type(model).__name__}")
        self.model = model
        self.device = _check_device(device)
        if idle_timeout_s is not None and not (isinstance(idle_timeout_s, (int, float)) and idle_timeout_s > 0):
            raise ValueError(f"idle_timeout_s must be a positive number of seconds or None, got {idle_timeout_s!r}")
        self.idle_timeout_s = idle_timeout_s
        model.encoder.to(self.device).eval()
        model.head.to(self.device).eval()
        stream = open_stream(
            model.encoder,
            check_int("max_streams", max_streams, minimum=1),
            chunk_ms=chunk_ms,
            left_chunks=left_chunks,
            cuda_graph=cuda_graph,
        )
        self._driver = StreamingDriver(
            stream,
            model.head,
            model.frontend,
            outputs_on=outputs_on,
            overlap=overlap,
            frontend_process=frontend_process,
            frontend_workers=frontend_workers,
        )
        self.max_streams = stream.batch_size
        self.chunk_ms = stream.chunk_frames * FRAME_MS
        self.left_chunks = stream.left_chunk
        self._changed = threading.Condition()  # the lock of every call; notified when a stream may have moved
        self._streams: list[RecognizerStream] = []  # opened and not yet ended
        self._failure: str | None = None  # why the recognizer stopped

    @property
    def stats(self) -> RunStats:
        """Per-chunk timings, the overlap figure and each stage's CPU cost of everything run so far."""
        return self._driver.stats

    def open_stream(
        self,
        name: str | None = None,
        *,
        outputs: bool = False,
        on_output: Callable[[EncoderChunk], object] | None = None,
        max_pending: int | None = DEFAULT_MAX_PENDING,
    ) -> RecognizerStream:
        """A new utterance.

        Args:
            name: its name (default ``stream-N``).
            outputs: queue its encoder output chunks for :meth:`RecognizerStream.outputs`, at most
                ``max_pending`` untaken (``None``: no bound); a chunk finding the queue full fails it with
                :class:`~audiomask.asr.outputs.OutputError` (the consumer gets it after the chunks held, and
                ``accept`` raises it): see :mod:`audiomask.asr.outputs`.
            on_output: called with each chunk, in order, by the thread running the encoder step, with the
                recognizer's lock held: it hands the chunk on and returns, and never calls into the recognizer.
            max_pending: see ``outputs``.
        """
        with self._changed:
            self._check_usable()
            inner = self._driver.open(name, outputs=outputs, on_output=on_output, max_pending=max_pending)
            stream = RecognizerStream(self, inner)
            self._streams.append(stream)
            return stream

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
        """Stop the feature worker thread or processes (after the call another thread may be running)."""
        with self._changed:
            self._driver.close()

    def __enter__(self) -> StreamingRecognizer:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()

    # -- called with self._changed held ---------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise RuntimeError(
                f"this recognizer stopped after an error inside an encoder step ({self._failure}) and cannot "
                "continue: open a new one (partial() still returns each stream's text so far)"
            )

    def _end(self, stream: RecognizerStream) -> None:
        if not stream._inner.ended:
            self._driver.end(stream._inner)
            self._streams.remove(stream)

    def _advance(self) -> int:
        """End idle streams, run every cycle that can run, wake waiting threads; the cycles run."""
        if self.idle_timeout_s is not None:
            now = _clock()
            for stream in [s for s in self._streams if now - s._last_audio > self.idle_timeout_s]:
                stream._timed_out = True
                self._end(stream)
        ran = self._drive(self._driver.advance)
        self._changed.notify_all()
        return ran

    def _drive(self, step: Callable[[], int]) -> int:
        """Run a driver call; an error inside leaves its cycle half done, so the recognizer stops."""
        try:
            return step()
        except torch.OutOfMemoryError as error:
            self._failure = "out of memory"
            self._driver.fail_outputs("the recognizer stopped: out of memory in an encoder step")
            raise torch.OutOfMemoryError(
                f"{self.device} ran out of memory in an encoder chunk step of up to {self.max_streams} streams: "
                f"reduce max_streams ({self.max_streams}), chunk_ms ({self.chunk_ms}) or left_chunks "
                f"({self.left_chunks}), or use a smaller model; this recognizer cannot continue: open a new one "
                f"({error})"
            ) from error
        except BaseException as error:
            self._failure = f"{type(error).__name__}: {error}"
            self._driver.fail_outputs(f"the recognizer stopped after an error in an encoder step ({self._failure})")
            raise

    def _wait_s(self, deadline: float | None) -> float | None:
        """Seconds to wait for a change before the next idle timeout or ``deadline``; ``None``: no limit."""
        now = _clock()
        waits = [] if deadline is None else [deadline - now]
        if self.idle_timeout_s is not None:
            waits += [s._last_audio + self.idle_timeout_s - now for s in self._streams]
        if deadline is not None and deadline <= now:
            return 0.0
        return max(min(waits), _MIN_WAIT_S) if waits else None


_MIN_WAIT_S = 0.001  # seconds: an idle timeout that expires now is checked after this short wait


def _check_device(device: object) -> torch.device:
    """``device`` as a torch device; ``ValueError`` when it is not a CPU or CUDA device this machine has."""
    target = resolve_device(device)  # names a malformed device or a missing CUDA index; CPU without CUDA
    # Every form resolve_device accepts but "cpu" names CUDA; torch.device(int) itself raises on a CPU-only build.
    if target.type == "cpu" and str(device).split(":")[0] != "cpu":
        raise ValueError(
            f"device={device!r}, but CUDA is not available on this machine (torch.cuda.is_available() is False); "
            "pass device='cpu'"
        )
    return target
