"""``audiomask serve --ray``: the server's app as a Ray Serve deployment, one recognizer per replica.

Each replica runs :func:`~audiomask.serve.app.create_app` as its FastAPI
ingress, with its own :class:`~audiomask.asr.recognizer.StreamingRecognizer`
(so the streams of a replica share its encoder steps). Ray Serve's proxy hands
each WebSocket connection to one replica and relays its messages both ways
until it closes: a stream never moves between replicas. The routes, protocols
and limits are those of ``audiomask serve`` without ``--ray``.

- Replicas: ``replicas`` of them, ``gpus_per_replica`` GPUs and
  :data:`CPUS_PER_REPLICA` CPUs each (Ray's logical resources: with
  ``gpus_per_replica=1`` each replica gets a GPU of its own, ``CUDA_VISIBLE_DEVICES``
  set by Ray, and ``--device auto`` picks it).
- Routing: a replica takes at most ``max_connections + HTTP_HEADROOM``
  requests at once (``max_ongoing_requests``): its recognizer's streams, and a
  few short HTTP requests (``/health``, the page) beside them; Ray sends new
  connections to replicas with room.
- Readiness and health: a replica takes traffic once its recognizer is built
  and has run a first step (its ASGI startup waits for it; a recognizer that
  cannot start fails the replica, and Ray reports it). Ray's controller calls
  :meth:`check_health` (the app's ``/health``), the proxy answers ``/-/healthz``.
- Backpressure: Ray's proxy reads each client's messages as they come and
  queues them for the replica, so a client that sends faster than real time is
  buffered there instead of being slowed by TCP as under ``audiomask serve``;
  live sources (microphones, calls) send at real time and are unaffected. The
  proxy's own WebSocket message limit (uvicorn's, 16 MiB) stands before the
  app's ``--max-message-bytes``.
- Which replica: every handshake and HTTP response carries the header
  :data:`REPLICA_HEADER` naming the replica that served it (the messages of
  the protocols are unchanged).
- Shutdown: SIGTERM or SIGINT tells every replica to drain (new connections
  are refused, the streams in flight are finished: each client gets its final
  result), then deletes the deployment, and :func:`run` returns 0; a second
  signal exits at once. The same whether the signal comes to this process
  alone or to its whole process group (``kill -TERM -PGID``, a shell's job
  control): Ray runs under a driver process in a process group of its own
  (the local cluster Ray starts, its GCS and raylet, join it), and this
  process passes each signal on to the driver. Ray's processes, in this
  process's group, had been stopped by the group's signal under the driver,
  which then waited 60 s for its GCS and exited 1.

Needs the ``ray`` extra (``pip install -e ".[ray]"``). :func:`run` (``audiomask
serve --ray``) calls ``ray.init``, which joins the cluster named by
``RAY_ADDRESS`` or started on this machine by ``ray start``, or else starts a
local one. :func:`build_app` is the same application for Ray's own ``serve run``
and ``serve deploy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from audiomask.checks import check_int
from audiomask.serve.admission import State
from audiomask.serve.engine import DRAIN_TIMEOUT_S
from audiomask.serve.settings import ServeSettings

__all__ = [
    "APP_NAME",
    "CPUS_PER_REPLICA",
    "HTTP_HEADROOM",
    "READY_POLL_S",
    "REPLICA_HEADER",
    "Replica",
    "ReplicaApp",
    "StopSignal",
    "application",
    "build_app",
    "run",
]

APP_NAME = "audiomask"  # the Ray Serve application (and deployment) name
CPUS_PER_REPLICA = 1.0  # Ray CPUs a replica reserves: its encoder thread (the front end's thread rides along)
HTTP_HEADROOM = 4  # requests a replica takes beyond its streams: health checks and page loads, which are short
REPLICA_HEADER = "x-audiomask-replica"  # response header naming the replica that served a request
READY_POLL_S = 0.1  # seconds between looks at a starting replica's recognizer
SHUTDOWN_MARGIN_S = 10.0  # Ray's stop budget beyond the drain's: the recognizer's own shutdown
ABNORMAL_CLOSURE = 1006  # WebSocket close code of a connection lost without a close frame (RFC 6455)
EXIT_STOPPED = 0  # stopped by SIGTERM or SIGINT
EXIT_USAGE = 2  # the CLI's status for a bad argument: one the driver finds (the cluster cannot hold the replicas)
SIGNAL_EXIT_BASE = 128  # a second signal exits at once with 128 + its number, the shell's convention
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SIGNAL_POLL_S = 1.0  # seconds between the main thread's looks for a stop signal
# Ray Serve's logging (replicas, proxy, controller): as uvicorn's under `audiomask serve`, no line per request.
WARNINGS_ONLY = {"log_level": "WARNING"}
STOP_CALL_TIMEOUT_S = 30.0  # bound on telling the replicas to drain (the cluster may be going down too)
# The settings `serve run ...:build_app` takes: not the address and TLS, which are Ray's proxies' (Serve's config).
BUILD_APP_SETTINGS = tuple(
    field.name
    for field in dataclasses.fields(ServeSettings)
    if field.name not in ("host", "port", "certfile", "keyfile")
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ReplicaApp:
    """The ASGI app of one replica: ``app`` (from ``create_app``), plus replica identity, readiness and drain.

    - every ``http.response.start`` and ``websocket.accept`` gets the header
      ``REPLICA_HEADER: replica`` (the replica's id);
    - a request whose messages Ray's proxy stopped relaying (its client went away) reads a disconnect;
    - lifespan startup completes once the engine (``app.state.engine``) has
      left ``loading``; it fails, with the engine's error, when the recognizer
      could not start;
    - once started, it waits for ``stop`` (an awaitable, such as the
      :class:`StopSignal`'s ``wait``) and then drains the engine: new connections
      are refused, those in flight get their final results; lifespan shutdown drains too.
    """

    def __init__(self, app: Any, replica: str, stop: Callable[[], Awaitable[object]] | None = None) -> None:
        self.app, self.engine = app, app.state.engine
        self._header = (REPLICA_HEADER.encode(), replica.encode())
        self._stop = stop
        self._drain_on_stop: asyncio.Task | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._draining(receive), self._when_ready(send))
            return

        async def send_naming_replica(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message["headers"] = [*message.get("headers", ()), self._header]
            await send(message)

        from ray.exceptions import RayError

        async def receive_or_disconnect() -> Message:
            try:
                return await receive()
            except RayError:  # the proxy dropped the request: its client is gone
                return {"type": f"{scope['type']}.disconnect", "code": ABNORMAL_CLOSURE}

        await self.app(scope, receive_or_disconnect, send_naming_replica)

    def _when_ready(self, send: Send) -> Send:
        async def send_when_ready(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                while self.engine.state is State.LOADING:
                    await asyncio.sleep(READY_POLL_S)
                if self.engine.state is State.FAILED:
                    message = {"type": "lifespan.startup.failed", "message": self.engine.error}
                elif self._stop is not None:
                    self._drain_on_stop = asyncio.ensure_future(self._drain_after(self._stop))
            await send(message)

        return send_when_ready

    async def _drain_after(self, stop: Callable[[], Awaitable[object]]) -> None:
        await stop()
        await self.engine.drain()

    def _draining(self, receive: Receive) -> Receive:
        async def receive_after_drain() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.engine.drain()
            return message

        return receive_after_drain


class StopSignal:
    """A flag every replica waits on: the driver sets it when told to stop, and the replicas drain.

    Run as a Ray actor (``ray.remote(StopSignal)``, no CPU): its ``wait`` returns once ``set`` was called.
    """

    def __init__(self) -> None:
        self._stop = asyncio.Event()

    async def set(self) -> None:
        """Tell every waiting replica to drain."""
        self._stop.set()

    async def wait(self) -> None:
        """Return once :meth:`set` was called."""
        await self._stop.wait()


class Replica:
    """One replica: a recognizer built from ``settings`` behind the app of :func:`~audiomask.serve.app.create_app`.

    The class of the Ray Serve deployment (:func:`application` wraps it: ``serve.ingress`` late-bound to
    the app this builds per replica, ``serve.deployment``).

    ``stop``: a :class:`StopSignal` actor; the replica drains when it is set (``None``: it drains only
    when Ray stops it, after the connections in flight ended by themselves).
    """

    def __init__(self, settings: ServeSettings, stop: Any = None) -> None:
        import torch
        from ray import serve

        from audiomask.serve.app import create_app
        from audiomask.serve.settings import SERVE_THREADS

        torch.set_num_threads(SERVE_THREADS)
        replica = serve.get_replica_context().replica_id.unique_id
        self._app = ReplicaApp(create_app(settings), replica, None if stop is None else stop.wait.remote)

    def __serve_build_asgi_app__(self) -> ReplicaApp:
        """The replica's ASGI app (Ray Serve calls this once the constructor has run)."""
        return self._app

    def check_health(self) -> None:
        """Raise unless the app's ``/health`` would answer 200 (or the replica is draining): Ray replaces it."""
        status, body = self._app.engine.health()
        if status != 200 and self._app.engine.state is not State.DRAINING:
            raise RuntimeError(f"audiomask replica unhealthy: {body}")


def application(settings: ServeSettings, replicas: int, gpus_per_replica: float = 0.0, stop: Any = None) -> Any:
    """The Ray Serve application of ``replicas`` :class:`Replica` s of ``settings`` (for ``serve.run``).

    Each replica reserves ``gpus_per_replica`` GPUs and :data:`CPUS_PER_REPLICA` CPUs, and takes
    ``settings.max_connections + HTTP_HEADROOM`` requests at once; ``stop``: a :class:`StopSignal`.
    """
    replicas = check_int("--replicas", replicas, minimum=1)
    gpus = gpus_per_replica
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not (gpus >= 0 and math.isfinite(gpus)):
        raise ValueError(f"--gpus-per-replica must be a number of GPUs >= 0, got {gpus_per_replica!r}")
    deployment = _deployment().options(
        num_replicas=replicas,
        max_ongoing_requests=settings.max_connections + HTTP_HEADROOM,
        ray_actor_options={"num_cpus": CPUS_PER_REPLICA, "num_gpus": gpus},
    )
    return deployment.bind(settings, stop)


def build_app(args: dict[str, str]) -> Any:
    """The application builder of Ray's own tools: ``serve run audiomask.serve.ray_serve:build_app KEY=VALUE ...``.

    Keys: ``replicas``, ``gpus_per_replica``, and the fields of :class:`~audiomask.serve.settings.ServeSettings`
    but the address and TLS ones (``serve run`` and ``serve deploy`` set those for Ray's proxies); values
    are converted to the fields' types. Without ``audiomask serve --ray``'s driver, replicas drain only
    when Ray stops them, once their connections ended.
    """
    from pydantic import TypeAdapter

    options = dict(args)
    replicas, gpus = options.pop("replicas", 1), options.pop("gpus_per_replica", 0.0)
    unknown = sorted(set(options) - set(BUILD_APP_SETTINGS))
    if unknown:
        raise ValueError(
            f"serve run arguments {unknown} are not audiomask settings; known: replicas, gpus_per_replica, "
            + ", ".join(BUILD_APP_SETTINGS)
        )
    settings = TypeAdapter(ServeSettings).validate_python(options)
    return application(settings, TypeAdapter(int).validate_python(replicas), TypeAdapter(float).validate_python(gpus))


@functools.cache
def _deployment() -> Any:
    """The Ray Serve deployment of :class:`Replica` (made once, when Ray is first needed)."""
    from ray import serve

    ingress = serve.ingress()(Replica)
    return serve.deployment(
        name=APP_NAME,
        graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S + SHUTDOWN_MARGIN_S,
        logging_config=WARNINGS_ONLY,
    )(ingress)


def _import_ray() -> tuple[Any, Any]:
    """``(ray, ray.serve)``; ``ValueError`` saying how to install them when they are missing."""
    try:
        import ray
        from ray import serve
    except ImportError as error:
        raise ValueError(f'--ray needs Ray Serve: pip install -e ".[ray]" ({error})') from None
    return ray, serve


def _check_resources(ray: Any, replicas: int, gpus_per_replica: float) -> None:
    """``ValueError`` when the cluster cannot hold the replicas (Ray would wait for them forever)."""
    available = ray.cluster_resources()
    for name, option, each in (("CPU", None, CPUS_PER_REPLICA), ("GPU", "--gpus-per-replica", gpus_per_replica)):
        needed, total = replicas * each, available.get(name, 0.0)
        if needed > total:
            per = f"{option} {each:g}" if option else f"{each:g} {name} each"
            raise ValueError(f"--replicas {replicas} with {per} needs {needed:g} {name}; the Ray cluster has {total:g}")


class _StopSignals:
    """While installed: the first SIGTERM or SIGINT is recorded (:meth:`wait` returns), a second exits at once."""

    def __init__(self) -> None:
        self._received = threading.Event()
        self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}

    def _handle(self, signum: int, frame: object) -> None:
        if self._received.is_set():
            print(f"audiomask serve: {signal.Signals(signum).name} again: stopping at once", file=sys.stderr)
            os._exit(SIGNAL_EXIT_BASE + signum)
        self._received.set()

    def wait(self) -> None:
        """Block until the first signal."""
        while not self._received.wait(SIGNAL_POLL_S):  # a bounded wait lets Python run the handler
            pass

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def run(settings: ServeSettings, replicas: int, gpus_per_replica: float = 0.0) -> int:
    """Deploy ``settings``' server on Ray Serve as ``replicas`` replicas; serve until SIGTERM or SIGINT; exit 0.

    Ray is driven from a process of a process group of its own (spawned), to which this one passes its stop
    signals; the exit status is the driver's (128 + N where signal N ended it).

    Args:
        settings: the server's options; ``host`` and ``port`` are where Ray's HTTP proxy listens
            (on every node of the cluster), ``certfile``/``keyfile`` its TLS.
        replicas: replicas, one recognizer (``max_connections`` streams) each.
        gpus_per_replica: GPUs each replica reserves (``0``: CPU replicas; fractions share a GPU).

    Raises:
        ValueError: ``replicas`` < 1, ``gpus_per_replica`` negative, ``settings.port`` 0, or Ray Serve not
            installed (more replicas than the cluster holds: the driver's ``audiomask: error:`` line, exit 2).
    """
    if settings.port == 0:
        raise ValueError("--port 0 with --ray: Ray Serve's proxies listen on one fixed port on every node; name it")
    _import_ray()
    application(settings, replicas, gpus_per_replica)  # checks the arguments before Ray starts
    driver = multiprocessing.get_context("spawn").Process(
        target=_driver_main, args=(settings, replicas, gpus_per_replica, os.getpid()), name="audiomask-serve-ray"
    )

    def pass_on(signum: int, frame: object) -> None:
        if driver.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(driver.pid, signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in STOP_SIGNALS}  # before the driver starts
    try:
        driver.start()
        driver.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    status = driver.exitcode
    assert status is not None
    return status if status >= 0 else SIGNAL_EXIT_BASE - status


def _driver_main(settings: ServeSettings, replicas: int, gpus_per_replica: float, parent: int) -> None:
    """The driver (spawned by process ``parent``): :func:`_drive` in a process group of its own; its status is the
    exit status. It drains when ``parent`` dies (SIGKILL), as when told to stop."""
    from audiomask.serve.launch import stop_with_parent

    os.setpgrp()  # before Ray starts its processes, which join this group: the group of `audiomask serve` gets none
    stop_with_parent(parent)
    try:
        status = _drive(settings, replicas, gpus_per_replica)
    except ValueError as error:
        print(f"audiomask: error: {error}", file=sys.stderr, flush=True)
        status = EXIT_USAGE
    sys.exit(status)


def _drive(settings: ServeSettings, replicas: int, gpus_per_replica: float) -> int:
    """Start Ray, deploy, serve until the first stop signal, drain, stop Ray: :func:`run`'s work; the exit status."""
    ray, serve = _import_ray()
    ray.init(include_dashboard=False, logging_level=logging.WARNING)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    signals = _StopSignals()  # after ray.init, which installs its own SIGTERM handler
    try:
        _check_resources(ray, replicas, gpus_per_replica)
        serve.start(
            http_options={
                "host": settings.host,
                "port": settings.port,
                "ssl_certfile": settings.certfile,
                "ssl_keyfile": settings.keyfile,
            },
            logging_config=WARNINGS_ONLY,
        )
        stop = ray.remote(num_cpus=0)(StopSignal).remote()
        serve.run(application(settings, replicas, gpus_per_replica, stop), name=APP_NAME, route_prefix="/")
        scheme = "wss" if settings.secure else "ws"
        address = f"{scheme}://{settings.host}:{settings.port}"
        print(
            f"audiomask serve: on Ray Serve, {replicas} replicas of up to {settings.max_connections} connections; "
            f"{address}/ (sherpa-onnx, float32 samples), {address}/wenet (WeNet, int16 PCM)",
            file=sys.stderr,
            flush=True,
        )
        signals.wait()
        # the replicas drain; Ray waits for their connections to end before it stops them
        ray.get(stop.set.remote(), timeout=STOP_CALL_TIMEOUT_S)
        serve.delete(APP_NAME)
        return EXIT_STOPPED
    finally:
        serve.shutdown()
        ray.shutdown()
        signals.restore()
