"""The recognizer every connection shares, and the threads around it.

One :class:`~audiomask.asr.recognizer.StreamingRecognizer` serves every
connection, so all connected streams share each encoder step. Its calls block
(an encoder step runs inside them), so they never run on the event loop, and
a client's audio costs the event loop no thread hop:

- the event loop checks each message's samples and appends them to the
  connection's :class:`~audiomask.serve.feeds.Feed`;
- a *ticker* thread wakes when a feed completes a block of its stream's audio
  (and at least :data:`TICKS_PER_CHUNK` times a chunk): it hands every due
  feed, in one pass (passes start at most every :data:`PASS_GAP_S`), to a
  *feeder* thread, which opens the streams of new
  connections and ``accept``\\ s each feed's samples (one call per feed and
  pass; the encoder steps that become due run inside), or calls ``poll()``
  when nothing was due (the steps whose wait for stragglers is over). There
  are :data:`FEEDERS` feeders, so that while one runs encoder steps for as
  long as they keep coming due, the other goes on feeding;
- a pass cuts each connection's samples into segments, a stream each
  (:mod:`audiomask.serve.utterances`): it scores their voice activity first,
  all the connections' in one batched call, where the route endpoints by
  voice (:mod:`audiomask.vad`), and opens and ends streams where segments
  start and end (an endpoint, a client's commit, the longest segment);
- after steps ran, the ticker reads the ``transcript()`` of every open
  stream whose tokens grew, and the final of every segment cut whose stream
  is done (it takes no lock, so it goes on while steps run), and hands the
  connections with news to the event loop in one callback, as a feeder does
  with the feeds whose clients may send again; each connection sends its own;
- a client's end of audio is a due feed too: the pass feeds what is left
  and ends the stream in the same call, and the passes after it wake the
  connection once the stream's last chunk is encoded (:meth:`Feed.end`), so
  the ends of many streams share the next steps, and only the feeders ever
  run steps (each thread that runs CUDA work keeps its own library handles
  and workspaces on the GPU); an abandoned stream is cancelled, which runs
  nothing.

:class:`Engine` also counts connections against ``max_connections``, answers
``/health`` (503 until the model is loaded and a first chunk step has run,
and once the recognizer has stopped after an error), and drains: on shutdown
every connection in flight is finished and gets its final result before the
server stops.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.checks import pick_device
from audiomask.constants import SAMPLE_RATE
from audiomask.serve.admission import Listener, Refusal, State, busy_refusal, state_refusal
from audiomask.serve.feeds import Feed, Inbox
from audiomask.serve.segments import Segment, Segmenter
from audiomask.serve.settings import Endpointing, ServeSettings, check_ctc_options
from audiomask.serve.utterances import Utterances
from audiomask.vad.detector import VoiceActivity

__all__ = [
    "DRAIN_TIMEOUT_S",
    "FEEDERS",
    "PASS_GAP_S",
    "SWEEP_PAUSE_FACTOR",
    "TICKS_PER_CHUNK",
    "Engine",
    "GPU_MAX_WAIT_MS",
    "SWITCH_INTERVAL_S",
    "build_recognizer",
    "default_max_wait_ms",
]

MS_PER_S = 1000
TICKS_PER_CHUNK = 8  # ticker wake-ups per chunk of audio when nothing wakes it: polls and sweeps at least this often
# Threads that feed the recognizer, one pass over the due feeds each: an accept (or poll) may find steps due
# and run them, for as long as more come due, and meanwhile the other feeds the connections.
FEEDERS = 2
# Passes start at least this many seconds apart: a pass's voice-activity call and recognizer call cost the
# interpreter lock (and on CUDA a wait for the device) whatever the feeds they take, so that under load a pass
# takes every feed that came due since the last, not the one or two of the moment; a feed waits this much at
# most (figures: docs/defaults.md).
PASS_GAP_S = 0.01
# After a sweep of every stream's transcript that took T seconds, the next waits SWEEP_PAUSE_FACTOR * T:
# with thousands of streams the sweeps take at most 1 / (1 + SWEEP_PAUSE_FACTOR) of the ticker's time.
SWEEP_PAUSE_FACTOR = 3
# On CUDA a ready chunk waits at most this long for the others by default, whatever the chunk: a step computes
# every slot (static shapes), so a longer wait makes no step cheaper, only later (figures: docs/defaults.md).
GPU_MAX_WAIT_MS = 40
# Every torch call of an encoder step releases the interpreter lock, and while the event loop and the ticker
# run Python the step's thread then waits up to one switch interval to take it back. On the CPU the engine
# lowers the interval to this; on CUDA it keeps Python's 5 ms, which a shorter one did not beat (figures:
# docs/defaults.md).
SWITCH_INTERVAL_S = 0.0005
WARMUP_CHUNKS = 2  # chunks of silence the first step runs on before the server says it is ready
WARMUP_TIMEOUT_S = 600.0  # a first CUDA step compiles kernels and captures graphs: minutes on a cold machine
DRAIN_TIMEOUT_S = 30.0  # seconds shutdown waits for the connections in flight to get their final results
HEALTH_CYCLES = 256  # /health summarises the timings of this many recent encoder steps
TICKER_JOIN_S = 5.0  # seconds stop() waits for the ticker thread's last sweep

logger = logging.getLogger("audiomask.serve")


def build_recognizer(settings: ServeSettings) -> StreamingRecognizer:
    """The recognizer ``settings`` describe: its model (the shipped one by default) on its device, in its dtype.

    One encoder slot per connection (``max_streams = max_connections``), in
    the recognizer's default lanes (:func:`~audiomask.asr.capacity.default_lanes`:
    on the CPU up to 16 lanes, so one client's steps compute a few slots, 4 of
    the default 64; on CUDA one lane of all the slots). The front end runs in ``settings.frontend_workers`` processes (``0``: on a
    thread of this process; ``None``: on a thread on the CPU, in the
    recognizer's default number of processes on CUDA, where one thread would
    share the interpreter lock with thousands of connections). The recognizer
    has no idle timeout of its own: a connection idle for ``idle_timeout_s``
    is closed and its stream ended by the session, which also spares every
    call into the recognizer a scan of all open streams. A ready chunk waits
    ``settings.max_wait_ms`` for the other connections' (default
    :func:`default_max_wait_ms`). Raises ``ValueError`` naming the option for a
    bad model file, device or streaming setting.

    An LLM checkpoint directory as ``settings.model`` gives an
    :class:`~audiomask.llm.serving.LLMServingRecognizer` instead: the same calls over the LLM's streams.
    """
    import torch

    from audiomask.asr.checkpoint import load_model
    from audiomask.llm.checkpoint import is_llm_checkpoint

    if settings.model is not None and is_llm_checkpoint(settings.model):
        from audiomask.llm.serving import build_llm_recognizer

        return build_llm_recognizer(settings)  # type: ignore[return-value]  # the calls the engine makes
    check_ctc_options(settings)

    device = pick_device(settings.device, "--device")
    model = load_model(settings.model, dtype=getattr(torch, settings.dtype))
    workers = settings.frontend_workers
    in_processes = str(device).startswith("cuda") if workers is None else workers > 0
    try:
        recognizer = StreamingRecognizer(
            model,
            device,
            settings.chunk_ms,
            settings.left_chunks,
            max_streams=settings.max_connections,
            frontend_process=in_processes,
            frontend_workers=workers or None,
            max_wait_ms=settings.max_wait_ms,
        )
    except ValueError as error:
        raise ValueError(
            f"--chunk-ms/--left-chunks/--max-connections/--frontend-workers/--max-wait-ms: {error}"
        ) from None
    if settings.max_wait_ms is None:
        recognizer.max_wait_s = default_max_wait_ms(recognizer.chunk_ms, str(device)) / MS_PER_S
    return recognizer


def default_max_wait_ms(chunk_ms: int, device: str) -> int:
    """How long a ready chunk waits for the other connections' by default, ms: one chunk on the CPU (a step
    costs every slot of its lane there, so fewer, fuller steps), :data:`GPU_MAX_WAIT_MS` on CUDA, or the chunk
    if shorter (a step costs the same however many slots are ready, and clients start at any moment).

    >>> default_max_wait_ms(320, "cpu"), default_max_wait_ms(1280, "cuda:0"), default_max_wait_ms(20, "cuda")
    (320, 40, 20)
    """
    return min(chunk_ms, GPU_MAX_WAIT_MS) if device.startswith("cuda") else chunk_ms


class Engine:
    """The shared recognizer of a server, its ticker and feeder threads, its connection count and health.

    Args:
        settings: the server's options.
        recognizer: the recognizer to serve; ``None``: built from ``settings`` by :meth:`start`
            (:func:`build_recognizer`), and closed by :meth:`stop`. A recognizer given is the
            caller's to close.

    :meth:`start` and :meth:`stop` run on the event loop (an app's startup and
    shutdown); so do :meth:`admit`, :meth:`attach`, :meth:`detach` and :meth:`drain`.
    With a recognizer on the CPU, the engine lowers the process's thread switch interval
    (:func:`sys.setswitchinterval`) to :data:`SWITCH_INTERVAL_S` where it is longer.
    """

    def __init__(self, settings: ServeSettings, recognizer: StreamingRecognizer | None = None) -> None:
        self.settings = settings
        self._recognizer = recognizer
        self._owns_recognizer = recognizer is None
        self.state = State.LOADING
        self.error: str | None = None  # why the engine FAILED
        self.connections = 0  # handshakes admitted and not yet released
        self._feeds: dict[Feed, Listener] = {}  # the connections attached, by feed
        self._voice: VoiceActivity | None = None  # speech probabilities of the connections that endpoint by voice
        self._feeds_lock = threading.Lock()  # the ticker reads the feeds while the loop changes them
        self._inbox: Inbox | None = None  # made with the recognizer (its block sizes)
        self._served_from = 0  # the first cycle after the warm-up: /health's recent steps are the served ones
        self._drained: asyncio.Event | None = None  # set whenever no connection is attached
        self._loop: asyncio.AbstractEventLoop | None = None
        self._feed_pool = ThreadPoolExecutor(FEEDERS, thread_name_prefix="audiomask-serve-feed")
        self._feeders = threading.BoundedSemaphore(FEEDERS)  # held by each pass in flight
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def recognizer(self) -> StreamingRecognizer:
        """The recognizer (``RuntimeError`` before it is built)."""
        if self._recognizer is None:
            raise RuntimeError("the recognizer is not built yet: call after the engine is READY")
        return self._recognizer

    # -- life cycle (event loop) -----------------------------------------------------------------

    async def start(self) -> None:
        """Build the recognizer (unless given) and run its first step on a thread; returns at once."""
        self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        self._drained.set()
        self._spawn(self._load, "audiomask-serve-load")

    async def stop(self) -> None:
        """Stop the ticker and the feeders; close the recognizer when the engine built it."""
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            await asyncio.to_thread(thread.join, TICKER_JOIN_S)
        self._feed_pool.shutdown(wait=False, cancel_futures=True)
        if self._owns_recognizer and self._recognizer is not None:
            self._recognizer.close()

    def begin_drain(self) -> None:
        """Refuse new connections from now on, and tell every connection in flight to finish (once)."""
        if self.state is State.DRAINING:
            return
        if self.state is not State.FAILED:
            self.state = State.DRAINING
        with self._feeds_lock:
            listeners = list(self._feeds.values())
        logger.info("draining %d connection(s)", len(listeners))
        for listener in listeners:
            listener.stop()

    async def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Refuse new connections, finish those in flight; whether all were done within ``timeout_s``."""
        self.begin_drain()
        if self._drained is None:
            return True
        try:
            await asyncio.wait_for(self._drained.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    # -- connections (event loop) ----------------------------------------------------------------

    def admit(self) -> Refusal | None:
        """Count a new connection, or say why it is refused (the count is unchanged then)."""
        refusal = state_refusal(self.state, self.error) or busy_refusal(self.connections, self.settings)
        if refusal is None:
            self.connections += 1
        return refusal

    def release(self) -> None:
        """A connection :meth:`admit` counted has ended."""
        self.connections -= 1

    def attach(self, listener: Listener, name: str, endpointing: Endpointing = (None, None)) -> Feed:
        """The feed of a new connection (its streams are named after ``name``); ``listener`` hears of its
        segments and failure, and is stopped when the server drains. ``endpointing``: ``(vad, max_segment_s)``
        of its :class:`~audiomask.serve.segments.Segmenter` (``(None, None)``: one segment until it commits)."""
        inbox = self._inbox
        if inbox is None:
            raise RuntimeError("the recognizer is not built yet: attach connections once the engine is READY")
        vad, max_segment_s = endpointing
        vad_key = None
        if vad is not None:
            assert self._voice is not None  # made with the inbox
            vad_key = self._voice.open()
        utterances = Utterances(name, Segmenter(vad, max_segment_s), inbox.first_block, inbox.block, vad_key)
        feed = inbox.open(name, utterances)
        with self._feeds_lock:
            self._feeds[feed] = listener
        if self._drained is not None:
            self._drained.clear()
        if self.state is State.DRAINING:
            listener.stop()
        return feed

    def detach(self, feed: Feed) -> None:
        """The connection of ``feed`` has ended: its samples not fed are dropped, its streams cancelled (freed at
        the recognizer's next call, by a feeder)."""
        feeding = feed.close()  # when a pass is feeding the streams now, it cancels them afterwards
        if not feeding:
            for stream in feed.utterances.unfinished():
                stream.cancel()
        if feed.utterances.vad_key is not None and self._voice is not None:
            self._voice.close(feed.utterances.vad_key)
        with self._feeds_lock:
            self._feeds.pop(feed, None)
            empty = not self._feeds
        if empty and self._drained is not None:
            self._drained.set()

    async def finish(self, feed: Feed) -> list[Segment]:
        """Feed every sample put to ``feed`` and finish its streams: the segments not yet reported, the last one
        final (its text empty when no segment ended with the audio).

        Waits for the encoder steps the streams' last chunks need (a feeder runs them); raises the stream's error.
        """
        await feed.end()
        return feed.utterances.finish()

    @property
    def feed_limits(self) -> tuple[int, int, int, bool] | None:
        """``(first_block, block, max_buffered, ahead)`` of the feeds, samples: a stream's first block, each later
        one, and what a feed holds before its client waits; whether the recognizer takes audio ahead of its
        blocks (``None`` until the recognizer is ready)."""
        inbox = self._inbox
        return None if inbox is None else (inbox.first_block, inbox.block, inbox.max_buffered, inbox.ahead)

    @property
    def streams(self) -> int:
        """Connections whose stream is open (the ticker has fed them samples)."""
        with self._feeds_lock:
            return sum(feed.stream is not None for feed in self._feeds)

    def health(self) -> tuple[int, dict[str, object]]:
        """``(HTTP status, JSON body)`` of ``/health``: 200 when ready, 503 otherwise."""
        body: dict[str, object] = {
            "status": self.state.value,
            "connections": self.connections,
            "max_connections": self.settings.max_connections,
            "streams": self.streams,
        }
        if self.settings.replica is not None:
            body["replica"] = self.settings.replica
        if self._recognizer is not None:
            recognizer = self._recognizer
            body |= {
                "device": str(recognizer.device),
                "chunk_ms": recognizer.chunk_ms,
                "cycles": recognizer.stats.count,
                "chunks": recognizer.stats.chunks,
                "max_wait_ms": round(recognizer.max_wait_s * MS_PER_S),
                "recent_cycles": recognizer.stats.recent(HEALTH_CYCLES, since=self._served_from),
            }
        if self.error is not None:
            body["error"] = self.error
        return (200 if self.state is State.READY else 503), body

    # -- threads ---------------------------------------------------------------------------------

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _load(self) -> None:
        """Build the recognizer if needed, run a first step, then start the ticker (load thread)."""
        started = time.perf_counter()
        try:
            if self._recognizer is None:
                self._recognizer = build_recognizer(self.settings)
            recognizer = self._recognizer
            if hasattr(recognizer, "on_results"):  # it steps on a thread of its own: the ticker wakes on its results
                recognizer.on_results = self._wake.set
            if recognizer.device.type == "cpu":
                sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            stream = recognizer.open_stream("warm-up")
            silence = np.zeros(WARMUP_CHUNKS * recognizer.chunk_ms * SAMPLE_RATE // MS_PER_S, np.float32)
            stream.accept(silence)
            stream.finish(timeout=WARMUP_TIMEOUT_S)
            # Voice activity is scored on the recognizer's device, all connections' in one call per pass.
            self._voice = VoiceActivity(device=recognizer.device)
            warm_up = self._voice.open()
            self._voice.score([(warm_up, silence)])
            self._voice.close(warm_up)
        except Exception as error:  # noqa: BLE001 - any failure is reported by /health and refused handshakes
            self._fail(error)
            return
        # The libraries and the model live as long as the server: full collections, which stop every thread,
        # skip them from now on (figures: docs/defaults.md).
        gc.collect()
        gc.freeze()
        self._served_from = recognizer.stats.count  # the warm-up's cycles, compiling kernels, are not served ones
        first_block, block = recognizer.first_block_samples, recognizer.block_samples
        # A client waits once two blocks wait in its feed: one being completed, one due.
        self._inbox = Inbox(
            self._wake, first_block, block, max_buffered=first_block + block, ahead=recognizer.takes_audio_ahead
        )
        if self.state is State.LOADING:
            self.state = State.READY
        logger.info(
            "ready in %.1f s: %s, %d ms chunks, %d slots",
            time.perf_counter() - started,
            recognizer.device,
            recognizer.chunk_ms,
            recognizer.max_streams,
        )
        self._spawn(self._tick, "audiomask-serve-ticker")

    def _fail(self, error: BaseException) -> None:
        """The recognizer cannot serve: ``/health`` says why, and new connections are refused."""
        self.error = f"{type(error).__name__}: {error}"
        self.state = State.FAILED
        logger.error("the recognizer cannot serve: %s", self.error)

    def _tick(self) -> None:
        """Start a pass over the due feeds when a feeder is free and the last pass started :data:`PASS_GAP_S`
        ago; sweep the texts after steps ran (ticker thread).

        The ticker itself never calls into the recognizer but for ``partial()`` (which takes no lock), so
        its sweeps go on while encoder steps run.
        """
        recognizer, inbox = self.recognizer, self._inbox
        assert inbox is not None
        tick_s = recognizer.chunk_ms / MS_PER_S / TICKS_PER_CHUNK
        cycles_swept = recognizer.stats.count
        # time.monotonic() before which no sweep starts, no pass only polls, and no pass starts
        sweep_at = poll_at = pass_at = 0.0
        timeout_s = tick_s
        while not self._stopping.is_set():
            self._wake.wait(timeout_s)
            self._wake.clear()
            timeout_s = tick_s
            now = time.monotonic()
            if now < pass_at:
                timeout_s = pass_at - now
            elif self._feeders.acquire(blocking=False):
                taken = inbox.take(recognizer.stats.count)
                if taken or now >= poll_at:  # a pass without samples polls: at most once a tick
                    poll_at, pass_at = now + tick_s, now + PASS_GAP_S
                    self._feed_pool.submit(self._pass, recognizer, inbox, taken)
                else:
                    self._feeders.release()
            done = inbox.done()  # streams a long pass has finished among its others' steps
            changed: list[tuple[Listener, Utterances]] = []
            cycles = recognizer.stats.count
            if cycles != cycles_swept and now >= sweep_at:
                cycles_swept = cycles
                changed = self._sweep()
                sweep_at = now + SWEEP_PAUSE_FACTOR * (time.monotonic() - now)
            elif cycles != cycles_swept:
                timeout_s = min(timeout_s, sweep_at - now)
            else:  # no step ran: a segment cut earlier may have got its final text all the same
                changed = self._sweep_finishing()
            if changed or done:
                self._post(done, changed)

    def _pass(self, recognizer: StreamingRecognizer, inbox: Inbox, taken: list[tuple[Feed, np.ndarray]]) -> None:
        """Feed ``taken``, or poll when it holds no samples, and report to the event loop (a feeder thread).

        An error outside a stream's own ``accept`` means the recognizer stopped: every connection fails.
        """
        try:
            count, moved = self._feed(recognizer, taken)
            if not count:
                recognizer.poll()
            woken, orphans = inbox.fed(taken)
            for stream in orphans:  # their connection ended while they were fed
                stream.cancel()
            if woken or moved:
                self._post(woken, [], moved)
        except Exception as error:  # noqa: BLE001 - a stopped recognizer ends every connection
            if not self._stopping.is_set():  # else the server is stopping and has closed the recognizer
                self._fail(error)
                self._fail_feeds(error)
                self._stopping.set()
        finally:
            self._feeders.release()
            self._wake.set()  # the ticker may start the next pass, and sweep what these steps produced

    def _feed(self, recognizer: StreamingRecognizer, taken: list[tuple[Feed, np.ndarray]]) -> tuple[int, list[Feed]]:
        """Cut each feed's samples into its segments (scoring their voice activity first, in one batch), open
        the streams of segments that start, feed them all and end those of segments that end, in one call; how
        many streams it fed or ended, and the feeds whose :attr:`~Feed.endpoint_due` moved (a feeder thread).
        The samples were checked when they were put (:meth:`Feed.put`, or in a WebSocket worker).

        A feed whose stream could not be opened, or refused its samples, keeps the error in ``feed.error``.
        """
        voiced = [(feed.utterances.vad_key, samples) for feed, samples in taken if feed.utterances.vad_key is not None]
        scores = iter(self._voice.score(voiced) if voiced and self._voice is not None else ())
        pairs: list[tuple[object, np.ndarray]] = []
        owners: list[Feed] = []
        finished: list[object] = []
        moved: list[Feed] = []
        for feed, samples in taken:
            utterances = feed.utterances
            heard = next(scores) if utterances.vad_key is not None else None
            if feed.clearing:
                utterances.clear()
            try:
                fed, ended, feed.new_blocks = utterances.route(
                    recognizer.open_stream, samples, heard, commit=feed.committing, last=feed.ending
                )
            except Exception as error:  # noqa: BLE001 - the connection reports it to its client
                feed.error = error
                continue
            due = utterances.segmenter.endpoint_due
            if due != feed.endpoint_due:
                feed.endpoint_due = due
                moved.append(feed)
            pairs += fed
            owners += [feed] * len(fed)
            finished += ended
        errors = recognizer.accept_many(pairs, checked=True, finished=finished)  # type: ignore[arg-type]
        for feed, error in zip(owners, errors):
            if error is not None:
                feed.error = error
        return len(pairs) + len(finished), moved

    def _sweep_finishing(self) -> list[tuple[Listener, Utterances]]:
        """As :meth:`_sweep`, over the connections with a segment cut whose final text is not reported yet."""
        with self._feeds_lock:
            feeds = [(feed, listener) for feed, listener in self._feeds.items() if feed.utterances.finishing]
        return [(listener, feed.utterances) for feed, listener in feeds if feed.utterances.sweep()]

    def _sweep(self) -> list[tuple[Listener, Utterances]]:
        """The listeners whose segments have news (a stream's tokens changed, a final is known), with their
        connections' :class:`~audiomask.serve.utterances.Utterances`."""
        with self._feeds_lock:
            feeds = list(self._feeds.items())
        return [(listener, feed.utterances) for feed, listener in feeds if feed.utterances.sweep()]

    def _fail_feeds(self, error: BaseException) -> None:
        """Every attached connection fails with ``error`` (the recognizer stopped)."""
        failure = error if isinstance(error, RuntimeError) else RuntimeError(f"{type(error).__name__}: {error}")
        with self._feeds_lock:
            feeds = list(self._feeds)
        for feed in feeds:
            if feed.error is None:
                feed.error = failure
        self._post(feeds, [])

    def _post(
        self, woken: list[Feed], changed: list[tuple[Listener, Utterances]], moved: list[Feed] | None = None
    ) -> None:
        """Hand the event loop a pass's outcome in one callback."""
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._deliver, woken, changed, moved or [])
        except RuntimeError:  # the loop has closed: the server is gone
            pass

    def _deliver(self, woken: list[Feed], changed: list[tuple[Listener, Utterances]], moved: list[Feed]) -> None:
        """Wake the feeds the event loop waits on, tell failed connections, hand over the results and where
        endpoints may come (event loop)."""
        for feed in moved:
            listener = self._feeds.get(feed)
            if listener is not None:
                listener.endpoint_due(feed.endpoint_due)
        for feed in woken:
            feed.wake()
            listener = self._feeds.get(feed)
            if feed.error is not None and listener is not None:
                listener.failed(feed.error)
        for listener, utterances in changed:
            segments = utterances.take()  # each once: a finish may have taken them already
            if segments:
                listener.results(segments)
