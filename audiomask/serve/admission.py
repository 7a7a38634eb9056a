"""Who may connect, and how the engine reaches a connection: states, refusals, the listener. No torch.

:class:`~audiomask.serve.engine.Engine` (the recognizer's process) and
:class:`~audiomask.serve.remote.RemoteEngine` (a WebSocket worker, which
loads no model) admit and refuse handshakes with the same rules.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from audiomask.serve.segments import Segment
from audiomask.serve.settings import ServeSettings

__all__ = [
    "RETRY_AFTER_BUSY_S",
    "RETRY_AFTER_STARTING_S",
    "Listener",
    "Refusal",
    "State",
    "busy_refusal",
    "state_refusal",
]

RETRY_AFTER_BUSY_S = 5  # Retry-After (seconds) of a handshake refused because every connection is taken
RETRY_AFTER_STARTING_S = 1  # ... because the model is still loading, or the server is stopping


class State(enum.Enum):
    """Where the engine is: ``/health`` answers 200 only when ``READY``."""

    LOADING = "loading"  # building the recognizer, or running its first step
    READY = "ready"
    FAILED = "failed"  # the recognizer could not be built, its first step failed, or it stopped after an error
    DRAINING = "draining"  # shutting down: new connections are refused, those in flight get their final results


class Listener(Protocol):
    """A connection as the engine sees it: how to reach it (every method is called on the event loop)."""

    def results(self, segments: list[Segment]) -> None:
        """What changed in the stream's segments, in order: those that ended, then the current one's text."""

    def failed(self, error: BaseException) -> None:
        """The stream cannot go on: the recognizer refused its samples or stopped (``error`` says why)."""

    def stop(self) -> None:
        """Finish now: the server is stopping."""

    def endpoint_due(self, sample: int | None) -> None:
        """The sample of the connection's audio by which its open segment's endpoint may be known (``None``:
        none pending): a WebSocket worker hands its audio over as soon as it reaches it, not a block later."""


@dataclass(frozen=True)
class Refusal:
    """Why a WebSocket handshake is refused: HTTP ``status``, a one-line ``message`` and ``Retry-After`` seconds."""

    status: int
    message: str
    retry_after_s: int | None = None


def state_refusal(state: State, error: str | None) -> Refusal | None:
    """Why a handshake is refused while the engine is in ``state`` (``error``: why it FAILED); ``None`` when READY."""
    if state is State.LOADING:
        return Refusal(503, "the model is loading: retry shortly", RETRY_AFTER_STARTING_S)
    if state is State.DRAINING:
        return Refusal(503, "the server is shutting down: retry on another replica", RETRY_AFTER_STARTING_S)
    if state is State.FAILED:
        return Refusal(503, f"the server cannot recognize speech: {error}")
    return None


def busy_refusal(connections: int, settings: ServeSettings) -> Refusal | None:
    """HTTP 503 with ``Retry-After`` when ``connections`` already fill ``settings.max_connections``."""
    limit = settings.max_connections
    if connections >= limit:
        return Refusal(503, f"server busy: all {limit} connections (--max-connections) are in use", RETRY_AFTER_BUSY_S)
    return None
