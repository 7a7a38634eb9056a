"""Concurrent real-time clients on the CPU: every one of them gets the text ``audiomask transcribe`` gives."""

from __future__ import annotations

import asyncio
import itertools

from audiomask.serve.client import stream_audio

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
