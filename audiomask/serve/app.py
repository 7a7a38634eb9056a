"""The ASGI app of ``audiomask serve``: FastAPI routes over one shared recognizer.

Routes:

- WebSocket ``/``: sherpa-onnx's online protocol (:mod:`audiomask.serve.sherpa`), float32 samples;
- WebSocket ``/wenet``: WeNet's protocol (:mod:`audiomask.serve.wenet`), int16 PCM;
- WebSocket ``/v1/realtime``: OpenAI's Realtime transcription protocol and vLLM's realtime dialect
  (:mod:`audiomask.serve.realtime`), base64 PCM16 in JSON events;
- ``GET /health``: 200 and ``{"status": "ready", "connections", "max_connections", "streams",
  "device", "chunk_ms", "max_wait_ms", "cycles", "recent_cycles"}`` (``cycles``: encoder steps run
  so far) once the model is loaded and a first chunk step has run; 503 with ``"status"``
  ``loading``, ``failed`` (and ``"error"``) or ``draining`` otherwise;
- ``GET /``: the browser page (``audiomask/serve/static/index.html``; 404 where it is missing).

The app is plain FastAPI, so the same object runs under uvicorn
(:func:`audiomask.serve.server.run`) or as a Ray Serve ingress. Its lifespan
starts the :class:`~audiomask.serve.engine.Engine` (the recognizer is built,
unless given, and warmed up on a thread: the server answers ``/health`` with
503 meanwhile) and stops it; ``app.state.engine`` is the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import TYPE_CHECKING

from fastapi import FastAPI, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, Response

from audiomask.serve.realtime import REALTIME_ROUTE, RealtimeProtocol, openai_hint
from audiomask.serve.remote import RemoteEngine
from audiomask.serve.session import serve_connection
from audiomask.serve.settings import ServeSettings
from audiomask.serve.sherpa import SherpaProtocol
from audiomask.serve.wenet import WeNetProtocol

if TYPE_CHECKING:  # the recognizer's modules load torch: a WebSocket worker imports this app without them
    from audiomask.asr.recognizer import StreamingRecognizer
    from audiomask.serve.engine import Engine

__all__ = ["PAGE", "REALTIME_ROUTE", "SHERPA_ROUTE", "WENET_ROUTE", "create_app"]

SHERPA_ROUTE = "/"
WENET_ROUTE = "/wenet"
PAGE = ("static", "index.html")  # the browser page, inside the package audiomask.serve


def _page() -> str | None:
    """The browser page's HTML, or ``None`` when the package holds none."""
    resource = files("audiomask.serve").joinpath(*PAGE)
    try:
        return resource.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None


def create_app(
    settings: ServeSettings, recognizer: StreamingRecognizer | None = None, *, engine: RemoteEngine | None = None
) -> FastAPI:
    """The server's app: the routes of the module docstring over one :class:`~audiomask.serve.engine.Engine`.

    Args:
        settings: the server's options (limits, token; the recognizer's when it is built here).
        recognizer: the recognizer to serve (the caller closes it); ``None``: built from
            ``settings`` when the app starts (:func:`~audiomask.serve.engine.build_recognizer`),
            one encoder slot per connection, and closed when it stops.
        engine: a WebSocket worker's :class:`~audiomask.serve.remote.RemoteEngine`, in place of an
            engine of this process (``recognizer`` is then ``None``).
    """
    if engine is not None and recognizer is not None:
        raise ValueError("create_app: give a recognizer or a remote engine, not both")
    backend: Engine | RemoteEngine
    if engine is None:
        from audiomask.serve.engine import Engine

        backend = Engine(settings, recognizer)
    else:
        backend = engine

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await backend.stop()

    app = FastAPI(title="audiomask serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = backend

    @app.websocket(SHERPA_ROUTE)
    async def sherpa(websocket: WebSocket) -> None:
        await serve_connection(websocket, backend, SherpaProtocol())

    @app.websocket(WENET_ROUTE)
    async def wenet(websocket: WebSocket) -> None:
        await serve_connection(websocket, backend, WeNetProtocol())

    @app.websocket(REALTIME_ROUTE)
    async def realtime(websocket: WebSocket) -> None:
        hint = openai_hint(websocket.query_params, websocket.headers)
        await serve_connection(websocket, backend, RealtimeProtocol(settings, openai_hint=hint))

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = backend.health()
        return JSONResponse(body, status)

    @app.get(SHERPA_ROUTE)
    async def page() -> Response:
        html = _page()
        if html is None:
            return Response("no browser page in this install (audiomask/serve/static/index.html)", 404)
        return HTMLResponse(html)

    return app
