"""Start ``audiomask serve``: one recognizer in this process, or ``--replicas N`` processes of one recognizer each.

One process serves one recognizer, and that process's interpreter lock
bounds how many real-time streams it can feed, whatever the GPU (on an H200
with the shipped model: ~1,250-1,500 clients, ``docs/serving.md``). With
``--replicas N`` this process reserves the address and starts N replica
processes; each listens on it with a socket of its own (``SO_REUSEPORT``:
the kernel spreads new connections evenly over them) and runs the whole
server there (its recognizer, and its WebSocket workers where it has them);
a connection stays on its replica for its lifetime. Each replica takes:

- a share of ``--max-connections``, a tenth over an even split (the kernel
  spreads connections by a hash of their addresses: evenly on average, not
  exactly); each refuses connections beyond its share with HTTP 503 and
  ``Retry-After``, so the server admits up to 1.1 x ``--max-connections``;
- a device: with ``--device cuda`` or ``auto`` on a host with G GPUs, replica
  ``i`` uses ``cuda:(i mod G)`` (one replica per GPU, or several on one GPU,
  each with an interpreter lock of its own); ``cpu`` or ``cuda:N``: all on it;
- a share of the cores for its default worker counts (``--ws-workers`` and
  ``--frontend-workers`` given explicitly count per replica).

``/health`` is answered by the replica that takes the request, for itself,
with ``"replica": i``. Stopping: SIGTERM or Ctrl-C reach this process (each
replica runs in a process group of its own), which tells every replica to
drain (SIGTERM): each finishes its streams (final results, ``Done!``, close
1000) and exits 0, and so does this process once all have; a second signal
stops them at once. A replica that dies is reported and the others go on;
once none is left the exit status is 1. A replica whose supervisor dies
(SIGKILL) is sent SIGTERM and drains (:func:`stop_with_parent`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
from types import FrameType

from audiomask.checks import check_int, pick_device
from audiomask.serve.server import run
from audiomask.serve.settings import SERVE_THREADS, ServeSettings
from audiomask.serve.workers import CORES_PER_WS_WORKER, listen_socket, resolve_ws_workers, run_with_workers

__all__ = ["REPLICA_HEADROOM", "memory_shares", "replica_settings", "serve", "serve_replicas", "stop_with_parent"]

# Each replica's connections (and encoder slots) over an even split of --max-connections: 2,000 connections
# hashed over 2 replicas put more than 1,100 on one about once in 150,000 times (4.5 standard deviations).
REPLICA_HEADROOM = 1.1
EXIT_STOPPED = 0
EXIT_REPLICAS_FAILED = 1  # a replica exited with an error, was stopped at once, or died
WATCH_PERIOD_S = 0.5  # how often this process checks its replicas
PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal this process gets when the thread that started it exits (Linux)


def serve(settings: ServeSettings, *, reuse_port: bool = False) -> int:
    """Serve ``settings`` with one recognizer built in this process until a stop signal; the exit status.

    With WebSocket workers (``settings.ws_workers``, by default on CUDA) they serve the connections and this
    process the recognizer (:mod:`audiomask.serve.workers`); otherwise this process serves both
    (:mod:`audiomask.serve.server`). The address is bound first (it listens once the model is loaded and the
    start-up line printed), so that an address it cannot have is an error before anything else;
    ``reuse_port``: beside the other replicas (``SO_REUSEPORT``). ``--port 0`` is the port bound. Raises
    ``ValueError`` naming the option for a bad model, device, setting or address.
    """
    listener = listen_socket(settings, join=reuse_port)
    with listener:  # closed here if the model cannot be loaded; the server closes it when it stops
        return _serve_on(dataclasses.replace(settings, port=listener.getsockname()[1]), listener)


def _serve_on(settings: ServeSettings, listener: socket.socket) -> int:
    """:func:`serve` once ``listener`` is bound to ``settings``' address."""
    import torch

    from audiomask.serve.engine import build_recognizer

    torch.set_num_threads(SERVE_THREADS)
    recognizer = build_recognizer(settings)
    workers = resolve_ws_workers(settings, str(recognizer.device))
    replica = "" if settings.replica is None else f"replica {settings.replica}: "
    print(
        f"audiomask serve: {replica}{settings.describe_routes()}; {recognizer.device}, {recognizer.chunk_ms} ms "
        f"chunks, up to {settings.max_connections} connections"
        + (f", {workers} WebSocket worker processes" if workers else ""),
        file=sys.stderr,
        flush=True,
    )
    with recognizer:
        if workers:
            return run_with_workers(settings, recognizer, workers, listener)
        return run(settings, recognizer, listener)


