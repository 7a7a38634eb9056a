"""A connection's feed: due a block at a time, bounded, fed in order, ended when its connection ends."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from audiomask.errors import AudioError
from audiomask.serve.feeds import Inbox
from audiomask.serve.segments import HANDOVER_STEP_SAMPLES

FIRST_BLOCK, BLOCK, MAX_BUFFERED = 4, 2, 6
CYCLES = 0  # the recognizer's cycles so far, as the tests' passes see them
WAIT_S = 5.0  # bound on every wait for an event the test itself causes


def _inbox() -> tuple[Inbox, threading.Event]:
    wake = threading.Event()
    return Inbox(wake, FIRST_BLOCK, BLOCK, MAX_BUFFERED), wake


def _samples(*values: float) -> np.ndarray:
    return np.asarray(values, np.float32)


class _Stream:
    """What :meth:`Inbox.fed` reads of a stream."""

    finished = False
    done = False


class _Utterances:
    """What a feed and its inbox read of a connection's segments: the stream a pass opened, if any."""

    def __init__(self, vad_key: int | None = None) -> None:
        self.stream: _Stream | None = None
        self.segment_open = True
        self.vad_key = vad_key  # not None: cut by voice activity

    @property
    def done(self) -> bool:
        return self.stream is None or self.stream.done

    def unfinished(self) -> list[_Stream]:
        return [] if self.stream is None or self.stream.finished else [self.stream]


def _open(inbox: Inbox, name: str):
    return inbox.open(name, _Utterances())


def test_a_feed_is_due_when_its_samples_complete_the_next_block():
    async def run():
        inbox, wake = _inbox()
        feed = _open(inbox, "caller")
        await feed.put(_samples(1, 2, 3))
        assert inbox.take(CYCLES) == [] and not wake.is_set()
        await feed.put(_samples(4, 5))  # 5 samples: the first block (4) is complete
        assert wake.is_set()
        [(taken, samples)] = inbox.take(CYCLES)
        assert taken is feed and samples.tolist() == [1, 2, 3, 4, 5]
        inbox.fed([(feed, samples)])
        await feed.put(_samples(6))  # 6 fed: the second block ends at 6
        assert [samples.tolist() for _, samples in inbox.take(CYCLES)] == [[6]]

    asyncio.run(run())


def test_put_waits_over_the_bound_until_a_pass_has_fed_the_samples():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "fast sender")
        put = asyncio.create_task(feed.put(np.zeros(MAX_BUFFERED + 1, np.float32)))
        await asyncio.sleep(0.01)
        assert not put.done()
        taken = inbox.take(CYCLES)
        woken, orphans = inbox.fed(taken)
        assert woken == [feed] and orphans == []
        feed.wake()  # what the engine does on the event loop
        await asyncio.wait_for(put, WAIT_S)

    asyncio.run(run())


def test_a_feed_being_fed_is_not_taken_again_so_its_samples_stay_in_order():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "caller")
        await feed.put(_samples(*range(5)))
        first = inbox.take(CYCLES)
        await feed.put(_samples(5, 6, 7, 8))  # due again while the first pass still feeds it
        assert inbox.take(CYCLES) == []
        inbox.fed(first)
        assert [samples.tolist() for _, samples in inbox.take(CYCLES)] == [[5, 6, 7, 8]]

    asyncio.run(run())


def test_samples_put_during_a_pass_are_due_once_the_pass_counts_its_own():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "caller")
        await feed.put(_samples(*range(5)))
        first = inbox.take(CYCLES)
        await feed.put(_samples(5, 6))  # 2 samples short of the first block by the count so far ...
        inbox.fed(first)  # ... and past the second (ends at 6) with the pass's 5
        assert [samples.tolist() for _, samples in inbox.take(CYCLES)] == [[5, 6]]

    asyncio.run(run())


def test_end_feeds_what_is_short_of_a_block_and_waits_until_the_stream_is_done():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "caller")
        await feed.put(_samples(1, 2))
        end = asyncio.create_task(feed.end())
        await asyncio.sleep(0.01)
        [(taken, samples)] = inbox.take(CYCLES)
        assert taken is feed and feed.ending and samples.tolist() == [1, 2]
        feed.utterances.stream = _Stream()  # the pass opened it, fed it and ended it; its last chunk is not encoded yet
        assert inbox.fed([(taken, samples)]) == ([], [])
        assert inbox.fed([]) == ([], [])  # a later pass: the stream is still not done
        await asyncio.sleep(0.01)
        assert not end.done()
        feed.stream.done = True
        assert inbox.fed([]) == ([feed], [])  # the pass that finished it wakes the client, once
        assert inbox.fed([]) == ([], [])
        feed.wake()
        await asyncio.wait_for(end, WAIT_S)

    asyncio.run(run())


