"""An LLM recogniser behind ``audiomask serve``: :class:`LLMServingRecognizer`, what the server's engine calls.

The server's :class:`~audiomask.serve.engine.Engine` drives a :class:`~audiomask.asr.recognizer.StreamingRecognizer`
through a few calls: ``open_stream``, ``accept_many`` (samples, and the streams that end), ``poll``, and per stream
``transcript()``, ``token_count``, ``done``, ``cancel()`` and ``finish(timeout)``; ``stats``, ``max_wait_s``,
``chunk_ms``, the block sizes, ``max_streams``, ``device`` and ``close``. This module gives the same calls over
:class:`~audiomask.llm.streaming.LLMStreams` (an adapter: the engine, its feeds, the sessions and the protocols run
unchanged):

- a *chunk* is the streaming policy's (2 s by default); a stream's blocks are chunks, and an update
  (:meth:`LLMStreams.update`, all due streams in one batch) is a *cycle* of :attr:`stats` (its front end: the due
  streams'; its step: the rest);
- a stream's ``transcript()`` is its latest partial, then its final: the model's offline answer for the whole
  utterance. Its ``tokens`` are the text's words (with their trailing spaces: joined, they are the text) and it has
  no token times (an LLM gives none). A partial may rewrite its last words (the recipe's roll-back); a segment the
  server cuts (a voice-activity endpoint, a commit) is a stream of its own, its final the offline answer for that
  audio. ``token_count`` counts its partials, one a chunk whether its text changed or not, and its final: the engine
  reads ``transcript()`` and sends a result when it moves, so a client hears from every update (a heartbeat every
  chunk);
- threads: one thread of the recognizer's own runs :class:`LLMStreams` (opens, samples, cancels, finals, updates).
  The engine's calls (from two feeder threads and a ticker) only queue, under a short lock, and wake it, so a feeder
  never waits for an update (an update takes hundreds of milliseconds): it goes on taking the other connections'
  samples while the GPU works. The thread holds the recognizer weakly: one dropped without
  :meth:`~LLMServingRecognizer.close` is still freed, its thread ending with it. ``transcript()`` and
  ``token_count`` take no lock;
- a due stream's update waits up to :attr:`max_wait_s` for the other streams' chunks, so that streams out of step
  share updates; it runs at once when every open stream is due;
- a stream ending hands its slot back after the next update, or at once when none is due (:meth:`LLMStreams.end`),
  so that the next stream (a connection's next segment) opens without waiting for the final; its last chunks go to
  the final pass, in one of the :attr:`pass_slots` spare slots: its whole prompt through the offline front end and
  encoder, prefilled with an update, then decoded riding along the updates' steps (as many as the update's answers),
  in steps of its own while no update is due, and after each update while other finals wait for a spare slot
  (:attr:`LLMStreams.short_of_slots`: only steps free those slots); those of at most
  :data:`~audiomask.llm.streaming.FINAL_AUDIO_S_PER_RUN` seconds of audio start a run, so that a burst of ends holds
  no update back for long. A cancelled one frees its slot without a final.

Usage (with a checkpoint directory on disk)::

    recognizer = LLMServingRecognizer(load("Qwen3-ASR-0.6B", device="cuda", dtype=torch.bfloat16), max_streams=64)
    stream = recognizer.open_stream("caller")
    recognizer.accept_many([(stream, samples)], finished=[stream])
    print(stream.transcript().text)
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import torch

from audiomask.asr.stats import CycleTiming, RunStats
from audiomask.asr.transcript import Transcript
from audiomask.checks import check_int, pick_device
from audiomask.constants import SAMPLE_RATE
from audiomask.llm.checkpoint import load
from audiomask.llm.model import AudioLM
from audiomask.llm.policy import segment_windows_within
from audiomask.llm.refeed import streams_for
from audiomask.llm.stream_features import default_frontend_workers
from audiomask.llm.streaming import DEFAULT_PASS_SLOTS, LLMStreams, Partial, StreamPolicy
from audiomask.samples import as_samples

if TYPE_CHECKING:
    from audiomask.serve.settings import ServeSettings

__all__ = [
    "DEFAULT_LLM_MAX_WAIT_MS",
    "PASS_SLOTS_PER_SLOT",
    "LLMServingRecognizer",
    "LLMServingStream",
    "build_llm_recognizer",
    "words",
]

MS_PER_S = 1000
# A due stream's update waits at most this long for the other streams' chunks (or a chunk, if shorter): a
# partial comes every 2 s, so 40 ms is little latency, and streams that started apart still share updates.
DEFAULT_LLM_MAX_WAIT_MS = 40
# Steps the ended streams' finals take between two looks at the queue when no update is due, or after an update
# while others wait for a spare slot (a few milliseconds each on a GPU); beside updates they ride along theirs.
ADVANCE_STEPS = 8
# Spare slots per slot of the streams, for finals (and long segments' passes) riding along: a connection's
# segment ends at a pause or after --max-segment-s, and its final decodes (~90 steps, ~7 updates at 2 s chunks)
# while its next segment streams in a slot of its own; segments that end together wait only for these.
PASS_SLOTS_PER_SLOT = 0.25
_WORDS = re.compile(r"\S+\s*|\s+")


def words(text: str) -> tuple[str, ...]:
    """``text`` cut into words, each with the spaces after it (leading spaces alone): joined, they are ``text``.

    >>> words("hello  world "), words(" hi"), words("")
    (('hello  ', 'world '), (' ', 'hi'), ())
    """
    return tuple(_WORDS.findall(text))


class LLMServingStream:
    """One connection's utterance on an :class:`LLMServingRecognizer`: the calls the server makes on a stream."""

    def __init__(self, recognizer: LLMServingRecognizer, name: str, key: str) -> None:
        self.name = name
        self._recognizer = recognizer
        self._key = key  # its name in LLMStreams: unique, whatever names clients bring
        self._intake: list[np.ndarray] = []  # samples accepted and not yet handed to LLMStreams
        self._accepted = 0  # samples accepted: where the next ones start, for error messages
        self._fed = 0  # samples handed to LLMStreams
        self._ended = False  # its input has ended (finish, input_finished, cancel)
        self._cancelled = False
        self._open = False  # it holds a slot of LLMStreams
        self._finishing = False  # its final pass has started
        self._done = False  # ended, and its final text is in (or it was cancelled)
        self._transcript = Transcript()
        self._changes = 0
        self._decoded = 0  # samples of the chunks decoded

    def __repr__(self) -> str:
        return f"LLMServingStream({self.name!r}, finished={self._ended})"

    @property
    def token_count(self) -> int:
        """Its partials (one a chunk, its text changed or not) and final so far: :meth:`transcript` is new each
        time this moves (no lock)."""
        return self._changes

    @property
    def decoded_s(self) -> float:
        """Seconds of its audio decoded into partials so far (no lock)."""
        return self._decoded / SAMPLE_RATE

    @property
    def finished(self) -> bool:
        """Its input has ended (:meth:`finish`, :meth:`input_finished`, :meth:`cancel`)."""
        return self._ended

    @property
    def done(self) -> bool:
        """Ended, and :meth:`transcript` is the final text (no lock)."""
        return self._done

    def transcript(self) -> Transcript:
        """The latest partial (``Transcript()`` before the first), then the final text (no lock)."""
        return self._transcript

    def partial(self) -> str:
        """:meth:`transcript`'s text."""
        return self._transcript.text

    def accept(self, samples: object) -> None:
        """Append 16 kHz mono float samples in [-1, 1]: queued for the recognizer's thread, which updates the
        stream once a chunk is in (see the module); its partial comes later (:attr:`token_count` moves)."""
        (error,) = self._recognizer.accept_many([(self, samples)])
        if error is not None:
            raise error

    def input_finished(self) -> None:
        """No more samples will come: the recognizer's thread runs its final pass next; :attr:`done` once its
        final text is in."""
        self._recognizer.accept_many([], finished=[self])

    def cancel(self) -> None:
        """Abandon the stream: the recognizer's thread frees its slot, without a final pass. Takes only the short
        queueing lock and runs nothing, so an event loop may call it."""
        self._recognizer._cancel(self)

    def finish(self, timeout: float | None = None) -> str:
        """End the utterance and return its final text: the model's offline answer for all its audio.

        Waits for the final pass (on the recognizer's thread) at most ``timeout`` seconds (``None``: as long as
        it takes); ``RuntimeError`` when it does not come in time, the recognizer was closed or stopped after an
        error.
        """
        self.input_finished()
        self._recognizer._wait_done(self, timeout)
        return self._transcript.text