def replica_settings(settings: ServeSettings, replicas: int, devices: list[str], cores: int) -> list[ServeSettings]:
    """Each replica's settings: its number, device (``devices``, one per replica), share of the connections
    (:data:`REPLICA_HEADROOM` over an even split), and worker counts (those not given: their defaults on
    ``cores // replicas`` cores).

    >>> [(s.replica, s.device, s.max_connections, s.ws_workers, s.frontend_workers)
    ...  for s in replica_settings(ServeSettings(max_connections=2000), 2, ["cuda:0", "cuda:0"], cores=16)]
    [(0, 'cuda:0', 1100, 2, 2), (1, 'cuda:0', 1100, 2, 2)]
    >>> replica_settings(ServeSettings(max_connections=8, ws_workers=0), 2, ["cpu", "cpu"], cores=2)[1].ws_workers
    0
    """
    from audiomask.features.process import default_workers

    share = math.ceil(settings.max_connections * REPLICA_HEADROOM / replicas)
    cores_each = max(1, cores // replicas)
    made = []
    for index, device in enumerate(devices):
        on_cuda = device.startswith("cuda")
        ws_workers, frontend_workers = settings.ws_workers, settings.frontend_workers
        if ws_workers is None:
            ws_workers = max(1, cores_each // CORES_PER_WS_WORKER) if on_cuda else 0
        if frontend_workers is None and on_cuda:
            frontend_workers = default_workers(share, cores_each)
        made.append(
            dataclasses.replace(
                settings,
                replica=index,
                device=device,
                max_connections=share,
                ws_workers=ws_workers,
                frontend_workers=frontend_workers,
            )
        )
    return made


def memory_shares(devices: list[str]) -> list[float]:
    """The share of its device's memory each replica may take: equal shares of a GPU that several replicas
    use (each sizes its slots against its own, so that none takes what another needs), all of any other.

    >>> memory_shares(["cuda:0", "cuda:1", "cuda:0", "cpu", "cpu"])
    [0.5, 1.0, 0.5, 1.0, 1.0]
    """
    return [1 / devices.count(device) if device.startswith("cuda") else 1.0 for device in devices]


def _replica_devices(device: str, replicas: int) -> list[str]:
    """The device of each of ``replicas``: ``cuda``/``auto`` with GPUs spread round-robin, any other as given."""
    resolved = pick_device(device, "--device")
    if resolved != "cuda":
        return [resolved] * replicas
    import torch

    count = torch.cuda.device_count()
    return [f"cuda:{index % count}" for index in range(replicas)]


def serve_replicas(settings: ServeSettings, replicas: int) -> int:
    """Serve ``settings`` with ``replicas`` processes on one address until a stop signal; the exit
    status (0 once every replica has drained and exited 0). Raises ``ValueError`` naming the option for a bad
    ``--replicas``, ``--device`` or address; a replica's own error is its stderr line and exit status 1 here."""
    from audiomask.features.process import available_cores

    check_int("--replicas", replicas, minimum=1)
    devices = _replica_devices(settings.device, replicas)
    # Bound, never listening: it takes no connection, and holds the port (one picked for --port 0) for the
    # replicas' own sockets until the server stops; bound only where no other server's sockets are.
    reservation = listen_socket(settings, reuse_port=True)
    port = reservation.getsockname()[1]
    each = replica_settings(dataclasses.replace(settings, port=port), replicas, devices, available_cores())
    context = multiprocessing.get_context("spawn")
    supervisor = _Supervisor(
        [
            context.Process(
                target=_replica_main, args=(replica, share, os.getpid()), name=f"audiomask-serve-replica-{index}"
            )
            for index, (replica, share) in enumerate(zip(each, memory_shares(devices), strict=True))
        ]
    )
    with reservation:
        for process in supervisor.processes:
            process.start()
        return supervisor.run()


class _Supervisor:
    """This process while the replicas serve: passes stop signals on, reports replicas that stop, gives the
    exit status: 0 when every replica exited 0 (each drained after a stop signal), else 1."""

    def __init__(self, processes: list[multiprocessing.process.BaseProcess]) -> None:
        self.processes = processes
        self.signals = 0
        self.forced = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):  # before the replicas start: none is left behind
            signal.signal(signum, self._on_signal)

    def run(self) -> int:
        reported: set[int] = set()
        while not self.forced.wait(WATCH_PERIOD_S):
            for index, process in enumerate(self.processes):
                if process.exitcode not in (None, EXIT_STOPPED) and index not in reported:
                    reported.add(index)
                    print(f"audiomask serve: replica {index} stopped (exit {process.exitcode})", file=sys.stderr)
            if all(process.exitcode is not None for process in self.processes):
                break
        for process in self.processes:
            process.join()
        return EXIT_STOPPED if all(p.exitcode == EXIT_STOPPED for p in self.processes) else EXIT_REPLICAS_FAILED

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        for process in self.processes:  # the first drains each replica, a second stops it at once
            if process.exitcode is None and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        if self.signals > 1:
            self.forced.set()


def stop_with_parent(parent: int) -> None:
    """Have this process sent SIGTERM (a drain) once process ``parent``, which started it, has exited, so that a
    server process is not left holding the address (Linux's ``PR_SET_PDEATHSIG``; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it exited before the request
        os.kill(os.getpid(), signal.SIGTERM)


def _replica_main(settings: ServeSettings, memory_share: float, supervisor: int) -> None:
    """A replica: the whole server of ``settings`` on a socket of its own at their address (spawned process),
    taking at most ``memory_share`` of its CUDA device's memory (:func:`memory_shares`).

    It binds first and listens once its model is loaded; until its first step has run it refuses connections
    with HTTP 503 (``loading``), as a single server does, while the replicas that are ready serve."""
    os.setpgrp()  # Ctrl-C at a terminal reaches the supervisor alone, which passes one SIGTERM on
    stop_with_parent(supervisor)
    if memory_share < 1:
        import torch

        torch.cuda.set_per_process_memory_fraction(memory_share, settings.device)
    try:
        status = serve(settings, reuse_port=True)
    except ValueError as error:
        print(f"audiomask serve: replica {settings.replica}: error: {error}", file=sys.stderr, flush=True)
        status = EXIT_REPLICAS_FAILED
    sys.exit(status)