def test_an_end_asked_while_a_pass_feeds_the_stream_waits_for_the_next_pass_with_the_last_samples():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "caller")
        await feed.put(_samples(1, 2, 3, 4))
        [(_, first)] = inbox.take(CYCLES)  # a pass feeds the first block ...
        await feed.put(_samples(5))  # ... while the client sends its last samples and ends
        end = asyncio.create_task(feed.end())
        await asyncio.sleep(0.01)
        assert not feed.ending  # that pass took none of the last samples: it must not end the stream
        feed.utterances.stream = _Stream()
        assert inbox.fed([(feed, first)]) == ([], [])
        [(_, last)] = inbox.take(CYCLES)
        assert feed.ending and last.tolist() == [5]
        feed.stream.done = True
        assert inbox.fed([(feed, last)]) == ([feed], [])
        feed.wake()
        await asyncio.wait_for(end, WAIT_S)

    asyncio.run(run())


def test_a_wake_sent_before_the_client_ended_its_audio_does_not_release_the_end():
    """A pass wakes a full feed (a WebSocket worker's samples, offered without waiting); the client's end arrives
    before the event loop delivers that wake: the end waits for the pass that feeds its last samples."""

    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "worker's client")
        assert feed.offer(np.zeros(MAX_BUFFERED + 1, np.float32))  # full: a pass is waited for
        taken = inbox.take(CYCLES)
        feed.utterances.stream = _Stream()
        assert inbox.fed(taken) == ([feed], [])  # its wake is on its way to the event loop ...
        end = asyncio.create_task(feed.end())  # ... when the client's end comes first
        await asyncio.sleep(0.01)
        feed.wake()  # the earlier pass's wake, delivered now
        await asyncio.sleep(0.01)
        assert not end.done()  # the stream has not ended: its final would be empty
        [(_, last)] = inbox.take(CYCLES)
        assert feed.ending and len(last) == 0
        feed.stream.done = True
        assert inbox.fed([(feed, last)]) == ([feed], [])
        feed.wake()
        await asyncio.wait_for(end, WAIT_S)

    asyncio.run(run())


def test_an_ending_feed_without_samples_is_woken_by_the_next_pass_and_a_closed_one_at_once():
    async def run():
        inbox, _ = _inbox()
        silent, gone = _open(inbox, "silent"), _open(inbox, "gone")
        await gone.put(_samples(1))
        ends = [asyncio.create_task(feed.end()) for feed in (silent, gone)]
        await asyncio.sleep(0.01)
        taken = inbox.take(CYCLES)
        gone.utterances.stream = _Stream()
        assert inbox.fed(taken) == ([silent], [])  # no sample came: no stream, nothing to wait for
        assert gone.close() is False  # ... which releases its end at once
        with pytest.raises(RuntimeError, match="'gone' ended before its final result"):
            await asyncio.wait_for(ends[1], WAIT_S)
        assert inbox.fed([]) == ([gone], [])  # closed: nobody waits for its stream any more
        silent.wake()
        await asyncio.wait_for(ends[0], WAIT_S)

    asyncio.run(run())


def test_bad_samples_are_refused_at_once_naming_the_frame_from_the_stream_start():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "caller")
        await feed.put(_samples(0, 0, 0))
        with pytest.raises(AudioError, match=r"stream 'caller': non-finite sample \(nan\) at frame 4"):
            await feed.put(_samples(0, np.nan))
        assert [samples.tolist() for _, samples in inbox.take(CYCLES)] == []  # nothing of them was queued

    asyncio.run(run())


def test_a_stream_error_reaches_the_next_put():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "caller")
        feed.error = RuntimeError("the recognizer stopped")
        with pytest.raises(RuntimeError, match="stopped"):
            await feed.put(_samples(1))

    asyncio.run(run())


def test_a_closed_feed_drops_its_samples_and_a_pass_feeding_it_ends_its_stream():
    async def run():
        inbox, _ = _inbox()
        idle, busy = _open(inbox, "idle"), _open(inbox, "busy")
        await idle.put(_samples(*range(5)))
        assert idle.close() is False  # not being fed: the caller ends its stream
        assert inbox.take(CYCLES) == []
        await busy.put(_samples(*range(5)))
        taken = inbox.take(CYCLES)
        busy.utterances.stream = _Stream()
        assert busy.close() is True  # being fed: the pass ends its stream
        woken, orphans = inbox.fed(taken)
        assert orphans == [busy.stream]

    asyncio.run(run())


