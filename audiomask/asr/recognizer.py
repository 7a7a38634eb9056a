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
>>> recognizer.close()
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from audiomask.asr.capacity import DEFAULT_MAX_STREAMS, MS_PER_S, default_lanes, open_fitting
from audiomask.asr.driver import DriverStream, RunStats, StreamingDriver
from audiomask.asr.model import ASRModel
from audiomask.asr.outputs import DEFAULT_MAX_PENDING, ChunkQueue, EncoderChunk
from audiomask.asr.transcript import Transcript
from audiomask.audio import load
from audiomask.checks import check_int, check_seconds
from audiomask.samples import as_samples
from audiomask.streaming import chunk_plan
from audiomask.transfer import require_device

__all__ = ["MAX_WAIT_S", "RecognizerStream", "StreamingRecognizer"]

_clock = time.monotonic  # seconds; the idle timeout's and the cycles' clock (tests replace it)

MAX_WAIT_S = threading.TIMEOUT_MAX  # seconds: the longest wait a lock takes (about 292 years on Linux)


class RecognizerStream:
    """One utterance: ``accept(samples)`` as they arrive, ``partial()`` any time, ``finish()`` once.

    Every method may be called from any thread (see :class:`StreamingRecognizer`). A stream whose handle is
    garbage-collected unfinished is ended, and its slot freed, at the recognizer's next call.
    """

    def __init__(self, recognizer: StreamingRecognizer, inner: DriverStream) -> None:
        self._recognizer, self._inner = recognizer, inner
        self._accepted = 0  # samples accepted so far: where the next ones start, for error messages
        # transcript(): each decoded token's piece and start (s) as far as known, and their text.
        self._tokens, self._times, self._text = [], [], ""
        self._transcript_lock = threading.Lock()
        # No reference to this handle, nor a strong one to the recognizer: either may be collected first.
        weakref.finalize(self, _handle_collected, weakref.ref(recognizer), inner).atexit = False

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def token_count(self) -> int:
        """Greedy-CTC tokens decoded so far: :meth:`partial`'s text changes exactly when this grows (no lock)."""
        return len(self._inner.ids)

    @property
    def decoded_s(self) -> float:
        """Seconds of the stream's audio decoded so far: where its next encoder output token starts (no lock)."""
        return self._recognizer._driver.clock.start_s(self._inner.tokens)

    @property
    def finished(self) -> bool:
        """Its input has ended (:meth:`finish`, :meth:`input_finished`, :meth:`cancel`, the idle timeout)."""
        return self._inner.ended

    @property
    def done(self) -> bool:
        """Ended and every chunk encoded: :meth:`partial` is the final text (no lock)."""
        return self._inner.done

    def __repr__(self) -> str:
        return f"RecognizerStream({self.name!r}, finished={self.finished})"

    def accept(self, samples: object) -> None:
        """Append 16 kHz mono float samples in [-1, 1] (any count); runs the chunks that are due.

        A chunk runs once every stream in the batch has its next one, or once it has waited ``max_wait_ms``
        (until the next call into the recognizer, or :meth:`StreamingRecognizer.poll`). The samples are
        checked before the lock is taken, and it is let go during every step: a long array holds nobody back.

        Refused, whole, with nothing queued (the stream goes on with what it had): samples that are not 1-D
        floats (``ValueError``), or that hold NaN, Inf or values beyond ``+-2^31`` (:class:`~audiomask.AudioError`
        naming the stream and the sample's position). Once ended: ``ValueError``; after ``close()``: ``RuntimeError``.
        """
        recognizer = self._recognizer
        recognizer._check_usable()
        array = self._checked(samples)
        with recognizer._lock:
            recognizer._enter()
            self._queue(array)
            recognizer._run(until=lambda: not recognizer._driver.has_block(self._inner))

    def _checked(self, samples: object) -> np.ndarray:
        """``samples`` as ``accept`` takes them, checked; ``ValueError`` (or ``AudioError``) when refused."""
        self._check_open()
        source = f"stream {self.name!r}"
        return as_samples(f"samples for {source}", samples, source=source, offset=self._accepted)

    def _queue(self, array: np.ndarray) -> None:
        """With the recognizer's lock held: hand checked samples to the driver (``ValueError`` once ended)."""
        recognizer = self._recognizer
        self._check_open()
        recognizer._driver.feed(self._inner, array, checked=True)
        self._accepted += len(array)
        recognizer._open[self._inner] = _clock()

    def outputs(self) -> ChunkQueue:
        """The stream's encoder output chunks as they are produced: iterate it (it waits for each, and ends after
        the final one), or ``get(timeout)``; from any thread. The stream must be opened with ``outputs=True``."""
        if self._inner.chunks is None or self._inner.chunks.max_pending == 0:
            raise ValueError(f"stream {self.name!r} was opened without outputs=True: it queues no encoder outputs")
        return self._inner.chunks

    def partial(self) -> str:
        """The text of the chunks encoded so far (final for them: greedy CTC never revises). Reads a snapshot
        of the tokens without a lock: never waits for a step, and answers after ``close()`` or an error."""
        return self._recognizer.model.tokenizer.decode(list(self._inner.ids))

    def transcript(self) -> Transcript:
        """:meth:`partial`'s text, its tokens and their start times (:class:`Transcript`); no recognizer lock.

        For ``samples/hello_world.wav`` and the shipped model:
        ``Transcript(text='hello world this is ...', tokens=('h', 'e', 'l', ...), times_s=(0.04, 0.12, ...))``.
        """
        inner, tokenizer = self._inner, self._recognizer.model.tokenizer
        known = len(inner.id_tokens)  # extended after ids: the tokens whose time is known
        with self._transcript_lock:  # decoded tokens are kept: a server reads this after every step
            tokens, times = self._tokens, self._times
            if len(tokens) < known:
                at = np.asarray(inner.id_tokens[len(tokens) : known], np.int64)
                pieces = [tokenizer.decode([i]) for i in inner.ids[len(tokens) : known]]
                times += [round(float(t), 3) for t in self._recognizer._driver.clock.at_ms(at) / MS_PER_S]
                tokens += pieces
                self._text += "".join(pieces)  # a character tokenizer's text is its tokens joined
            return Transcript(self._text, tuple(tokens), tuple(times))

    def input_finished(self) -> None:
        """No more samples will come (sherpa-onnx's name); runs what is due (the stream's remaining chunks,
        without waiting for the other streams' audio), returns at once; :meth:`finish` then returns its text."""
        recognizer = self._recognizer
        with recognizer._lock:
            recognizer._enter()
            recognizer._end(self._inner)
            recognizer._run(until=lambda: not recognizer._driver.has_block(self._inner))

    def cancel(self) -> None:
        """Abandon the stream: it is ended at the recognizer's next call (audio still waiting for a slot is
        dropped). Takes no lock and runs no step, so an event loop may call it; :meth:`partial` still reads."""
        if not self._inner.ended:
            self._recognizer._collected.append(self._inner)

    def finish(self, timeout: float | None = 0.0) -> str:
        """End the utterance: encode the rest and return the final text. Calling it again returns the same text.

        The stream's remaining chunks run at once, with whichever other streams have theirs ready (never
        waiting for their audio); while another thread runs steps (carrying these chunks too), it waits for them.

        Args:
            timeout: seconds, at most :data:`MAX_WAIT_S`, to wait for a slot when the stream has none yet
                and every one of the ``max_streams`` slots is held by a stream that has not ended: ``0``
                raises at once (one thread: nobody else can feed or end them), ``None`` waits as long as it
                takes (streams fed by other threads end, or an idle timeout ends them).

        Raises:
            RuntimeError: no slot came free within ``timeout`` (the message names the streams holding
                them), the recognizer was closed, or it stopped after an error.
            ValueError: ``timeout`` is not ``None`` or a number of seconds in ``[0, MAX_WAIT_S]``.
        """
        timeout = check_seconds("timeout", timeout, minimum=0.0, maximum=MAX_WAIT_S)
        recognizer = self._recognizer
        with recognizer._lock:
            if self._inner.done:
                return self.partial()
            recognizer._enter()
            recognizer._end(self._inner)
            deadline = None if timeout is None else _clock() + timeout
            while not self._inner.done:
                recognizer._check_usable()
                if recognizer._running:  # another thread runs the steps; it wakes us after each
                    recognizer._lock.wait()
                    continue
                if recognizer._run(until=lambda: not recognizer._driver.has_block(self._inner)):
                    continue
                wait_s = recognizer._wait_s(deadline)
                if wait_s is not None and wait_s <= 0:
                    holders = ", ".join(repr(s.name) for s in recognizer._driver.occupants() if not s.ended)
                    raise RuntimeError(
                        f"stream {self.name!r} cannot finish: it waits for a slot, and all {recognizer.max_streams} "
                        f"(max_streams) are held by streams of this recognizer (not ended: {holders}); feed them "
                        "or call input_finished() on them, pass finish(timeout=...) when other threads feed them, "
                        "or set idle_timeout_s"
                    )
                recognizer._lock.wait(wait_s)
            return self.partial()

    def _check_open(self) -> None:
        """``ValueError`` when the stream has ended (by finish, input_finished or the idle timeout)."""
        if not self._inner.ended:
            return
        if self._inner in self._recognizer._timed_out:
            raise ValueError(
                f"accept after the idle timeout: stream {self.name!r} was ended after "
                f"{self._recognizer.idle_timeout_s} s without audio (idle_timeout_s)"
            )
        raise ValueError(f"accept after finish: stream {self.name!r} has ended")


