"""The server's LLM recogniser (:class:`LLMServingRecognizer`) without the server: what the engine reads of a stream."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from audiomask.llm import checkpoint, streaming
from audiomask.llm.serving import LLMServingRecognizer
from audiomask.llm.streaming import LLMStreams, StreamPolicy

pytest.importorskip("transformers")

CHUNK_SAMPLES = 8000  # 0.5 s chunks
WAIT_S = 60.0  # the most a test waits for the recognizer's thread (a CPU update of the tiny model: ~10 ms)


@pytest.fixture(scope="module")
def qwen3_asr(tiny_qwen3_asr_dir: Path):
    return checkpoint.load(tiny_qwen3_asr_dir)


def wait_for(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Until ``condition()`` holds (the recognizer's thread works on its own); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the recognizer's thread did not get there in time"
        time.sleep(0.005)


def test_token_count_moves_every_chunk_whether_or_not_the_text_changed_then_with_the_final(
    qwen3_asr, speech: Callable
) -> None:
    """The engine sends a result each time ``token_count`` moves: a client hears from every update, so a partial's
    latency can be timed from its chunk; the final is the model's offline answer."""
    signal = speech(3.0, 4)
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=1, unfixed_tokens=1)
    with LLMServingRecognizer(qwen3_asr, max_streams=2, policy=policy, max_wait_ms=0) as recognizer:
        stream = recognizer.open_stream("caller")
        texts = []
        for chunk, start in enumerate(range(0, len(signal), CHUNK_SAMPLES), 1):
            stream.accept(signal[start : start + CHUNK_SAMPLES])
            wait_for(lambda chunk=chunk: stream.token_count == chunk)
            texts.append(stream.partial())
        assert len(set(texts)) < len(texts), "one answer token rolled back each update: some texts repeat"
        final = stream.finish(timeout=WAIT_S)
        assert stream.done and stream.token_count == len(texts) + 1
        cycles = recognizer.stats.cycles  # an update each chunk: its front end, the rest, the thread's CPU time
        assert len(cycles) == len(texts) and all(cycle.streams == 1 for cycle in cycles)
        assert all(cycle.cpu_s > 0 and cycle.encode_s > 0 and cycle.host_cpu_s > 0 for cycle in cycles)
        assert recognizer.stats.audio_s == pytest.approx(len(texts) * policy.chunk_s)
    assert final == qwen3_asr.transcribe([signal])[0].text


def test_on_results_is_called_once_each_update_and_final_is_handed_over(qwen3_asr, speech: Callable) -> None:
    """The server's ticker wakes on :attr:`LLMServingRecognizer.on_results`: it is called on the recognizer's
    thread after the texts it announces are readable, once per update (two streams due together: one call), and
    for finals as they are done; never without news."""
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=1)
    seen: list[tuple[int, int]] = []
    with LLMServingRecognizer(qwen3_asr, max_streams=2, policy=policy, max_wait_ms=10_000) as recognizer:
        streams = [recognizer.open_stream("a"), recognizer.open_stream("b")]
        recognizer.on_results = lambda: seen.append(tuple(stream.token_count for stream in streams))
        recognizer.accept_many([(stream, speech(0.5, seed)) for seed, stream in enumerate(streams)])
        wait_for(lambda: len(seen) == 1)
        recognizer.accept_many([], finished=streams)
        wait_for(lambda: all(stream.done for stream in streams) and seen[-1] == (2, 2))
    assert seen[0] == (1, 1) and len(seen) <= 3  # the finals in one call, or one each
    assert all(sum(later) > sum(earlier) for earlier, later in zip(seen, seen[1:]))