class LLMServingRecognizer:
    """Streams of one LLM recogniser (:class:`~audiomask.llm.model.AudioLM`) for the server: see the module.

    Args:
        model: a Qwen3-ASR or Phi-4-multimodal recogniser (streamed by :func:`~audiomask.llm.refeed.streams_for`).
        max_streams: slots of the cache: streams open at once (one per connection).
        policy: chunk and answer lengths (:class:`~audiomask.llm.streaming.StreamPolicy`).
        context, language: the prompt's context text and forced language (``None``: detected).
        max_wait_ms: how long a due stream waits for the others' chunks; ``None``:
            :data:`DEFAULT_LLM_MAX_WAIT_MS`, or the chunk if shorter.
        frontend_workers: processes that push the streams' audio through the front end (0: the recognizer's
            thread and its front-end threads; :class:`~audiomask.llm.streaming.LLMStreams`).
        pass_slots: spare cache slots for the ended streams' finals; ``None``: :data:`PASS_SLOTS_PER_SLOT` of
            ``max_streams`` (at least :data:`~audiomask.llm.streaming.DEFAULT_PASS_SLOTS`).

    :attr:`on_results`: ``None`` or a callable without arguments, called on the recognizer's thread each time
    partials or finals have been handed to the streams (the server's ticker wakes on it to send them, rather
    than at its next tick).
    """

    # The front end takes what has come of the streams' next chunks while an update runs: a server hands the
    # audio over as it comes (every audiomask.serve.segments.handover_step), not a chunk at a time.
    takes_audio_ahead = True

    def __init__(
        self,
        model: AudioLM,
        *,
        max_streams: int,
        policy: StreamPolicy | None = None,
        context: str = "",
        language: str | None = None,
        max_wait_ms: int | None = None,
        frontend_workers: int = 0,
        pass_slots: int | None = None,
    ) -> None:
        self.model = model
        self.max_streams = check_int("max_streams", max_streams, minimum=1)
        if pass_slots is None:
            pass_slots = max(DEFAULT_PASS_SLOTS, round(PASS_SLOTS_PER_SLOT * max_streams))
        self.pass_slots = check_int("pass_slots", pass_slots, minimum=1)
        self._streams: LLMStreams | None = streams_for(
            model,
            max_streams,
            policy=policy,
            context=context,
            language=language,
            frontend_workers=frontend_workers,
            pass_slots=pass_slots,
        )
        self.policy = self._streams.policy
        self._streams.warm_graphs()  # a server's first loaded updates would otherwise each capture a graph
        if max_wait_ms is None:
            max_wait_ms = min(self.chunk_ms, DEFAULT_LLM_MAX_WAIT_MS)
        self.max_wait_s = check_int("max_wait_ms", max_wait_ms, minimum=0) / MS_PER_S
        self.stats = RunStats()
        self.on_results: Callable[[], None] | None = None
        # The queue: streams' intake, ends, cancels, the live streams. Reentrant: the recognizer's thread may drop
        # the last reference while holding it, and the finalizer that wakes the thread takes it too.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified when streams are done, or on an error
        self._queued = threading.Condition(self._lock)  # notified when the queue changes: wakes the thread
        self._epoch = 0  # counts changes to the queue: the thread runs again when it moved
        self._live: dict[str, LLMServingStream] = {}  # by key: opened and not done
        self._due_since: dict[str, float] = {}  # by key: when its oldest due chunk came due
        self._ending: list[LLMServingStream] = []  # ended, not yet handed to LLMStreams.end (the thread's own)
        self._serial = itertools.count()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=_serve, args=(weakref.ref(self), self._queued), name="audiomask-llm-updates", daemon=True
        )
        self._thread.start()
        weakref.finalize(self, _wake, self._queued)  # a recognizer dropped unclosed ends its thread

    # -- what the engine reads -------------------------------------------------------------------

    @property
    def chunk_ms(self) -> int:
        """Milliseconds of audio per chunk (a partial each)."""
        return round(self.policy.chunk_samples * MS_PER_S / SAMPLE_RATE)

    @property
    def block_samples(self) -> int:
        """Samples per chunk (16 kHz)."""
        return self.policy.chunk_samples

    @property
    def first_block_samples(self) -> int:
        """Samples of a stream's first chunk: as every other."""
        return self.policy.chunk_samples

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self.model.device

    # -- calls -----------------------------------------------------------------------------------

    def open_stream(self, name: str | None = None) -> LLMServingStream:
        """A new utterance; it takes a slot at the next run of what is due (when one is free)."""
        self._check_usable()
        with self._lock:
            serial = next(self._serial)
            name = f"stream-{serial}" if name is None else name
            stream = LLMServingStream(self, name, f"{name}#{serial}")
            self._live[stream._key] = stream
            self._moved()
        return stream

    def accept_many(
        self,
        pairs: Iterable[tuple[LLMServingStream, np.ndarray]],
        *,
        checked: bool = False,
        finished: Iterable[LLMServingStream] = (),
    ) -> list[Exception | None]:
        """Queue each pair's samples (``checked``: ``(n,)`` float32 already checked) and end the ``finished``
        streams for the recognizer's thread; per pair ``None`` or the error that refused its samples whole."""
        self._check_usable()
        pairs = list(pairs)
        errors: list[Exception | None] = [None] * len(pairs)
        arrays: list[np.ndarray | None] = [None] * len(pairs)
        for index, (stream, samples) in enumerate(pairs):
            try:
                source = f"stream {stream.name!r}"
                arrays[index] = (
                    samples
                    if checked
                    else as_samples(f"samples for {source}", samples, source=source, offset=stream._accepted)
                )
            except ValueError as error:  # AudioError included
                errors[index] = error
        with self._lock:
            for index, ((stream, _), array) in enumerate(zip(pairs, arrays, strict=True)):
                if array is None:
                    continue
                if stream._ended:
                    errors[index] = ValueError(f"accept after finish: stream {stream.name!r} has ended")
                    continue
                stream._intake.append(array)
                stream._accepted += len(array)
            for stream in finished:
                stream._ended = True
            self._moved()
        return errors

    def poll(self) -> int:
        """Nothing to run here: the recognizer's thread runs what is due, its waits timed by itself. Raises
        ``RuntimeError`` once it stopped after an error, as every call does; returns 0."""
        self._check_usable()
        return 0

    def close(self) -> None:
        """Stop the recognizer's thread once the update in flight, if any, is over, and drop the streams and the
        cache; later calls raise ``RuntimeError``. Idempotent."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()
            self._queued.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self._streams is not None:
            self._streams.close()
        self._streams = None

    def __enter__(self) -> LLMServingRecognizer:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()

    # -- inside ----------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the recognizer stopped after an error: {self._error!r}")
        if self._closed:
            raise RuntimeError("the recognizer is closed")

    def _moved(self) -> None:
        """Called with the lock held: the queue changed; wake the recognizer's thread."""
        self._epoch += 1
        self._queued.notify()

    def _cancel(self, stream: LLMServingStream) -> None:
        with self._lock:
            if stream._done:
                return
            stream._ended = stream._cancelled = True
            stream._intake.clear()
            self._moved()

    def _wait_done(self, stream: LLMServingStream, timeout: float | None) -> None:
        with self._changed:
            self._changed.wait_for(lambda: stream._done or self._error is not None or self._closed, timeout)
        if stream._done:
            return
        self._check_usable()
        raise RuntimeError(f"stream {stream.name!r} did not get its final text within {timeout} s")

    def _run_due(self) -> tuple[bool, float | None]:
        """Everything due (:meth:`_drain`, the recognizer's thread): whether to go on, and how long to wait at most
        before running again; an error stops the recognizer (every later call raises it)."""
        try:
            return True, self._drain(self._streams)
        except BaseException as error:  # noqa: BLE001 - reported to every caller and waiter
            with self._lock:
                self._error = error
                self._changed.notify_all()
            return False, None

    def _take(self, free: int) -> tuple[list[str], list[str], list[tuple[str, np.ndarray]], list[LLMServingStream]]:
        """Under the queue's lock, with ``free`` slots: keys to drop (cancelled), keys to open, samples to hand
        over, streams ending."""
        drop, opening, samples, ending = [], [], [], []
        for key, stream in list(self._live.items()):
            if stream._cancelled:
                del self._live[key]
                stream._done = True
                if stream._open:
                    drop.append(key)
                    free += not stream._finishing  # an ended one's slot is free already, or its final's spare
        for key, stream in self._live.items():
            if not stream._open:
                if not free:
                    continue  # waits for a slot
                free -= 1
                stream._open = True
                opening.append(key)
            if stream._intake:
                pieces, stream._intake = stream._intake, []
                samples += [(key, piece) for piece in pieces]  # joined once, when LLMStreams reads them
                stream._fed += sum(len(piece) for piece in pieces)
            if stream._ended and not stream._finishing:
                stream._finishing = True  # its final pass starts once
                ending.append(stream)
        return drop, opening, samples, ending

    def _drain(self, streams: LLMStreams) -> float | None:
        """Everything queued, then updates for as long as they are due, and steps of the ended streams' finals
        while none is (the recognizer's thread); how long until the oldest due stream's wait for the others is
        over, or ``None`` when none is due; at once once the recognizer is closed."""
        while not self._closed:
            with self._lock:
                drop, opening, samples, ending = self._take(streams.free)
            for key in drop:
                streams.drop(key)
            for key in opening:
                streams.open(key)
            for key, array in samples:
                streams.feed(key, array, checked=True)  # by accept_many
            self._ending += ending
            due, wait_s = self._due(streams)
            if due:
                started, cpu, frontend = time.perf_counter(), time.thread_time(), streams.features.push_s
                partials = streams.update(due)
                seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
                self._record(len(due), seconds, streams.features.push_s - frontend, cpu)
                self._publish(partials)
                self._finish(streams)
                if streams.short_of_slots:  # finals in flight step on their own, so that the waiting ones start
                    self._publish(streams.advance(ADVANCE_STEPS))
            elif self._ending or streams.ending:  # no update due: finals start, and take steps of their own
                self._finish(streams)
                if streams.ending:
                    self._publish(streams.advance(ADVANCE_STEPS))
            else:
                return wait_s
        return None

    def _due(self, streams: LLMStreams) -> tuple[list[str], float | None]:
        """The streams to update now: all due ones, once each open stream is due or the oldest has waited
        :attr:`max_wait_s`; else none, and how long until that wait is over (``None``: none is due)."""
        ending = {stream._key for stream in self._ending}
        due = [key for key in streams.due() if key not in ending]  # their finals take their last chunks
        now = time.monotonic()
        self._due_since = {key: self._due_since.get(key, now) for key in due}
        if not due:
            return [], None
        waited = now - min(self._due_since.values())
        if len(due) == len(streams) or waited >= self.max_wait_s:
            return due, None
        return [], self.max_wait_s - waited

    def _finish(self, streams: LLMStreams) -> None:
        """End the ended streams in LLMStreams (:meth:`LLMStreams.end`: their slots free, their finals ride along
        the updates, and come back with them or with advances); a stream that got no samples ends at once, with
        no text; a cancelled one was dropped already."""
        ending = [stream for stream in self._ending if not stream._cancelled]
        self._ending = []
        if not ending:
            return
        heard = [stream for stream in ending if stream._fed]
        for stream in ending:
            if not stream._fed:
                streams.drop(stream._key)
        if heard:
            streams.end([stream._key for stream in heard])
        with self._lock:
            for stream in ending:
                if not stream._fed:
                    self._complete(stream, "")
            self._changed.notify_all()
        if len(heard) < len(ending) and self.on_results is not None:
            self.on_results()

    def _publish(self, partials: list[Partial]) -> None:
        """Hand the streams their partials, and their finals (done, off the live streams, waiters told)."""
        with self._lock:
            for partial in partials:
                stream = self._live.get(partial.stream)
                if stream is None:
                    continue
                if partial.final:
                    self._complete(stream, partial.text)
                else:
                    stream._decoded += self.policy.chunk_samples
                    self._set_text(stream, partial.text)
                    stream._changes += 1
            if any(partial.final for partial in partials):
                self._changed.notify_all()
        if partials and self.on_results is not None:
            self.on_results()

    def _complete(self, stream: LLMServingStream, text: str) -> None:
        """Called with the lock held: ``stream``'s final text is ``text``; it is done."""
        self._set_text(stream, text)
        stream._changes += 1
        stream._done = True
        self._live.pop(stream._key, None)
        self._due_since.pop(stream._key, None)

    @staticmethod
    def _set_text(stream: LLMServingStream, text: str) -> None:
        if text != stream._transcript.text:
            stream._transcript = Transcript(text, words(text), ())

    def _record(self, count: int, seconds: float, frontend_s: float, cpu_s: float) -> None:
        """One update of ``count`` streams as a cycle of :attr:`stats`: ``seconds`` of wall time, of which
        ``frontend_s`` in the due streams' front end (the cycle's front end; the rest its step), and ``cpu_s``
        CPU seconds of the recognizer's thread."""
        audio_s = count * self.policy.chunk_samples / SAMPLE_RATE
        step_s = seconds - frontend_s
        self.stats.record(
            CycleTiming(self.stats.count, count, frontend_s, 0.0, step_s, 0.0, audio_s=audio_s, host_cpu_s=cpu_s)
        )


