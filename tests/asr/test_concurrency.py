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
from pathlib import Path

import numpy as np
import pytest

from audiomask.asr.checkpoint import load_model
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.audio import load

CHUNK_MS, LEFT_CHUNKS = 160, 1
THREADS = 6
SLOTS = 3  # fewer than the threads: admissions wait for slots freed by other threads
JOIN_S = 120  # seconds: far beyond the few seconds the run takes; a thread still alive then is deadlocked
SAMPLES = Path(__file__).resolve().parents[2] / "samples"
# The shipped model's text of two sample files (README's quick start).
SAMPLE_TEXTS = {
    "hello_world.wav": "hello world this is a streaming speech test",
    "numbers.wav": "seven apples and three oranges cost twelve dollars",
}
PIECES = 10  # pieces each thread accepts its file in


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


def test_two_threads_stream_through_a_default_recognizer_each_to_its_text():
    """A recognizer of default options serves streams fed from two threads at once: the first stream takes a
    slot, the second one too while the first is still fed, finishes first without waiting for it, and each
    step of a stream computes its own row only (a default recognizer's stream costs what one alone costs)."""
    names = sorted(SAMPLE_TEXTS)
    audio = {name: load(SAMPLES / name)[0] for name in names}
    texts: dict[str, str] = {}
    errors: list[BaseException] = []
    rows: list[int] = []
    fed = threading.Barrier(len(names))  # after each piece: the two streams are fed side by side
    first_done = threading.Event()
    with StreamingRecognizer(load_model()) as recognizer:
        recognizer.model.head.register_forward_hook(lambda module, args, output: rows.append(len(args[0])))

        def worker(index: int, name: str) -> None:
            try:
                stream = recognizer.open_stream(name)
                if index == 0:  # its first block, before the other's: it holds a slot from now on
                    stream.accept(audio[name][: recognizer.first_block_samples])
                fed.wait(JOIN_S)
                rest = audio[name][recognizer.first_block_samples if index == 0 else 0 :]
                for piece in np.array_split(rest, PIECES):
                    stream.accept(piece)
                    fed.wait(JOIN_S)
                if index == 0:  # the stream that took a slot first finishes last
                    first_done.wait(JOIN_S)
                texts[name] = stream.finish()
            except BaseException as error:  # noqa: BLE001 (reported by the main thread)
                errors.append(error)
                fed.abort()
            finally:
                if index == 1:
                    first_done.set()

        threads = [threading.Thread(target=worker, args=(i, name), daemon=True) for i, name in enumerate(names)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_S)
        assert not any(thread.is_alive() for thread in threads), "deadlock: a thread never finished"
    assert not errors, errors
    assert texts == SAMPLE_TEXTS
    assert rows and max(rows) == 1