def test_the_callers_never_run_an_update_and_an_error_stops_the_recogniser_for_every_caller(
    qwen3_asr, speech: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Updates run on the recognizer's own thread (a feeder that queues samples goes on at once); an error there
    stops the recognizer: every later call raises it."""
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=2)
    threads, release, fail = set(), threading.Event(), threading.Event()
    original = LLMStreams.update

    def update(streams: LLMStreams, names: list[str] | None = None) -> list:
        threads.add(threading.current_thread().name)
        release.wait(WAIT_S)
        if fail.is_set():
            raise MemoryError("the device is full")
        return original(streams, names)

    def stopped() -> bool:
        try:
            recognizer.poll()
        except RuntimeError:
            return True
        return False

    monkeypatch.setattr(LLMStreams, "update", update)
    with LLMServingRecognizer(qwen3_asr, max_streams=2, policy=policy, max_wait_ms=0) as recognizer:
        stream = recognizer.open_stream("caller")
        began = time.monotonic()
        stream.accept(speech(1.0, 5))  # two chunks due: their update waits for release ...
        assert time.monotonic() - began < 1.0, "accept waited for an update"
        wait_for(lambda: threads)
        assert threads == {"audiomask-llm-updates"} and stream.token_count == 0  # ... on the recognizer's thread
        release.set()
        wait_for(lambda: stream.token_count == 2)
        fail.set()
        stream.accept(speech(0.5, 6))
        wait_for(stopped)
        for call in (lambda: stream.finish(timeout=WAIT_S), lambda: stream.accept(speech(0.5, 7))):
            with pytest.raises(RuntimeError, match="stopped after an error: MemoryError"):
                call()


def test_close_stops_the_thread_and_later_calls_raise(qwen3_asr) -> None:
    recognizer = LLMServingRecognizer(qwen3_asr, max_streams=1, policy=StreamPolicy(chunk_s=0.5))
    recognizer.close()
    recognizer.close()  # idempotent
    assert not recognizer._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        recognizer.open_stream()


def test_a_recogniser_dropped_unclosed_is_freed_and_its_thread_ends(qwen3_asr, speech: Callable) -> None:
    recognizer = LLMServingRecognizer(qwen3_asr, max_streams=1, policy=StreamPolicy(chunk_s=0.5), max_wait_ms=0)
    stream = recognizer.open_stream("caller")
    stream.accept(speech(0.5, 8))
    wait_for(lambda stream=stream: stream.token_count == 1)  # the thread has run, and waits for more
    thread, gone = recognizer._thread, weakref.ref(recognizer)
    del recognizer, stream

    def freed() -> bool:  # the thread holds it only while a pass runs, which may still be finishing
        gc.collect()
        return gone() is None

    wait_for(freed)
    assert gone() is None, "the thread kept the recogniser (and its cache) alive"
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_streams_that_end_cancel_and_join_at_any_time_get_the_offline_finals(qwen3_asr, speech: Callable) -> None:
    """Streams fed from two threads, ending, cancelled and joining while others talk (more streams than slots):
    every ended one gets its offline answer, the cancelled ones nothing, and every slot comes back."""
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=3, final_tokens=24)
    signals = {f"s{index}": speech(0.7 + 0.45 * index, 20 + index) for index in range(6)}
    offline = {name: qwen3_asr.transcribe([signal], max_new_tokens=24)[0].text for name, signal in signals.items()}
    finals: dict[str, str] = {}
    cancelled = {"s2", "s5"}
    with LLMServingRecognizer(qwen3_asr, max_streams=2, policy=policy, max_wait_ms=5) as recognizer:

        def client(names: list[str]) -> None:
            for name in names:
                stream = recognizer.open_stream(name)
                signal = signals[name]
                for start in range(0, len(signal), 3200):  # 0.2 s messages, as fast as they go
                    stream.accept(signal[start : start + 3200])
                    if name in cancelled and start >= 6400:
                        stream.cancel()
                        break
                else:
                    finals[name] = stream.finish(timeout=WAIT_S)

        groups = (["s0", "s3"], ["s1", "s4"], ["s2", "s5"])  # three talking at once over two slots
        threads = [threading.Thread(target=client, args=(names,)) for names in groups]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        assert not any(thread.is_alive() for thread in threads)
        assert finals == {name: offline[name] for name in signals if name not in cancelled}
        wait_for(lambda: recognizer._streams.ending == 0 and len(recognizer._streams._free) == 2)
        assert recognizer._thread.is_alive() and recognizer._error is None


def test_a_burst_of_ends_starts_its_finals_a_group_between_updates(
    qwen3_asr, speech: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More audio ends at once than :data:`FINAL_AUDIO_S_PER_RUN` (here 4.5 chunks): the final passes start in
    groups of at most that much audio (one stream at least), a group with each of another stream's updates, not
    all with the next one; each gets its offline answer and no partial (its whole chunk still buffered goes to
    its final)."""
    calls: list[tuple[str, int]] = []
    update, final_inputs = LLMStreams.update, LLMStreams._final_inputs

    def spy_update(streams: LLMStreams, names: list[str]) -> object:
        calls.append(("update", len(names)))
        return update(streams, names)

    def spy_final_inputs(streams: LLMStreams, signals: list, slots: list) -> object:
        calls.append(("finals", len(signals)))
        return final_inputs(streams, signals, slots)

    monkeypatch.setattr(LLMStreams, "update", spy_update)
    monkeypatch.setattr(LLMStreams, "_final_inputs", spy_final_inputs)
    monkeypatch.setattr(streaming, "FINAL_AUDIO_S_PER_RUN", 4.5 * CHUNK_SAMPLES / 16000)
    chunks = [1.5, 1.5, 1.5, 1.5, 6.0, 1.0]  # groups: three of 1.5 chunks, one, the longer one alone, the last
    signals = [speech(length * CHUNK_SAMPLES / 16000, seed) for seed, length in enumerate(chunks)]
    count = len(signals)
    talk = speech(5 * CHUNK_SAMPLES / 16000, count)
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=2)
    with LLMServingRecognizer(qwen3_asr, max_streams=count + 1, policy=policy, max_wait_ms=0) as recognizer:
        talker = recognizer.open_stream("talker")
        ending = [recognizer.open_stream(f"ends-{index}") for index in range(count)]
        recognizer.accept_many([(talker, talk), *zip(ending, signals)], finished=ending)
        wait_for(lambda: all(stream.done for stream in ending) and talker.token_count == 5)
    assert [stream.partial() for stream in ending] == [qwen3_asr.transcribe([signal])[0].text for signal in signals]
    assert [stream.token_count for stream in ending] == [1] * count
    groups = [("finals", 3), ("finals", 1), ("finals", 1), ("finals", 1)]
    assert calls[:9] == [("update", 1), *(item for group in groups for item in (("update", 1), group))]


