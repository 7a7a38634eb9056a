"""The recognizer every connection shares, and the threads around it.

One :class:`~audiomask.asr.recognizer.StreamingRecognizer` serves every
connection, so all connected streams share each encoder step. Its calls block
(an encoder step runs inside them), so they never run on the event loop:

- ``accept``, ``finish`` and ``open_stream`` run on a thread pool of
  ``max_connections + 1`` threads: a connection has at most one such call
  at a time (it reads its next message only after its previous samples were
  accepted), so no call waits for a thread held by another connection;
- a *ticker* thread wakes every quarter chunk (and at once after an
  ``accept``): it calls the recognizer's ``poll()`` where it has one (the
  cycles due now), and after any cycle ran it reads every open stream's
  ``partial()`` and hands the texts that changed to the event loop, where each
  connection sends its own.

:class:`Engine` also counts connections against ``max_connections``, answers
``/health`` (503 until the model is loaded and a first chunk step has run),
and drains: on shutdown every connection in flight is finished and gets its
final result before the server stops.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from audiomask.asr.recognizer import RecognizerStream, StreamingRecognizer
from audiomask.constants import SAMPLE_RATE
from audiomask.serve.settings import ServeSettings

__all__ = [
    "DRAIN_TIMEOUT_S",
    "RETRY_AFTER_BUSY_S",
    "RETRY_AFTER_STARTING_S",
    "TICKS_PER_CHUNK",
    "Engine",
    "Listener",
    "Refusal",
    "State",
    "build_recognizer",
]

MS_PER_S = 1000
TICKS_PER_CHUNK = 4  # ticker wake-ups per chunk of audio: a partial waits at most a quarter chunk for a sweep
WARMUP_CHUNKS = 2  # chunks of silence the first step runs on before the server says it is ready
WARMUP_TIMEOUT_S = 600.0  # a first CUDA step compiles kernels and captures graphs: minutes on a cold machine
DRAIN_TIMEOUT_S = 30.0  # seconds shutdown waits for the connections in flight to get their final results
RETRY_AFTER_BUSY_S = 5  # Retry-After (seconds) of a handshake refused because every connection is taken
RETRY_AFTER_STARTING_S = 1  # ... because the model is still loading, or the server is stopping
TICKER_JOIN_S = 5.0  # seconds stop() waits for the ticker thread's last sweep

logger = logging.getLogger("audiomask.serve")
Result = TypeVar("Result")


class State(enum.Enum):
    """Where the engine is: ``/health`` answers 200 only when ``READY``."""

    LOADING = "loading"  # building the recognizer, or running its first step
    READY = "ready"
    FAILED = "failed"  # the recognizer could not be built or its first step failed
    DRAINING = "draining"  # shutting down: new connections are refused, those in flight get their final results


class Listener(Protocol):
    """A connection as the engine sees it: its stream (``None`` before its first samples) and how to reach it."""

    @property
    def stream(self) -> RecognizerStream | None:
        """The connection's stream, once its first samples came."""

    def text_changed(self, text: str) -> None:
        """The stream's text is now ``text`` (called on the event loop)."""

    def stop(self) -> None:
        """Finish now: the server is stopping (called on the event loop)."""


@dataclass(frozen=True)
class Refusal:
    """Why a WebSocket handshake is refused: HTTP ``status``, a one-line ``message`` and ``Retry-After`` seconds."""

    status: int
    message: str
    retry_after_s: int | None = None


def build_recognizer(settings: ServeSettings) -> StreamingRecognizer:
    """The recognizer ``settings`` describe: its model (the shipped one by default) on its device.

    One encoder slot per connection (``max_streams = max_connections``); streams
    without audio for ``idle_timeout_s`` are ended, so that they hold nobody's
    steps. Raises ``ValueError`` naming the option for a bad model file, device
    or streaming setting.
    """
    from audiomask.asr.checkpoint import load_model
    from audiomask.cli.common import pick_device

    device = pick_device(settings.device)
    model = load_model(settings.model)
    try:
        return StreamingRecognizer(
            model,
            device,
            settings.chunk_ms,
            settings.left_chunks,
            max_streams=settings.max_connections,
            idle_timeout_s=settings.idle_timeout_s,
        )
    except ValueError as error:
        raise ValueError(f"--chunk-ms/--left-chunks/--max-connections: {error}") from None


