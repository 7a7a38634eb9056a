"""Driving :class:`~audiomask.llm.streaming.LLMStreams` in the LLM tests (imported as ``tests.llm.streams``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from audiomask.llm.streaming import LLMStreams


def stream_tokens(
    streams: LLMStreams, signals: Mapping[str, np.ndarray], after_update: Callable[[], None] | None = None
) -> dict[str, list[tuple[int, ...]]]:
    """Open a stream per signal, feed it whole, update while chunks are due: each stream's partials' tokens, in
    order (``after_update`` runs after every update)."""
    seen: dict[str, list[tuple[int, ...]]] = {name: [] for name in signals}
    for name, signal in signals.items():
        streams.open(name)
        streams.feed(name, signal)
    while streams.due():
        for partial in streams.update():
            seen[partial.stream].append(partial.tokens)
        if after_update is not None:
            after_update()
    return seen