def _handle_collected(recognizer: weakref.ref[StreamingRecognizer], inner: DriverStream) -> None:
    """A stream's handle is gone: its end waits for the recognizer's next call (a finalizer runs wherever the
    collector does, possibly inside a call that holds the recognizer's lock, so it only queues the stream)."""
    owner = recognizer()
    if owner is not None and not inner.ended:
        owner._collected.append(inner)


class StreamingRecognizer:
    """Streaming CTC recognition with a chunked, cache-aware encoder; many streams share each encoder step.

    Args:
        model: an :class:`ASRModel`; its encoder and head are moved to ``device``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``. A CUDA device on a machine without CUDA raises
            ``ValueError`` (no silent fallback: a server sized for a GPU would not keep up on the CPU).
        chunk_ms, left_chunks, cuda_graph: milliseconds of audio per encoder chunk (at most a minute; Phi-4MM: a
            multiple of one token, 80 ms for the released model; Qwen3-ASR: 1000), chunks of left context each
            attends to (``(left_chunks + 1) * chunk_ms`` at most ten minutes; Qwen3-ASR: ``None`` only), and
            CUDA graphs for the chunk step (default: on CUDA, for Phi-4MM; their memory is taken at the first
            step, so later steps never allocate for the encoder); default: the encoder's. Checked and sized
            once, as :func:`~audiomask.streaming.chunk_plan` says: the attribute ``plan``.
        max_streams: encoder slots, streams decoded at once (more wait for a free slot); default 4. Their caches
            (counted by the configuration's :attr:`plan`) and sample rings must fit in the memory free on
            ``device`` (and the host), else ``ValueError`` says how many fit, before allocating.
        overlap: compute the next chunk's features on a worker thread while the encoder runs.
        frontend_process: with ``overlap``, compute them in processes of their own instead, which share no
            interpreter lock with the encoder's thread (for servers: seconds to start, once; see
            :class:`~audiomask.asr.driver.StreamingDriver`). :meth:`close` (or ``with``) stops them.
        frontend_workers: with ``frontend_process``, how many processes share the streams' slots (default: one per
            four cores this process may run on, at most ``max_streams``); the text is the same whatever the count.
        outputs_on: where the embeddings of delivered encoder outputs live: ``"host"`` (pinned memory,
            the default) or ``"device"`` (``device``, for a consumer there); see :mod:`audiomask.asr.outputs`.
        idle_timeout_s: a stream that has not sent audio for this many seconds (``0 < idle_timeout_s <=
            MAX_WAIT_S``) is ended (as by :meth:`RecognizerStream.input_finished`) at the next call into the
            recognizer (:meth:`poll` included): it holds no slot, and its later ``accept`` raises
            ``ValueError``. ``None`` (default): streams never time out.
        max_wait_ms: how long a ready chunk waits for the other streams' before a step runs the ready
            ones alone, milliseconds, ``0 <= max_wait_ms <= chunk_ms``; default: one chunk divided among
            the lanes (``chunk_ms // lanes``). Shorter waits cut latency for streams that arrive at
            different times, at the cost of more, smaller steps (each still computes every slot of its lane).
        lanes: step the slots in this many lanes (:class:`~audiomask.asr.driver.StreamingDriver`), a stream
            in the lane of its phase (when within a chunk its chunks arrive): a step computes one lane of
            streams ready together. Default :func:`~audiomask.asr.capacity.default_lanes`: one on CUDA (a small
            encoder's step is bound by its kernel launches there: ``docs/benchmarks.md``); on the CPU, where a
            step costs its slots, up to 16 lanes of one width (the slots rounded up to fill them), so a stream
            alone steps one slot (4 of 64). ``lanes=1``: the fewest steps for streams all fed at once.

    Scheduling: a chunk step runs when every stream in a slot has its next chunk (full batches: the best
    throughput), or once a ready chunk has waited ``max_wait_ms`` for the others, or at once for a stream that has
    ended: then it runs the streams that are ready, and the others go on where they stopped when their audio comes.
    Waiting streams take free slots as their first chunk arrives, whatever their order of opening. Nothing runs
    between calls: a server calls :meth:`poll` every few milliseconds (from a ticker thread) so that a ready chunk
    never waits longer than the bound for a call to come in.

    Thread safety: streams may be opened, fed, finished and read from several threads at once; the text of each
    stream does not depend on the others, nor on how the calls interleave. One thread at a time runs encoder steps
    (the feature worker runs beside it); the others' calls queue their audio and return, its steps carrying their
    chunks too. The recognizer's lock guards only bookkeeping: it is let go during every encoder step and every wait
    for the front end or the device, so a long ``accept`` delays another thread's call by one step's bookkeeping at
    most, and :meth:`RecognizerStream.partial` takes no lock at all. :meth:`transcribe` works while other threads
    stream. Each torch call of a step gives up the interpreter lock and, while other threads run Python, waits up to
    :func:`sys.getswitchinterval` (5 ms by default) to take it back: beside a busy event loop on the CPU a shorter
    one keeps steps short (``audiomask serve`` sets 0.5 ms there; on CUDA it measured worse).

    Failures: an error inside an encoder step (CUDA out of memory, a device fault, Ctrl-C) leaves the step half
    done, so the recognizer stops: that call raises (out of memory as ``torch.OutOfMemoryError`` naming what to
    reduce), later calls raise ``RuntimeError``; ``partial()`` still returns each stream's text so far, and the
    output queues of unfinished streams fail with :class:`~audiomask.asr.outputs.OutputError` once their chunks are
    taken. :meth:`close` too makes later calls raise ``RuntimeError``.
    """

    # Its front end computes a block's features once the block is complete: a server hands it whole blocks.
    takes_audio_ahead = False

    def __init__(
        self,
        model: ASRModel,
        device: object = "cpu",
        chunk_ms: int | None = None,
        left_chunks: int | None = None,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        overlap: bool = True,
        frontend_process: bool = False,
        frontend_workers: int | None = None,
        outputs_on: str = "host",
        cuda_graph: bool | None = None,
        idle_timeout_s: float | None = None,
        max_wait_ms: int | None = None,
        lanes: int | None = None,
    ) -> None:
        if not isinstance(model, ASRModel):
            raise ValueError(f"model must be an ASRModel, got {type(model).__name__}")
        self.model = model
        self.device = require_device(device)
        self.idle_timeout_s = check_seconds(
            "idle_timeout_s", idle_timeout_s, minimum=0.0, maximum=MAX_WAIT_S, positive=True
        )
        max_streams = check_int("max_streams", max_streams, minimum=1)
        model.encoder.to(self.device).eval()
        model.head.to(self.device).eval()
        self.plan = chunk_plan(model.encoder, chunk_ms, left_chunks, cuda_graph=cuda_graph, frontend=model.frontend)
        if lanes is None:
            lanes, max_streams = default_lanes(max_streams, self.device, frontend_workers)
        lanes = check_int("lanes", lanes, minimum=1, maximum=max_streams)
        slots = open_fitting(model, self.device, max_streams, self.plan, lanes)
        if max_wait_ms is None:
            max_wait_ms = self.chunk_ms // lanes
        max_wait_ms = check_int("max_wait_ms", max_wait_ms, minimum=0)
        if max_wait_ms > self.chunk_ms:
            raise ValueError(f"max_wait_ms must be at most chunk_ms ({self.chunk_ms}), got {max_wait_ms}")
        self._driver = StreamingDriver(
            slots,
            model.head,
            model.frontend,
            outputs_on=outputs_on,
            overlap=overlap,
            frontend_process=frontend_process,
            frontend_workers=frontend_workers,
            wait_clock=lambda: _clock(),
        )
        self.max_streams, self.lanes = self._driver.batch_size, lanes
        self.max_wait_s = max_wait_ms / MS_PER_S  # how long a ready chunk waits for the other streams
        self._lock = threading.Condition(threading.Lock())  # guards the bookkeeping; notified as streams move
        self._running = False  # a thread is running encoder steps (it lets go of the lock during each)
        self._open: dict[DriverStream, float] = {}  # streams opened and not ended: when audio last came
        self._timed_out: weakref.WeakSet[DriverStream] = weakref.WeakSet()  # ended by the idle timeout
        self._collected: deque[DriverStream] = deque()  # streams whose handle was collected, to end
        self._failure: str | None = None  # why the recognizer stopped
        self._closed = False

    @property
    def chunk_ms(self) -> int:
        """Milliseconds of audio per encoder chunk (the :attr:`plan`'s)."""
        return self.plan.chunk_ms

    @property
    def left_chunks(self) -> int | None:
        """Chunks of left context each chunk attends to; ``None`` for Qwen3-ASR (it attends inside windows)."""
        return self.plan.left_chunks

    @property
    def first_block_samples(self) -> int:
        """16 kHz samples of a stream's first chunk of audio (its first frame's window included)."""
        return self.plan.first_block_samples

    @property
    def block_samples(self) -> int:
        """16 kHz samples of each later chunk of audio (``chunk_ms``): the block a caller reads or holds back."""
        return self.plan.block_samples

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
        """A new utterance; it takes a slot when its first chunk of audio (or its end) arrives.

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
        with self._lock:
            self._enter()
            inner = self._driver.open(name, outputs=outputs, on_output=on_output, max_pending=max_pending)
            self._open[inner] = _clock()
            return RecognizerStream(self, inner)

    def accept_many(
        self,
        pairs: Iterable[tuple[RecognizerStream, np.ndarray]],
        *,
        checked: bool = False,
        finished: Iterable[RecognizerStream] = (),
    ) -> list[Exception | None]:
        """:meth:`RecognizerStream.accept` for several streams, then :meth:`~RecognizerStream.input_finished`
        for the ``finished`` ones: one lock and one run of the due steps for all.

        ``pairs``: ``(stream, samples)``; with ``checked``, ``(n,)`` float32 arrays the caller has checked
        (:func:`~audiomask.samples.as_samples`). The steps run until these streams have moved as
        far as they can. Returns, per pair, ``None`` or the error that refused its samples whole (as
        ``accept`` raises it); the others are queued whatever one's error.
        """
        self._check_usable()
        pairs = list(pairs)
        errors: list[Exception | None] = [None] * len(pairs)
        arrays: list[np.ndarray | None] = [None] * len(pairs)
        for index, (stream, samples) in enumerate(pairs):
            try:
                arrays[index] = samples if checked else stream._checked(samples)
            except ValueError as error:  # AudioError included
                errors[index] = error
        with self._lock:
            self._enter()
            fed: list[DriverStream] = []
            for index, ((stream, _), array) in enumerate(zip(pairs, arrays)):
                if array is not None:
                    try:
                        stream._queue(array)
                    except ValueError as error:  # it has ended since
                        errors[index] = error
                    else:
                        fed.append(stream._inner)
            for stream in finished:
                self._end(stream._inner)
                fed.append(stream._inner)
            self._run(until=lambda: not any(map(self._driver.has_block, fed)))
        return errors

    def transcribe(self, path_or_samples: str | os.PathLike | object, timeout: float | None = 0.0) -> str:
        """The text of a whole audio file (any rate, resampled to 16 kHz) or of 16 kHz float samples: a stream of
        its own, beside those other threads stream; ``timeout``: as :meth:`RecognizerStream.finish`'s."""
        timeout = check_seconds("timeout", timeout, minimum=0.0, maximum=MAX_WAIT_S)
        if isinstance(path_or_samples, (str, os.PathLike)):
            samples, _ = load(path_or_samples)
        else:
            samples = as_samples("path_or_samples", path_or_samples)
        stream = self.open_stream()
        stream.accept(samples)
        return stream.finish(timeout)

    def poll(self) -> int:
        """Run the encoder steps that are due now; returns how many ran (0 while another thread runs them).

        Due: full steps, steps over the ready streams whose chunk has waited :attr:`max_wait_s` for the
        others, the rest of ended streams; and idle timeouts. A server calls this every few milliseconds
        from a ticker thread, so that partials advance even when no other call comes in. ``RuntimeError``
        after :meth:`close` or an error.
        """
        with self._lock:
            self._enter()
            return self._run()

    def close(self) -> None:
        """Stop the feature worker thread or processes; later calls raise ``RuntimeError``. Idempotent.

        Waits for the encoder steps another thread is running; the output
        queues of unfinished streams fail with :class:`~audiomask.asr.outputs.OutputError`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
            while self._running:
                self._lock.wait()
            self._driver.fail_outputs("the recognizer was closed")
            self._driver.close()
            self._open.clear()
            self._collected.clear()

    def __enter__(self) -> StreamingRecognizer:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()

    # -- called with self._lock held ------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this recognizer is closed: open a new one (partial() still returns each text)")
        if self._failure is not None:
            raise RuntimeError(
                f"this recognizer stopped after an error inside an encoder step ({self._failure}) and cannot "
                "continue: open a new one (partial() still returns each stream's text so far)"
            )

    def _enter(self) -> None:
        """The start of every call: refuse it when closed or stopped; end the streams collected or idle."""
        self._check_usable()
        while self._collected:
            inner = self._collected.popleft()
            if not inner.ended:
                self._driver.drop(inner)
                self._open.pop(inner, None)
        if self.idle_timeout_s is not None:
            now = _clock()
            for inner in [s for s, last in self._open.items() if now - last > self.idle_timeout_s]:
                self._timed_out.add(inner)
                self._end(inner)

    def _end(self, inner: DriverStream) -> None:
        if not inner.ended:
            self._driver.end(inner)
            self._open.pop(inner, None)

    def _run(self, until: Callable[[], bool] | None = None) -> int:
        """Run the encoder steps that are due, unless another thread is, until ``until()``; the steps run.

        The lock is let go during each step (:meth:`_unlocked`); calls of
        other threads meanwhile queue their audio, which these steps carry.
        A call stops once ``until()`` holds (its own stream has moved as far
        as it can), so that a thread never carries other threads' steps for
        longer than its own need: they run theirs, woken when it stops.
        """
        if self._running:
            return 0
        self._running = True
        ran = 0
        try:
            while not self._closed and not (until is not None and until()):
                count = self._drive(
                    lambda: self._driver.advance(max_wait_s=self.max_wait_s, unlocked=self._unlocked, until=until)
                )
                if not count:
                    break
                ran += count
        finally:
            self._running = False
            self._lock.notify_all()
        return ran

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        """Let go of the lock while the driver computes (waking the threads waiting for streams to move)."""
        self._lock.notify_all()
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

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
        """Seconds to wait for a change: until ``deadline``, the next idle timeout, or a chunk's wait is over;
        0 once ``deadline`` has passed; ``None``: no limit."""
        now = _clock()
        if deadline is not None and deadline <= now:
            return 0.0
        waits = [] if deadline is None else [deadline - now]
        if self.idle_timeout_s is not None:
            waits += [last + self.idle_timeout_s - now for last in self._open.values()]
        waited_s = self._driver.waited_s()
        if waited_s is not None:
            waits.append(self.max_wait_s - waited_s)
        return max(min(waits), _MIN_WAIT_S) if waits else None


_MIN_WAIT_S = 0.001  # seconds: a timeout that expires now is checked after this short wait
