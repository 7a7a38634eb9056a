"""``audiomask serve``: a streaming ASR server that sherpa-onnx and WeNet WebSocket clients talk to unchanged.

Every connection is served by one shared
:class:`~audiomask.asr.recognizer.StreamingRecognizer`, so all connected
streams share each encoder step (with ``--replicas N``, each of N server
processes has its own recognizer, and its connections share its steps).

- :mod:`~audiomask.serve.settings`: :class:`ServeSettings`, the options (no dependencies beyond numpy);
- :mod:`~audiomask.serve.app`: :func:`create_app`, the FastAPI app (routes ``/``, ``/wenet``,
  ``/health``, the page at ``GET /``), which uvicorn or a Ray Serve ingress runs;
- :mod:`~audiomask.serve.engine`: the shared recognizer, its ticker and feeders, health, drain;
- :mod:`~audiomask.serve.feeds`: each connection's samples on their way to its stream (no thread hop per message);
- :mod:`~audiomask.serve.session`: one connection, whatever its protocol;
- :mod:`~audiomask.serve.sherpa` (float32 samples) and :mod:`~audiomask.serve.wenet` (int16 PCM): the protocols;
- :mod:`~audiomask.serve.server`: uvicorn with a graceful stop (SIGTERM finishes the streams in flight);
- :mod:`~audiomask.serve.launch`: one recognizer's server, or ``--replicas N`` of them on one address;
- :mod:`~audiomask.serve.client`: a client of both protocols (tests, benchmarks).

The app, server and client need the ``serve`` extra (``pip install -e ".[serve]"``: fastapi,
uvicorn, websockets, silero-vad, pybase64); ``create_app`` is imported on first use, so the CLI loads
without it.
"""

from __future__ import annotations

from typing import Any

from audiomask.serve.settings import ServeSettings

__all__ = ["ServeSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from audiomask.serve.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
