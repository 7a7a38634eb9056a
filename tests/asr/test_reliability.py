"""The recognizer under ordinary but hostile use: no stream holds the others, long calls lock nobody out,
dropped handles free their streams, every size and time argument is bounded, and close() is final.

Threads are joined with a bound (a deadlock fails the test instead of hanging it); orderings are shown with
events, never with timings; the wait of a ready chunk for the others runs on a fake clock.
"""

from __future__ import annotations

import gc
import math
import threading

import pytest

from audiomask.asr.outputs import OutputError
from audiomask.asr.planner import DriverStream
from audiomask.asr.recognizer import StreamingRecognizer

CHUNK_MS, LEFT_CHUNKS = 160, 1
CHUNK_SAMPLES = CHUNK_MS * 16  # 16 kHz
SECOND = 16000
JOIN_S = 30  # seconds: far beyond what any step here takes; a thread still waiting then is locked out


@pytest.fixture(scope="module")
def alone(transcribe_alone):
    """The text of samples streamed alone with this module's chunking."""
    return lambda model, samples: transcribe_alone(model, samples, CHUNK_MS, LEFT_CHUNKS)


def recognizer_of(model, **options) -> StreamingRecognizer:
    return StreamingRecognizer(model, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, **options)


def started(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


# ---- no stream holds the others ----


def test_an_idle_stream_opened_first_holds_back_no_busy_one(model, noise, alone):
    speech = noise(1, 10 * SECOND)
    expected = alone(model, speech)
    with recognizer_of(model, max_streams=4) as recognizer:
        recognizer.open_stream("idle")
        busy = recognizer.open_stream("busy")
        busy.accept(speech)
        partial = busy.partial()
        assert partial and expected.startswith(partial)
        assert busy.finish() == expected


def test_a_fed_stream_gets_partials_while_another_in_the_batch_is_silent(model, noise, alone, recognizer_clock):
    clock = recognizer_clock
    speech = noise(1, 3 * SECOND)
    with recognizer_of(model, max_streams=2, lanes=1) as recognizer:  # one lane: the two share each step
        silent, talking = recognizer.open_stream("silent"), recognizer.open_stream("talking", outputs=True)
        silent.accept(noise(2, 2 * CHUNK_SAMPLES))  # in a slot, then it stops sending
        talking.accept(speech[: 2 * CHUNK_SAMPLES])
        delivered = len(talking.outputs())
        talking.accept(speech[2 * CHUNK_SAMPLES :])
        assert len(talking.outputs()) == delivered  # its chunks wait a while for the silent one ...
        clock.now += recognizer.max_wait_s
        assert recognizer.poll() > 0  # ... one chunk at most, then they run without it
        assert len(talking.outputs()) > delivered and recognizer.stats.partial > 0
        assert talking.finish() == alone(model, speech)
        silent.input_finished()
        assert silent.finish() == alone(model, noise(2, 2 * CHUNK_SAMPLES))


def test_max_wait_ms_sets_how_long_a_ready_chunk_waits_for_the_others(model, noise, alone, recognizer_clock):
    clock = recognizer_clock
    speech = noise(1, 3 * SECOND)
    with pytest.raises(ValueError, match=rf"max_wait_ms must be at most chunk_ms \({CHUNK_MS}\), got {CHUNK_MS + 1}"):
        recognizer_of(model, max_wait_ms=CHUNK_MS + 1)
    with pytest.raises(ValueError, match="max_wait_ms must be >= 0, got -1"):
        recognizer_of(model, max_wait_ms=-1)
    with recognizer_of(model, max_streams=2, max_wait_ms=40, lanes=1) as recognizer:
        assert recognizer.max_wait_s == 0.04
        silent, talking = recognizer.open_stream("silent"), recognizer.open_stream("talking", outputs=True)
        silent.accept(noise(2, 2 * CHUNK_SAMPLES))
        talking.accept(speech[: 2 * CHUNK_SAMPLES])
        delivered = len(talking.outputs())
        talking.accept(speech[2 * CHUNK_SAMPLES :])
        clock.now += 0.039
        assert recognizer.poll() == 0 and len(talking.outputs()) == delivered  # still waiting ...
        clock.now += 0.001
        assert recognizer.poll() > 0 and len(talking.outputs()) > delivered  # ... 40 ms, not a chunk
        assert talking.finish() == alone(model, speech)
    with recognizer_of(model, max_streams=2, max_wait_ms=0, lanes=1) as recognizer:
        silent, talking = recognizer.open_stream("silent"), recognizer.open_stream("talking", outputs=True)
        silent.accept(noise(2, 2 * CHUNK_SAMPLES))
        talking.accept(speech[: 2 * CHUNK_SAMPLES])
        delivered = len(talking.outputs())
        talking.accept(speech[2 * CHUNK_SAMPLES :])
        assert len(talking.outputs()) > delivered  # 0: a ready chunk runs at once
        assert talking.finish() == alone(model, speech)


def test_dropped_streams_are_ended_and_freed(model, noise, alone):
    """Handles dropped unfinished (never fed, fed less than a chunk, holding a slot) end their streams: later
    transcriptions work, and none of the dropped streams stays in memory."""
    speech = noise(1, SECOND)
    with recognizer_of(model, max_streams=4) as recognizer:
        for index in range(300):
            stream = recognizer.open_stream(f"dropped-{index}")
            if index % 3:
                stream.accept(noise(index, CHUNK_SAMPLES + 500 if index % 3 == 1 else 100))
            del stream
        gc.collect()
        assert recognizer.transcribe(speech) == alone(model, speech)
        gc.collect()
        left = [o for o in gc.get_objects() if type(o) is DriverStream and o.name.startswith("dropped-")]
        assert not left


def test_transcribe_while_another_thread_streams(model, noise, alone):
    live_audio, speech = noise(3, 2 * SECOND), noise(1, 3 * SECOND)
    with recognizer_of(model, max_streams=2) as recognizer:
        fed, resume, texts, errors = threading.Event(), threading.Event(), [], []

        def live() -> None:
            try:
                microphone = recognizer.open_stream("live-mic")
                microphone.accept(live_audio[: 3 * CHUNK_SAMPLES])
                fed.set()
                resume.wait(JOIN_S)
                microphone.accept(live_audio[3 * CHUNK_SAMPLES :])
                texts.append(microphone.finish(timeout=None))
            except BaseException as error:  # noqa: BLE001 (reported by the main thread)
                errors.append(error)
                fed.set()

        thread = started(live)
        assert fed.wait(JOIN_S) and not errors, errors
        assert recognizer.transcribe(speech) == alone(model, speech)
        resume.set()
        thread.join(JOIN_S)
        assert not thread.is_alive() and not errors, errors
    assert texts == [alone(model, live_audio)]


# ---- long calls lock nobody out ----


class GatedHead:
    """Wraps the CTC head's forward (it runs inside every encoder step): ``hold(call)`` says whether call
    number ``call`` waits for ``proceed``; ``entered`` is set when one does."""

    def __init__(self, forward, hold) -> None:
        self.forward, self.hold, self.calls = forward, hold, 0
        self.entered, self.proceed = threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.hold(self.calls):
            self.entered.set()
            self.proceed.wait(JOIN_S)
        return self.forward(*args, **kwargs)


def test_partial_accept_and_open_return_while_another_thread_accepts_a_long_array(model, noise, monkeypatch):
    with recognizer_of(model, max_streams=2) as recognizer:
        done = recognizer.open_stream("done")
        done.accept(noise(2, 3 * CHUNK_SAMPLES))
        text = done.finish()
        long = recognizer.open_stream("long")
        gate = GatedHead(model.head.forward, hold=lambda call: call == 1)
        monkeypatch.setattr(model.head, "forward", gate)
        accepting = started(long.accept, noise(1, 20 * SECOND))
        assert gate.entered.wait(JOIN_S)  # the long accept is inside an encoder step
        answers = []

        def calls() -> None:
            answers.append(done.partial())
            other = recognizer.open_stream("other")
            other.accept(noise(3, CHUNK_SAMPLES))
            answers.append(other.name)

        caller = started(calls)
        caller.join(JOIN_S)
        returned = not caller.is_alive()
        still_accepting = accepting.is_alive()
        gate.proceed.set()
        accepting.join(JOIN_S)
        assert returned and still_accepting, "a call waited for another thread's accept"
        assert answers == [text, "other"]


def test_finish_returns_while_another_thread_accepts_a_long_array(model, noise, alone, monkeypatch):
    """The finishing stream's chunks run in the steps of the thread accepting, which it does not wait out."""
    short = noise(2, 2 * CHUNK_SAMPLES)
    with recognizer_of(model, max_streams=2) as recognizer:
        long = recognizer.open_stream("long")
        finished, accepted, texts = threading.Event(), threading.Event(), []
        # The first step waits until the short stream is set up; the 60th (long after the short stream's
        # three) until it has finished: the accept cannot return before the finish.
        gate = GatedHead(model.head.forward, hold=lambda call: call == 1)
        monkeypatch.setattr(model.head, "forward", gate)

        def accept_long() -> None:
            long.accept(noise(1, 20 * SECOND))
            accepted.set()

        accepting = started(accept_long)
        assert gate.entered.wait(JOIN_S)
        stream = recognizer.open_stream("short")
        stream.accept(short)

        def finish() -> None:
            texts.append(stream.finish(timeout=None))
            texts.append(accepted.is_set())
            finished.set()

        finishing = started(finish)
        gate.hold = lambda call: call == 60 and not finished.wait(JOIN_S)
        gate.proceed.set()
        finishing.join(JOIN_S)
        accepting.join(JOIN_S)
        assert not finishing.is_alive() and not accepting.is_alive()
    assert texts == [alone(model, short), False]  # the accept was still running when the finish returned


def test_a_finishing_thread_does_not_carry_other_threads_steps_past_its_own(model, noise, alone, monkeypatch):
    """A thread that runs steps stops once its own stream is done: while another thread keeps queueing audio
    (which needs more steps), finish() runs its stream's steps and returns, leaving the rest to that thread."""
    short = noise(2, 2 * CHUNK_SAMPLES)
    with recognizer_of(model, max_streams=2) as recognizer:
        steps_by_thread: dict[int, int] = {}
        advance = recognizer._driver.advance

        def counted(*args, **kwargs):
            ran = advance(*args, **kwargs)
            steps_by_thread[threading.get_ident()] = steps_by_thread.get(threading.get_ident(), 0) + ran
            return ran

        monkeypatch.setattr(recognizer._driver, "advance", counted)
        stream = recognizer.open_stream("short")
        stream.accept(short)
        feeding = recognizer.open_stream("feeding")
        queued = threading.Event()

        def feed() -> None:  # 30 s of audio, a second at a time: each accept queues it, or runs its steps
            for second in range(30):
                feeding.accept(noise(1 + second, SECOND))
                queued.set()
            feeding.finish(timeout=None)

        feeder = started(feed)
        assert queued.wait(JOIN_S)
        text = stream.finish(timeout=None)
        finisher_steps = steps_by_thread.get(threading.get_ident(), 0)
        feeder.join(JOIN_S)
        assert not feeder.is_alive()
    assert text == alone(model, short)
    assert finisher_steps <= 4  # the short stream's own chunks (and its end), not the 30 s of the other one


# ---- arguments ----


@pytest.mark.parametrize("timeout", [math.nan, math.inf, 1e12, -1, "1", True, [1]])
def test_finish_and_transcribe_refuse_a_bad_timeout_naming_it(model, noise, timeout):
    with recognizer_of(model) as recognizer:
        stream = recognizer.open_stream("s")
        stream.accept(noise(1, 3000))
        message = r"^timeout must be None or a number of seconds in \[0.0, 9\d+\.0\], got "
        with pytest.raises(ValueError, match=message):
            stream.finish(timeout=timeout)
        with pytest.raises(ValueError, match=message):
            recognizer.transcribe(noise(1, 3000), timeout=timeout)
        assert stream.finish() == recognizer.transcribe(noise(1, 3000))  # refused whole: nothing changed


@pytest.mark.parametrize("idle_timeout_s", [True, 1e300, math.inf, math.nan, 0, -5, "30"])
def test_a_bad_idle_timeout_is_refused_naming_it(model, idle_timeout_s):
    with pytest.raises(ValueError, match=r"^idle_timeout_s must be None or a number of seconds in \(0.0, "):
        recognizer_of(model, idle_timeout_s=idle_timeout_s)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_streams": 10**9}, r"^max_streams=1000000000: the streams' state takes about .* at most \d+ streams fit"),
        ({"max_streams": 2**70}, r"^max_streams must be <= 9223372036854775807"),
        ({"max_streams": True}, r"^max_streams must be an integer, got True"),
        ({"left_chunks": 10**5}, r"^left_chunks=100000 with chunk_ms=160: .* 16000160 ms of audio, more than MAX_"),
        ({"chunk_ms": 80_000_000}, r"^chunk_ms must be <= 60000, got 80000000"),
    ],
    ids=["max-streams-beyond-memory", "max-streams-beyond-int64", "max-streams-bool", "left-chunks", "chunk-ms"],
)
def test_sizes_beyond_what_the_machine_holds_are_refused_before_allocating(model, options, message):
    arguments = {"chunk_ms": CHUNK_MS, "left_chunks": LEFT_CHUNKS, **options}
    with pytest.raises(ValueError, match=message):
        StreamingRecognizer(model, **arguments)


def test_close_is_final_and_idempotent(model, noise):
    recognizer = recognizer_of(model, max_streams=2)
    plain, listened = recognizer.open_stream("plain"), recognizer.open_stream("listened", outputs=True)
    plain.accept(noise(1, 3 * CHUNK_SAMPLES))
    listened.accept(noise(2, 3 * CHUNK_SAMPLES))
    text = plain.partial()
    recognizer.close()
    recognizer.close()
    calls = (
        lambda: plain.accept(noise(1, 100)),
        plain.input_finished,
        plain.finish,
        recognizer.open_stream,
        lambda: recognizer.transcribe(noise(1, 100)),
        recognizer.poll,
    )
    for call in calls:
        with pytest.raises(RuntimeError, match="this recognizer is closed: open a new one"):
            call()
    assert plain.partial() == text  # the text so far stays readable
    with pytest.raises(OutputError, match="closed"):
        list(listened.outputs())
