"""Streams of one recognizer fed from several threads at once give the texts of each stream run alone.

Each thread opens its own stream, accepts its audio in random pieces with
random pauses, reads partials, and finishes with ``finish(timeout=None)``
(waiting for the streams other threads still feed). More streams than
encoder slots, so streams also wait for a slot that another thread frees.
A deadlock fails the test (threads joined with a bound) instead of hanging it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from audiomask.asr.recognizer import StreamingRecognizer

CHUNK_MS, LEFT_CHUNKS = 160, 1
THREADS = 6
SLOTS = 3  # fewer than the threads: admissions wait for slots freed by other threads
JOIN_S = 120  # seconds: far beyond the few seconds the run takes; a thread still alive then is deadlocked


def feed(stream, samples: np.ndarray, seed: int, partials: list[str]) -> str:
    """Accept ``samples`` in random pieces with random pauses, reading partials; the final text."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, len(samples), 12))
    for piece in np.split(samples, cuts):
        stream.accept(piece)
        if rng.random() < 0.5:
            partials.append(stream.partial())
        time.sleep(float(rng.choice([0.0, 0.0, 0.0005, 0.002])))
    return stream.finish(timeout=None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_threads_feeding_their_own_streams_get_the_single_threaded_texts(model, noise, transcribe_alone, seed):
    rng = np.random.default_rng(seed)
    signals = [noise(100 * seed + i, int(n)) for i, n in enumerate(rng.integers(3000, 16000, THREADS))]
    texts: list[str | None] = [None] * THREADS
    partials: list[list[str]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)
    with StreamingRecognizer(model, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, max_streams=SLOTS) as recognizer:

        def worker(index: int) -> None:
            try:
                start.wait()
                stream = recognizer.open_stream(f"thread-{index}")
                texts[index] = feed(stream, signals[index], seed * THREADS + index, partials[index])
            except BaseException as error:  # noqa: BLE001 (reported by the main thread)
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_S)
        assert not any(thread.is_alive() for thread in threads), "deadlock: a thread never finished"
        assert not errors, errors
        assert len(recognizer.stats.cycles) > 0
    expected = [transcribe_alone(model, samples, CHUNK_MS, LEFT_CHUNKS) for samples in signals]
    assert texts == expected
    for text, seen in zip(texts, partials):
        assert all(text.startswith(partial) for partial in seen)  # partials only grow, whatever the interleaving