def test_the_bound_holds_a_whole_first_block():
    with pytest.raises(ValueError, match="max_buffered must be >= 4"):
        Inbox(threading.Event(), FIRST_BLOCK, BLOCK, FIRST_BLOCK - 1)


def test_a_feed_waits_while_the_recognizer_has_not_encoded_what_it_was_fed():
    async def run():
        inbox = Inbox(threading.Event(), FIRST_BLOCK, BLOCK, MAX_BUFFERED, max_ahead=2)
        feed = _open(inbox, "fast sender")
        for block in (np.zeros(FIRST_BLOCK, np.float32), np.zeros(BLOCK, np.float32)):
            await feed.put(block)
            taken = inbox.take(CYCLES)
            feed.new_blocks = 1  # the pass fed its stream a whole block
            inbox.fed(taken)  # two blocks fed, no cycle ran
        await feed.put(np.zeros(BLOCK, np.float32))
        assert inbox.take(CYCLES) == []
        assert [len(samples) for _, samples in inbox.take(CYCLES + 1)] == [BLOCK]  # one block encoded

    asyncio.run(run())


def test_a_feed_without_an_open_segment_is_not_held_back_by_blocks_a_cut_stream_was_fed():
    async def run():
        inbox = Inbox(threading.Event(), FIRST_BLOCK, BLOCK, MAX_BUFFERED, max_ahead=1)
        feed = _open(inbox, "caller")
        await feed.put(np.zeros(FIRST_BLOCK, np.float32))
        taken = inbox.take(CYCLES)
        feed.new_blocks = 1
        inbox.fed(taken)  # a block fed, no cycle ran: the feed waits ...
        await feed.put(np.zeros(BLOCK, np.float32))
        assert inbox.take(CYCLES) == []
        feed.utterances.segment_open = False  # ... until its segment is cut: no step may come for it
        assert [len(samples) for _, samples in inbox.take(CYCLES)] == [BLOCK]

    asyncio.run(run())


def test_silence_left_out_of_every_stream_holds_no_feed_back():
    async def run():
        inbox = Inbox(threading.Event(), FIRST_BLOCK, BLOCK, MAX_BUFFERED, max_ahead=1)
        feed = _open(inbox, "quiet")
        for _ in range(4):  # passes that feed no stream (voice-activity endpointing heard no speech)
            await feed.put(np.zeros(FIRST_BLOCK, np.float32))
            assert [len(samples) for _, samples in inbox.take(CYCLES)] == [FIRST_BLOCK]
            inbox.fed([(feed, np.zeros(FIRST_BLOCK, np.float32))])

    asyncio.run(run())


def test_a_commit_splits_the_samples_where_the_client_committed():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "caller")
        await feed.put(_samples(1, 2, 3))
        feed.commit()
        await feed.put(_samples(4, 5))
        [(_, first)] = inbox.take(CYCLES)
        assert first.tolist() == [1, 2, 3] and feed.committing  # the pass ends the open segment after them
        inbox.fed([(feed, first)])
        [(_, rest)] = inbox.take(CYCLES)
        assert rest.tolist() == [4, 5] and not feed.committing

    asyncio.run(run())


def test_a_clear_drops_what_was_not_fed_and_tells_the_next_pass():
    async def run():
        inbox, _ = _inbox()
        feed = _open(inbox, "caller")
        await feed.put(_samples(1, 2, 3))
        feed.clear()
        await feed.put(_samples(4))
        [(_, samples)] = inbox.take(CYCLES)
        assert samples.tolist() == [4] and feed.clearing

    asyncio.run(run())


@pytest.mark.parametrize(("voiced", "ahead"), [(False, False), (True, False), (False, True)])
def test_a_feed_is_due_every_handover_step_too_when_cut_by_voice_or_taken_ahead_and_blocks_are_longer(
    voiced: bool, ahead: bool
):
    step = HANDOVER_STEP_SAMPLES
    block = 2 * step + 100  # an LLM's long chunk, not a multiple of the step
    inbox = Inbox(threading.Event(), block, block, max_buffered=2 * block, ahead=ahead)
    feed = inbox.open("talker", _Utterances(vad_key=0 if voiced else None))
    due_at = []
    for fed in range(20, 3 * block + 1, 20):  # 20 samples a message: every boundary falls on one
        feed.offer(np.zeros(20, np.float32))
        taken = inbox.take(CYCLES)
        if taken:
            due_at.append(fed)
            inbox.fed(taken)
    steps = [step, 2 * step, block, 3 * step, 4 * step, 2 * block, 5 * step, 6 * step, 3 * block]
    assert due_at == (steps if voiced or ahead else [block, 2 * block, 3 * block])
