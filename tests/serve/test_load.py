"""Concurrent real-time clients on the CPU: every one of them gets the text ``audiomask transcribe`` gives."""

from __future__ import annotations

import asyncio
import itertools

from audiomask.serve.client import stream_audio
from audiomask.serve.engine import build_recognizer
from audiomask.serve.settings import DEFAULT_MAX_CONNECTIONS, ServeSettings

CLIENTS = 12  # of the shared server's 16 connections
STAGGER_S = 0.05  # seconds between two clients' starts: they join the running batch one by one


def test_concurrent_realtime_clients_all_get_the_right_text(served, sample_audio, expected_texts):
    names = list(itertools.islice(itertools.cycle(sorted(sample_audio)), CLIENTS))
    protocols = list(itertools.islice(itertools.cycle(["sherpa", "wenet"]), CLIENTS))

    async def client(index):
        await asyncio.sleep(index * STAGGER_S)
        route = "/" if protocols[index] == "sherpa" else "/wenet"
        samples = sample_audio[names[index]]
        return await stream_audio(
            served.ws_url + route, samples, protocol=protocols[index], realtime=True, token=served.token
        )

    async def run_all():
        return await asyncio.gather(*(client(index) for index in range(CLIENTS)))

    results = asyncio.run(run_all())
    assert [result.text for result in results] == [expected_texts[name] for name in names]
    assert all(result.partials for result in results)


# A step on the CPU costs a fixed part about that of 4 slots' rows plus its rows (server_cpu.json): with one
# client, a server of the default options must step no more rows than this, else it is many times slower
# than ``audiomask transcribe`` on the same file.
ONE_CLIENT_ROWS = 4


def test_a_default_cpu_server_steps_one_client_over_a_few_rows(sample_audio, expected_texts):
    """With every option at its default on the CPU, the steps of one stream compute a lane of a few slots of the
    64 connections' (the CTC head sees each step's rows), and its text is the one ``audiomask transcribe`` gives."""
    settings = ServeSettings(device="cpu")
    with build_recognizer(settings) as recognizer:
        assert recognizer.max_streams == DEFAULT_MAX_CONNECTIONS
        rows: list[int] = []
        recognizer.model.head.register_forward_hook(lambda module, args, output: rows.append(len(args[0])))
        text = recognizer.transcribe(sample_audio["hello_world.wav"])
    assert text == expected_texts["hello_world.wav"]
    assert rows and max(rows) <= ONE_CLIENT_ROWS