def test_an_ended_stream_frees_its_slot_for_the_next_before_its_final_is_in(qwen3_asr, speech: Callable) -> None:
    """One slot: a stream that ended hands it back at once (its final decodes in a spare slot), so the next
    stream (a connection's next segment) opens and streams meanwhile; its final is still the offline answer,
    and the next stream's partials are its own alone. Without spare slots the slot stays held until the final."""
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=2, final_tokens=24)
    first, second = speech(3 * CHUNK_SAMPLES / 16000, 40), speech(2 * CHUNK_SAMPLES / 16000, 41)

    def alone(signal: np.ndarray) -> list[str]:
        streams = LLMStreams(qwen3_asr, slots=1, policy=policy)
        streams.open("alone")
        streams.feed("alone", signal)
        texts = [partial.text for partial in streams.update()] + [partial.text for partial in streams.update()]
        streams.close()
        return texts

    streams = LLMStreams(qwen3_asr, slots=1, policy=policy, pass_slots=1)
    streams.open("first")
    streams.feed("first", first)
    streams.update()
    streams.end(["first"])
    assert streams.free == 1 and streams.ending == 1
    streams.open("second")
    streams.feed("second", second)
    partials = streams.update() + streams.update()
    while streams.ending:
        partials += streams.advance(4)
    streams.close()
    finals = [partial for partial in partials if partial.final]
    assert [partial.stream for partial in finals] == ["first"]
    assert finals[0].text == qwen3_asr.transcribe([first], max_new_tokens=policy.final_tokens)[0].text
    assert [partial.text for partial in partials if not partial.final] == alone(second)
    assert streams._spare == [1]  # the final's spare slot came back; "second" holds the stream slot

    held = LLMStreams(qwen3_asr, slots=1, policy=policy, pass_slots=0)
    held.open("first")
    held.feed("first", first)
    held.end(["first"])
    assert held.free == 0
    while held.ending:
        held.advance(4)
    assert held.free == 1
    held.close()


