"""audiomask.serve.wire: frames carry batches of messages both ways; a message that fails is skipped, not fatal."""

from __future__ import annotations

import asyncio

from audiomask.errors import AudioError
from audiomask.serve import wire


def test_a_message_that_fails_is_skipped_and_the_rest_are_dispatched_until_the_other_side_goes():
    async def run():
        reader = asyncio.StreamReader()
        reader.feed_data(wire.encode([(wire.OPEN, 1, "a"), (wire.AUDIO, 2, "boom"), (wire.END, 1)]))
        reader.feed_data(wire.encode([(wire.CLOSE, 1)]))
        reader.feed_eof()
        seen = []

        def dispatch(message):
            if message[2:] == ("boom",):
                raise RuntimeError("a bad message")
            seen.append(message[:2])

        await asyncio.wait_for(wire.dispatch_frames(reader, dispatch), 5)
        return seen

    assert asyncio.run(run()) == [(wire.OPEN, 1), (wire.END, 1), (wire.CLOSE, 1)]


def test_messages_sent_in_one_pass_of_the_event_loop_leave_as_one_frame():
    async def run():
        received = asyncio.Queue()

        async def on_connect(reader, writer):
            await wire.dispatch_frames(reader, received.put_nowait)

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        link = wire.Link(reader, writer)
        written = []
        original = writer.write
        writer.write = lambda data: (written.append(len(data)), original(data))
        for cid in range(100):
            link.send((wire.RESULTS, cid, f"text {cid}"))
        await asyncio.sleep(0.05)  # the pass is over: its messages are written
        messages = [received.get_nowait() for _ in range(received.qsize())]
        await link.close()
        server.close()
        return written, messages

    written, messages = asyncio.run(run())
    assert len(written) == 1
    assert messages == [(wire.RESULTS, cid, f"text {cid}") for cid in range(100)]


def test_errors_cross_as_the_kinds_a_session_tells_apart():
    for error in (AudioError("NaN at sample 3"), ValueError("stream ended"), RuntimeError("stopped")):
        back = wire.error_from_wire(*wire.error_to_wire(error))
        assert type(back) is type(error) and str(back) == str(error)
    back = wire.error_from_wire(*wire.error_to_wire(KeyError("x")))
    assert isinstance(back, RuntimeError) and "KeyError" in str(back)
