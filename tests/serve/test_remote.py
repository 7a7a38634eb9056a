"""A WebSocket worker's feed: samples checked there, sent in whole blocks, paced exactly by the main process."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from audiomask.errors import AudioError
from audiomask.serve import wire
from audiomask.serve.remote import RemoteFeed
from audiomask.serve.segments import HANDOVER_STEP_SAMPLES

FIRST_BLOCK, BLOCK, MAX_BUFFERED = 4, 2, 6
WAIT_S = 5.0  # bound on every wait the test itself ends


class _Engine:
    """What a :class:`RemoteFeed` uses of its :class:`~audiomask.serve.remote.RemoteEngine`: sizes and send."""

    first_block, block, max_buffered, ahead = FIRST_BLOCK, BLOCK, MAX_BUFFERED, False

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, message: tuple) -> None:
        self.sent.append(message)


def _samples(count: int, start: float = 0.0) -> np.ndarray:
    return (start + np.arange(count, dtype=np.float32)) / 100


def test_samples_are_sent_in_whole_blocks_and_in_order():
    async def run():
        engine = _Engine()
        feed = RemoteFeed(engine, 7, "caller")
        await feed.put(_samples(3))
        assert engine.sent == []  # short of the first block
        await feed.put(_samples(2, 3))  # 5: the first block is complete
        await feed.put(_samples(1, 5))  # 6: the second block too
        await feed.put(_samples(1, 6))  # 7: short of the third
        feed.send_pending()  # the client ended its audio: the rest goes too
        return engine.sent

    sent = asyncio.run(run())
    assert [(kind, cid) for kind, cid, _ in sent] == [(wire.AUDIO, 7)] * 3
    assert [len(samples) for *_, samples in sent] == [5, 1, 1]
    np.testing.assert_array_equal(np.concatenate([samples for *_, samples in sent]), _samples(7))


def test_bad_samples_are_refused_where_they_arrive_naming_their_position():
    async def run():
        engine = _Engine()
        feed = RemoteFeed(engine, 1, "caller")
        await feed.put(_samples(3))
        bad = _samples(2)
        bad[1] = np.nan
        with pytest.raises(AudioError, match="caller"):
            await feed.put(bad)
        return engine.sent

    assert asyncio.run(run()) == []  # nothing of the refused message went on


def test_a_client_waits_once_more_than_the_feed_holds_is_unfed_and_goes_on_when_a_pass_took_it():
    async def run():
        engine = _Engine()
        feed = RemoteFeed(engine, 3, "fast")
        for start in range(0, 6, 2):  # 6 samples sent, none taken: at the bound, not over it
            await asyncio.wait_for(feed.put(_samples(2, start)), WAIT_S)
        assert (wire.WAIT, 3) not in engine.sent
        waiting = asyncio.create_task(feed.put(_samples(2, 6)))  # 8 sent: over the bound
        await asyncio.sleep(0.01)
        assert not waiting.done() and engine.sent[-1] == (wire.WAIT, 3)
        feed.resume(1)  # a pass took 1 sample: 7 still unfed, over the bound: it asks again
        await asyncio.sleep(0.01)
        assert not waiting.done() and engine.sent[-1] == (wire.WAIT, 3)
        feed.resume(4)  # 4 unfed now
        await asyncio.wait_for(waiting, WAIT_S)
        blocked = asyncio.create_task(feed.put(_samples(6, 8)))  # 14 sent, 10 unfed: waits again
        await asyncio.sleep(0.01)
        feed.fail(RuntimeError("the recognizer stopped"))
        with pytest.raises(RuntimeError, match="stopped"):
            await asyncio.wait_for(blocked, WAIT_S)

    asyncio.run(run())


@pytest.mark.parametrize(("voiced", "ahead"), [(False, False), (True, False), (False, True)])
def test_a_connection_sends_every_handover_step_too_when_cut_by_voice_or_taken_ahead_and_blocks_are_longer(
    voiced: bool, ahead: bool
):
    step = HANDOVER_STEP_SAMPLES
    engine = _Engine()
    engine.first_block = engine.block = block = 2 * step + 100  # an LLM's long chunk, not a multiple of the step
    engine.max_buffered, engine.ahead = 10 * block, ahead

    async def run() -> list[int]:
        feed = RemoteFeed(engine, 2, "talker", voiced=voiced)
        for _ in range(3 * block // 20):  # 20 samples a message: every boundary falls on one
            await feed.put(np.zeros(20, np.float32))
        return np.cumsum([len(samples) for *_, samples in engine.sent]).tolist()

    steps = [step, 2 * step, block, 3 * step, 4 * step, 2 * block, 5 * step, 6 * step, 3 * block]
    assert asyncio.run(run()) == (steps if voiced or ahead else [block, 2 * block, 3 * block])