class Engine:
    """The shared recognizer of a server, its thread pool and ticker, its connection count and health.

    Args:
        settings: the server's options.
        recognizer: the recognizer to serve; ``None``: built from ``settings`` by :meth:`start`
            (:func:`build_recognizer`), and closed by :meth:`stop`. A recognizer given is the
            caller's to close.

    :meth:`start` and :meth:`stop` run on the event loop (an app's startup and
    shutdown); so do :meth:`admit`, :meth:`attach` and :meth:`drain`.
    """

    def __init__(self, settings: ServeSettings, recognizer: StreamingRecognizer | None = None) -> None:
        self.settings = settings
        self._recognizer = recognizer
        self._owns_recognizer = recognizer is None
        self.state = State.LOADING
        self.error: str | None = None  # why the engine FAILED
        self.connections = 0  # handshakes admitted and not yet released
        self._listeners: set[Listener] = set()
        self._listeners_lock = threading.Lock()  # the ticker reads the set while the loop changes it
        self._drained: asyncio.Event | None = None  # set whenever no listener is attached
        self._executor = ThreadPoolExecutor(settings.max_connections + 1, thread_name_prefix="audiomask-serve")
        self._loop: asyncio.AbstractEventLoop | None = None
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
        """Stop the ticker and the thread pool; close the recognizer when the engine built it."""
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            await asyncio.to_thread(thread.join, TICKER_JOIN_S)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._owns_recognizer and self._recognizer is not None:
            self._recognizer.close()

    async def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Refuse new connections, finish those in flight; whether all were done within ``timeout_s``."""
        if self.state is not State.FAILED:
            self.state = State.DRAINING
        with self._listeners_lock:
            listeners = list(self._listeners)
        logger.info("draining %d connection(s)", len(listeners))
        for listener in listeners:
            listener.stop()
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
        if self.state is State.LOADING:
            return Refusal(503, "the model is loading: retry shortly", RETRY_AFTER_STARTING_S)
        if self.state is State.DRAINING:
            return Refusal(503, "the server is shutting down: retry on another replica", RETRY_AFTER_STARTING_S)
        if self.state is State.FAILED:
            return Refusal(503, f"the server cannot recognize speech: {self.error}")
        limit = self.settings.max_connections
        if self.connections >= limit:
            return Refusal(
                503, f"server busy: all {limit} connections (--max-connections) are in use", RETRY_AFTER_BUSY_S
            )
        self.connections += 1
        return None

    def release(self) -> None:
        """A connection :meth:`admit` counted has ended."""
        self.connections -= 1

    def attach(self, listener: Listener) -> None:
        """Send ``listener`` its stream's text changes, and stop it when the server drains."""
        with self._listeners_lock:
            self._listeners.add(listener)
        if self._drained is not None:
            self._drained.clear()
        if self.state is State.DRAINING:
            listener.stop()

    def detach(self, listener: Listener) -> None:
        """The connection of ``listener`` has ended."""
        with self._listeners_lock:
            self._listeners.discard(listener)
            empty = not self._listeners
        if empty and self._drained is not None:
            self._drained.set()

    @property
    def streams(self) -> int:
        """Connections whose stream is open (they have sent samples)."""
        with self._listeners_lock:
            return sum(listener.stream is not None for listener in self._listeners)

    async def call(self, function: Callable[..., Result], *args: Any) -> Result:
        """``function(*args)`` on the engine's thread pool: a recognizer call, off the event loop."""
        assert self._loop is not None, "Engine.start() has not run"
        return await self._loop.run_in_executor(self._executor, function, *args)

    def nudge(self) -> None:
        """Samples were accepted: cycles may have run, so the ticker sweeps the texts now."""
        self._wake.set()

    def health(self) -> tuple[int, dict[str, object]]:
        """``(HTTP status, JSON body)`` of ``/health``: 200 when ready, 503 otherwise."""
        body: dict[str, object] = {
            "status": self.state.value,
            "connections": self.connections,
            "max_connections": self.settings.max_connections,
            "streams": self.streams,
        }
        if self._recognizer is not None:
            recognizer = self._recognizer
            body |= {
                "device": str(recognizer.device),
                "chunk_ms": recognizer.chunk_ms,
                "cycles": recognizer.stats.count,
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
            stream = recognizer.open_stream("warm-up")
            stream.accept(np.zeros(WARMUP_CHUNKS * recognizer.chunk_ms * SAMPLE_RATE // MS_PER_S, np.float32))
            stream.finish(timeout=WARMUP_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - any failure is reported by /health and refused handshakes
            self.error = f"{type(error).__name__}: {error}"
            self.state = State.FAILED
            logger.error("the recognizer could not start: %s", self.error)
            return
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

    def _tick(self) -> None:
        """Poll the recognizer every quarter chunk (or when nudged); after cycles ran, sweep the texts."""
        recognizer = self.recognizer
        poll = getattr(recognizer, "poll", None)
        tick_s = recognizer.chunk_ms / MS_PER_S / TICKS_PER_CHUNK
        swept: dict[Listener, str] = {}
        cycles_seen = -1
        while not self._stopping.is_set():
            self._wake.wait(tick_s)
            self._wake.clear()
            try:
                if poll is not None:
                    poll()
                cycles = recognizer.stats.count
                if cycles != cycles_seen:
                    cycles_seen = cycles
                    swept = self._sweep(swept)
            except Exception:  # a stopped recognizer fails each connection's own call instead
                logger.exception("ticker")
                return

    def _sweep(self, swept: dict[Listener, str]) -> dict[Listener, str]:
        """Hand each listener whose text changed since ``swept`` its new text; the texts now (ticker thread)."""
        with self._listeners_lock:
            listeners = list(self._listeners)
        texts: dict[Listener, str] = {}
        changed = []
        for listener in listeners:
            stream = listener.stream
            if stream is None:
                continue
            text = texts[listener] = stream.partial()
            if swept.get(listener) != text:
                changed.append((listener, text))
        if changed and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(_deliver, changed)
            except RuntimeError:  # the loop has closed: the server is gone
                pass
        return texts


def _deliver(changed: list[tuple[Listener, str]]) -> None:
    for listener, text in changed:
        listener.text_changed(text)