def _serve(recognizer_ref: weakref.ref, queued: threading.Condition) -> None:
    """The recognizer's thread: everything due whenever its queue moved, or when the oldest due stream's wait for
    the others is over; until it is closed, stopped by an error, or gone (no strong reference while it waits)."""
    seen, wait_s = -1, None
    while True:
        with queued:  # the recognizer's queue lock
            recognizer = recognizer_ref()
            if recognizer is not None and recognizer._epoch == seen and not recognizer._closed:
                recognizer = None
                if recognizer_ref() is not None:  # else it went just now: its finalizer's wake came already
                    queued.wait(wait_s)
                recognizer = recognizer_ref()
            if recognizer is None or recognizer._closed:
                return
            seen = recognizer._epoch
        going, wait_s = recognizer._run_due()
        recognizer = None
        if not going:
            return


def _wake(queued: threading.Condition) -> None:
    """Wake the recognizer's thread (its recognizer is gone: the thread ends)."""
    with queued:
        queued.notify_all()


def build_llm_recognizer(settings: ServeSettings) -> LLMServingRecognizer:
    """The recogniser of the LLM checkpoint directory ``settings.model``, for the server.

    bfloat16 on CUDA, float32 on the CPU; ``settings.chunk_ms``: the policy's chunk (default 2 s);
    ``max_connections`` slots, each holding a segment of ``max_segment_s``; ``context``, ``language``,
    ``fixed_tokens`` and ``max_wait_ms`` as given; ``frontend_workers``: processes that push the streams' audio
    through the front end (``0``: the update's thread and its front-end threads; default: those on the CPU, on CUDA
    one process per four cores, since there the threads share the interpreter lock with the thread that drives the
    GPU and the engine's). ``left_chunks`` is refused; ``dtype`` follows the device. ``ValueError`` names the option.
    """
    if settings.left_chunks is not None:
        raise ValueError(f"--left-chunks is for CTC models; {settings.model!r} is an LLM recogniser")
    device = pick_device(settings.device, "--device")
    chunk = {} if settings.chunk_ms is None else {"chunk_s": settings.chunk_ms / MS_PER_S}
    windows = segment_windows_within(settings.max_segment_s)  # every segment ends within it: no slot holds more
    try:
        policy = StreamPolicy(**chunk, fixed_tokens=settings.fixed_tokens, segment_windows=windows)
    except ValueError as error:
        raise ValueError(f"--chunk-ms: {error}") from None
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = load(str(settings.model), device=device, dtype=dtype)
    try:
        return LLMServingRecognizer(
            model,
            max_streams=settings.max_connections,
            policy=policy,
            context=settings.context,
            language=settings.language,
            max_wait_ms=settings.max_wait_ms,
            frontend_workers=(
                default_frontend_workers(device, settings.max_connections)
                if settings.frontend_workers is None
                else settings.frontend_workers
            ),
        )
    except ValueError as error:
        raise ValueError(
            f"--model {settings.model} with --max-connections {settings.max_connections}: {error}"
        ) from None
