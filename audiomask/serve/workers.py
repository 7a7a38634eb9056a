"""``audiomask serve --ws-workers N``: WebSocket connections in N processes, the one recognizer in the main process.

One process's interpreter lock cannot both speak WebSocket to thousands of
real-time clients (tens of thousands of messages a second) and feed their
streams to the recognizer. With workers, the main process binds the
listening socket and runs the :class:`~audiomask.serve.engine.Engine` and a
:class:`~audiomask.serve.hub.WorkerHub`; N worker processes (spawned) each
run the same FastAPI app on uvicorn over that shared socket, so the kernel
spreads the connections over them, with a
:class:`~audiomask.serve.remote.RemoteEngine` in place of the engine. Every
stream still shares the one recognizer's encoder steps; the protocols, the
limits, the errors and ``/health`` are the same as without workers.

Stopping: SIGTERM or Ctrl-C reach the main process (the workers ignore
them): it tells the workers to stop listening, drains every connection
(final results, ``Done!``, close 1000), tells the workers to exit, and exits
0; a second signal stops at once. A worker that dies ends its connections'
streams; the others go on serving.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
from multiprocessing.sharedctypes import SynchronizedArray
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from audiomask.serve.app import create_app
from audiomask.serve.remote import RemoteEngine
from audiomask.serve.server import uvicorn_config
from audiomask.serve.settings import ServeSettings

if TYPE_CHECKING:  # the recognizer's side loads torch: the spawned workers import this module without it
    from audiomask.asr.recognizer import StreamingRecognizer
    from audiomask.serve.hub import WorkerHub

__all__ = ["CORES_PER_WS_WORKER", "resolve_ws_workers", "run_with_workers"]

CORES_PER_WS_WORKER = 4  # on CUDA, by default: one WebSocket worker per four cores (as for the front end)
WORKER_CONNECT_TIMEOUT_S = 120.0  # spawned workers import torch and the app before they connect
WORKER_EXIT_TIMEOUT_S = 10.0  # after EXIT, then a worker is killed
WATCH_PERIOD_S = 0.5  # how often the main process checks that its workers live
EXIT_STOPPED = 0
EXIT_WORKERS_FAILED = 1  # every worker died, or one never connected
SIGNAL_EXIT_BASE = 128  # a second signal: 128 + its number, the shell's convention

logger = logging.getLogger("audiomask.serve")


def resolve_ws_workers(settings: ServeSettings, device: str) -> int:
    """``settings.ws_workers``, or its default on ``device``: ``0`` on the CPU (one process serves
    everything), one per :data:`CORES_PER_WS_WORKER` cores on CUDA.

    >>> resolve_ws_workers(ServeSettings(ws_workers=3), "cpu"), resolve_ws_workers(ServeSettings(), "cpu")
    (3, 0)
    """
    if settings.ws_workers is not None:
        return settings.ws_workers
    if not device.startswith("cuda"):
        return 0
    return max(1, (os.cpu_count() or 1) // CORES_PER_WS_WORKER)


def listen_socket(settings: ServeSettings, *, reuse_port: bool = False, join: bool = False) -> socket.socket:
    """A TCP socket bound to ``--host``/``--port`` (not listening yet); ``ValueError`` naming the address and
    the reason when it cannot be bound (in use, not an address of this machine, not a host name).

    The bind fails where any other socket holds the address, one with ``SO_REUSEPORT`` included (another
    server's replicas), unless ``join``: then it binds beside the sockets that share the address by
    ``SO_REUSEPORT`` (a replica beside its supervisor's reservation). ``reuse_port`` (implied by ``join``):
    once bound, sockets that ``join`` may bind the address too, and the kernel spreads new connections evenly
    over those that listen (the replicas of :mod:`audiomask.serve.launch`). Linux checks a bound socket's
    ``SO_REUSEPORT`` when the next one binds, so setting it after the bind lets replicas join an address that
    was free when it was reserved.
    """
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if join:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as error:
        sock.close()
        address = f"[{settings.host}]" if family == socket.AF_INET6 else settings.host
        reason = (error.strerror or str(error)).lower()
        raise ValueError(f"cannot listen on {address}:{settings.port} (--host, --port): {reason}") from None
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.set_inheritable(True)
    return sock


def run_with_workers(
    settings: ServeSettings, recognizer: StreamingRecognizer, workers: int, listener: socket.socket | None = None
) -> int:
    """Serve ``settings`` with ``recognizer`` in this process and ``workers`` WebSocket processes; the exit status.

    ``listener``: a bound TCP socket the workers serve on (shared with other servers); ``None``: bind
    ``--host``/``--port`` (:func:`listen_socket`).
    """
    listener = listen_socket(settings) if listener is None else listener
    return asyncio.run(_Supervisor(settings, recognizer, workers).run(listener))


class _Supervisor:
    """The main process: the engine, the hub, the worker processes and the stop signals."""

    def __init__(self, settings: ServeSettings, recognizer: StreamingRecognizer, workers: int) -> None:
        self.settings, self.recognizer, self.count = settings, recognizer, workers
        self.stop = asyncio.Event()
        self.connections: SynchronizedArray | None = None  # each worker's admitted connections (shared memory)
        self.failed = False

    async def run(self, listener: socket.socket) -> int:
        from audiomask.serve.engine import Engine
        from audiomask.serve.hub import WorkerHub

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        engine = Engine(self.settings, self.recognizer)
        await engine.start()
        hub = WorkerHub(engine)
        directory = tempfile.mkdtemp(prefix="audiomask-serve-")
        try:
            await hub.start(os.path.join(directory, "hub.sock"))
            processes = self._spawn(listener, os.path.join(directory, "hub.sock"))
            hub.workers_started = len(processes)
            listener.close()  # each worker holds its own copy
            watcher = asyncio.create_task(self._watch(processes, hub))
            await self.stop.wait()
            watcher.cancel()
            if not await hub.drain():
                print("audiomask serve: some connections did not finish in time; closing them", file=sys.stderr)
            hub.exit()
            await asyncio.to_thread(_join, processes)
        finally:
            await hub.stop()
            await engine.stop()
            shutil.rmtree(directory, ignore_errors=True)
            self.connections = None  # its semaphore is unlinked now, not left to the interpreter's exit
        return EXIT_WORKERS_FAILED if self.failed else EXIT_STOPPED

    def _on_signal(self, signum: int) -> None:
        if self.stop.is_set():
            os._exit(SIGNAL_EXIT_BASE + signum)  # a second signal: stop at once; the workers exit with their link
        self.stop.set()

    def _spawn(self, listener: socket.socket, hub_path: str) -> list[multiprocessing.process.BaseProcess]:
        context = multiprocessing.get_context("spawn")
        self.connections = context.Array("q", self.count)  # kept here: the workers use it after it is sent
        processes = [
            context.Process(
                target=_worker_main,
                args=(self.settings, listener, hub_path, self.connections, index),
                name=f"audiomask-serve-ws-{index}",
            )
            for index in range(self.count)
        ]
        for process in processes:
            process.start()
        return processes

    async def _watch(self, processes: list[multiprocessing.process.BaseProcess], hub: WorkerHub) -> None:
        """Stop the server when every worker has died, or when they do not all connect in time."""
        waited = 0.0
        dead: set[int] = set()
        while True:
            await asyncio.sleep(WATCH_PERIOD_S)
            waited += WATCH_PERIOD_S
            starting = hub.workers_connected_ever < len(processes)
            for index, process in enumerate(processes):
                if not process.is_alive() and index not in dead:
                    dead.add(index)
                    logger.error("WebSocket worker %d stopped (exit %s)", index, process.exitcode)
                    with self.connections.get_lock():
                        self.connections[index] = 0  # its connections have gone with it
            alive = len(processes) - len(dead)
            if not alive or (starting and waited > WORKER_CONNECT_TIMEOUT_S):
                print("audiomask serve: the WebSocket workers stopped or did not start; stopping", file=sys.stderr)
                self.failed = True
                self.stop.set()
                return


def _join(processes: list[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        process.join(WORKER_EXIT_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()


class _WorkerServer(uvicorn.Server):
    """uvicorn in a worker: signals are the main process's, which says when to stop listening and to exit."""

    def __init__(self, config: uvicorn.Config, engine: RemoteEngine) -> None:
        super().__init__(config)
        engine.on_drain, engine.on_exit = self.stop_listening, self.exit_now

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Ignored: Ctrl-C and SIGTERM reach the whole process group, and only the main process acts on them."""

    def stop_listening(self) -> None:
        for server_socket in getattr(self, "servers", []):
            server_socket.close()

    def exit_now(self) -> None:
        self.should_exit = True


def _worker_main(
    settings: ServeSettings, listener: socket.socket, hub_path: str, connections: SynchronizedArray, index: int
) -> None:
    """A WebSocket worker: the app on uvicorn over ``listener``, its engine the main process (spawned process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until uvicorn installs its handlers, which _WorkerServer ignores
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    engine = RemoteEngine(settings, hub_path, connections, index)
    _WorkerServer(uvicorn_config(create_app(settings, engine=engine), settings), engine).run(sockets=[listener])