def test_a_recogniser_of_one_slot_serves_a_connections_segments_one_after_another(qwen3_asr, speech: Callable) -> None:
    """One slot, the server's way: a segment ends and the next opens at once (as at an endpoint); the next one
    takes the slot the first handed back and streams, and each gets its own offline final."""
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=2, final_tokens=24)
    first, second = speech(2.5 * CHUNK_SAMPLES / 16000, 42), speech(2 * CHUNK_SAMPLES / 16000, 43)
    with LLMServingRecognizer(qwen3_asr, max_streams=1, policy=policy, max_wait_ms=0) as recognizer:
        assert recognizer.pass_slots >= 1
        segments = [recognizer.open_stream("segment-0")]
        recognizer.accept_many([(segments[0], first)], finished=segments)
        segments.append(recognizer.open_stream("segment-1"))
        recognizer.accept_many([(segments[1], second)], finished=segments[1:])
        wait_for(lambda: all(segment.done for segment in segments))
    offline = [qwen3_asr.transcribe([signal], max_new_tokens=policy.final_tokens)[0].text for signal in (first, second)]
    assert [segment.partial() for segment in segments] == offline


def test_finals_short_of_spare_slots_take_steps_of_their_own_between_updates(
    qwen3_asr, speech: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One spare slot and three streams ending at once while another talks on, its chunks always due: after an
    update that leaves finals waiting for the slot, the one in flight takes steps of its own (an advance) before
    the next update, rather than only the two an update's answer takes; every final is still the offline answer
    and the talker's partials are those it has alone."""
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=2, final_tokens=24)
    signals = [speech(1.5 * CHUNK_SAMPLES / 16000, seed) for seed in range(3)]
    talk = speech(8 * CHUNK_SAMPLES / 16000, 3)
    alone = LLMStreams(qwen3_asr, slots=1, policy=policy)
    alone.open("talker")
    alone.feed("talker", talk)
    talked_alone = [alone.update()[0].text for _ in range(8)][-1]
    calls: list[str] = []
    update, advance = LLMStreams.update, LLMStreams.advance

    def spy_update(streams: LLMStreams, names: list[str]) -> object:
        calls.append("update")
        return update(streams, names)

    def spy_advance(streams: LLMStreams, steps: int) -> object:
        calls.append("advance" if streams.short_of_slots else "advance (slots free)")
        return advance(streams, steps)

    monkeypatch.setattr(LLMStreams, "update", spy_update)
    monkeypatch.setattr(LLMStreams, "advance", spy_advance)
    with LLMServingRecognizer(qwen3_asr, max_streams=4, policy=policy, max_wait_ms=0, pass_slots=1) as recognizer:
        talker = recognizer.open_stream("talker")
        ending = [recognizer.open_stream(f"ends-{index}") for index in range(3)]
        recognizer.accept_many([(talker, talk), *zip(ending, signals)], finished=ending)
        wait_for(lambda: all(stream.done for stream in ending) and talker.token_count == 8)
        talked = talker.partial()
    offline = qwen3_asr.transcribe(signals, max_new_tokens=policy.final_tokens)
    assert [stream.partial() for stream in ending] == [answer.text for answer in offline]
    assert talked == talked_alone
    talking = calls[: len(calls) - calls[::-1].index("update")]  # up to the talker's last update
    assert "advance" in talking and calls[0] == "update"
    assert all(call != "advance" or before == "update" for before, call in zip(talking, talking[1:]))
