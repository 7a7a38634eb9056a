"""``/v1/realtime`` against a real server: the official ``openai`` client unchanged, and vLLM's example client.

OpenAI's client streams 24 kHz PCM16 (what its API takes), so each sample file
is written at 24 kHz first (as ``audiomask.serve.client`` resamples it), and its
expected text is ``audiomask transcribe``'s of that file. vLLM's client streams
the 16 kHz files as they are.
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soundfile as sf
from websockets.asyncio.client import connect

from audiomask.constants import SAMPLE_RATE
from audiomask.resample import Resampler
from audiomask.serve.client import REALTIME_RATE, stream_audio, to_realtime_rate
from audiomask.serve.realtime import OPENAI_RATE, REALTIME_ROUTE
from tests.serve.conftest import transcribe_texts

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.system

APPEND_S = 0.1  # audio per input_audio_buffer.append, as OpenAI's examples send it
VLLM_CHUNK_BYTES = 4096  # vLLM's example client: 4 KiB of PCM16 per append
RECEIVE_TIMEOUT_S = 60.0
PAUSE_S = 1.0  # the silence between two sentences in the server-VAD test


def _pcm16(samples: np.ndarray) -> bytes:
    return np.clip(np.rint(samples * 32768), -32768, 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def files_24k(sample_audio, tmp_path_factory) -> dict[str, tuple[bytes, str]]:
    """Each sample file at 24 kHz: its PCM16 and ``audiomask transcribe``'s text of it; and the two-sentence file
    (``two.wav``: two samples with :data:`PAUSE_S` of silence between)."""
    directory = tmp_path_factory.mktemp("realtime")
    audio = dict(sample_audio)
    first, second = audio["hello_world.wav"], audio["weather.wav"]
    audio["two.wav"] = np.concatenate([first, np.zeros(round(PAUSE_S * SAMPLE_RATE), np.float32), second])
    pcm = {}
    for name, samples in audio.items():
        resampler = Resampler(SAMPLE_RATE, OPENAI_RATE)
        pcm[name] = _pcm16(np.concatenate((resampler.push(samples), resampler.flush())))
        sf.write(directory / name, np.frombuffer(pcm[name], "<i2"), OPENAI_RATE, subtype="PCM_16")
    texts = transcribe_texts([directory / name for name in audio])
    return {name: (pcm[name], texts[name]) for name in audio}


def _openai_client(served) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=served.token, base_url=served.url + "/v1")


async def _openai_items(served, pcm: bytes, turn_detection: dict | None) -> tuple[list[dict], list[str]]:
    """Stream ``pcm`` (24 kHz) through the official client: each item's (id, deltas joined, transcript), and the
    types of every event received, in order."""
    session = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": OPENAI_RATE},
                "transcription": {"model": "gpt-4o-transcribe"},
                "turn_detection": turn_detection,
            }
        },
    }
    step = round(APPEND_S * OPENAI_RATE) * 2
    async with _openai_client(served).realtime.connect(extra_query={"intent": "transcription"}) as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session=session)
        for start in range(0, len(pcm), step):
            await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[start : start + step]).decode())
        if turn_detection is None:
            await connection.input_audio_buffer.commit()
        else:  # trailing silence, as a live microphone goes on: server VAD hears the end
            silence = base64.b64encode(bytes(step)).decode()
            for _ in range(10):
                await connection.input_audio_buffer.append(audio=silence)
        types, deltas, items = [], {}, []
        while True:
            event = await asyncio.wait_for(connection.recv(), RECEIVE_TIMEOUT_S)
            types.append(event.type)
            if event.type == "error":
                raise AssertionError(event.error.message)
            if event.type == "conversation.item.input_audio_transcription.delta":
                deltas[event.item_id] = deltas.get(event.item_id, "") + event.delta
            elif event.type == "conversation.item.input_audio_transcription.completed":
                items.append({"id": event.item_id, "deltas": deltas.get(event.item_id, ""), "text": event.transcript})
                if turn_detection is None or len(items) == 2:
                    return items, types


@pytest.mark.parametrize("name", ["hello_world.wav", "numbers.wav", "weather.wav"])
def test_the_official_openai_client_gets_the_text_of_audiomask_transcribe(served, files_24k, name):
    pcm, expected = files_24k[name]
    items, types = asyncio.run(_openai_items(served, pcm, turn_detection=None))
    [item] = items
    assert item["text"] == expected
    assert expected.startswith(item["deltas"]) and item["deltas"]  # the deltas streamed the text as it grew
    committed, completed = (
        types.index("input_audio_buffer.committed"),
        types.index("conversation.item.input_audio_transcription.completed"),
    )
    assert types[0] == "session.updated" and committed < types.index("conversation.item.added") < completed
    assert "input_audio_buffer.speech_started" not in types  # no server VAD: the client commits


def test_server_vad_splits_two_sentences_into_two_items(served, files_24k):
    pcm, _ = files_24k["two.wav"]
    items, types = asyncio.run(
        _openai_items(served, pcm, turn_detection={"type": "server_vad", "silence_duration_ms": 500})
    )
    assert [item["text"] for item in items] == [files_24k["hello_world.wav"][1], files_24k["weather.wav"][1]]
    assert items[0]["id"] != items[1]["id"]
    first = [t for t in types if t.startswith("input_audio_buffer.")][:3]
    assert first == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
    ]


def test_the_package_client_streams_over_the_realtime_route(served, sample_audio, files_24k):
    async def run_all():
        url = served.ws_url + REALTIME_ROUTE
        return {
            name: await stream_audio(url, samples, protocol="realtime", realtime=False, token=served.token)
            for name, samples in sample_audio.items()
        }

    results = asyncio.run(run_all())
    assert {name: result.text for name, result in results.items()} == {
        name: files_24k[name][1] for name in sample_audio
    }
    assert all(result.partials and result.final_at >= result.done_at for result in results.values())
    # One item each (no pause in a sample file): every partial is item 0's, from where its speech started.
    places = {place for result in results.values() for place in result.partial_segments}
    assert {(item, ends) for item, _, ends in places} == {(0, False)}
    assert all(start is not None and 0 <= start < 1 for _, start, _ in places)


def test_the_package_client_sends_clips_converted_once_to_24khz_as_they_are(served, sample_audio, files_24k):
    url = served.ws_url + REALTIME_ROUTE
    samples = sample_audio["weather.wav"]
    converted = to_realtime_rate(samples)
    assert len(converted) == -(-len(samples) * REALTIME_RATE // SAMPLE_RATE)
    result = asyncio.run(
        stream_audio(url, converted, protocol="realtime", token=served.token, sample_rate=REALTIME_RATE)
    )
    assert result.text == files_24k["weather.wav"][1]
    with pytest.raises(ValueError, match="sample_rate must be one of \\(16000,\\) over sherpa, got 24000"):
        asyncio.run(stream_audio(served.ws_url + "/", converted, sample_rate=REALTIME_RATE))


async def _vllm_example(url: str, pcm: bytes, model: str = "audiomask") -> tuple[str, str]:
    """vLLM's ``openai_realtime_client.py``, its logic as it is: the deltas joined, and the done text."""
    async with connect(url, proxy=None) as ws:
        response = json.loads(await ws.recv())
        assert response["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "model": model}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        for i in range(0, len(pcm), VLLM_CHUNK_BYTES):
            chunk = pcm[i : i + VLLM_CHUNK_BYTES]
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        deltas = ""
        while True:
            response = json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_TIMEOUT_S))
            if response["type"] == "transcription.delta":
                deltas += response["delta"]
            elif response["type"] == "transcription.done":
                return deltas, response["text"]
            elif response["type"] == "error":
                raise AssertionError(response["error"])


def test_vllm_realtime_example_client_gets_the_same_texts(served, sample_audio, expected_texts):
    url = served.ws_url + REALTIME_ROUTE + f"?token={served.token}"

    async def run_all():
        return {name: await _vllm_example(url, _pcm16(samples)) for name, samples in sample_audio.items()}

    results = asyncio.run(run_all())
    assert {name: done for name, (_, done) in results.items()} == expected_texts
    assert all(deltas == done for deltas, done in results.values())  # greedy CTC: the deltas make the text


async def _events(ws, count: int) -> list[dict]:
    return [json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_TIMEOUT_S)) for _ in range(count)]


def test_bad_events_get_an_error_event_and_the_connection_goes_on(served, files_24k, sample_audio, expected_texts):
    """OpenAI's dialect: unknown event, bad base64, wrong audio format, binary frame, not JSON; then it works."""
    pcm, expected = files_24k["hello_world.wav"]
    url = served.ws_url + REALTIME_ROUTE + "?intent=transcription"
    headers = {"Authorization": f"Bearer {served.token}"}

    async def run() -> list[dict]:
        async with connect(url, additional_headers=headers, proxy=None) as ws:
            assert (await _events(ws, 1))[0]["type"] == "session.created"
            bad = [
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"type": "transcription", "audio": {"input": {"turn_detection": None}}},
                    }
                ),
                json.dumps({"type": "response.create", "event_id": "evt_1"}),
                json.dumps({"type": "input_audio_buffer.append", "audio": "not base64!"}),
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
                    }
                ),
                json.dumps({"type": "input_audio_buffer.commit"}),  # nothing appended yet
                b"\x00\x01",
                "{not json",
            ]
            for message in bad:
                await ws.send(message)
            replies = await _events(ws, len(bad))
            for start in range(0, len(pcm), 4800):
                await ws.send(
                    json.dumps(
                        {
                            "type": "input_audio_buffer.append",
                            "audio": base64.b64encode(pcm[start : start + 4800]).decode(),
                        }
                    )
                )
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            while True:
                event = (await _events(ws, 1))[0]
                if event["type"] == "conversation.item.input_audio_transcription.completed":
                    return [*replies, event]

    events = asyncio.run(run())
    assert events[0]["type"] == "session.updated"
    errors = events[1:7]
    assert [event["type"] for event in errors] == ["error"] * 6
    assert [event["error"]["code"] for event in errors] == [
        "unknown_event",
        "invalid_value",
        "invalid_value",
        "input_audio_buffer_commit_empty",
        "invalid_event",
        "invalid_json",
    ]
    assert errors[0]["error"]["event_id"] == "evt_1"  # the client's event it answers
    assert "audio/pcmu" in errors[2]["error"]["message"]
    assert events[-1]["transcript"] == expected  # the connection went on


def test_vllm_dialect_refuses_audio_before_its_session_update(served, sample_audio, expected_texts):
    url = served.ws_url + REALTIME_ROUTE + f"?token={served.token}"
    pcm = _pcm16(sample_audio["numbers.wav"])

    async def run() -> tuple[dict, tuple[str, str]]:
        async with connect(url, proxy=None) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            [error] = await _events(ws, 1)
        return error, await _vllm_example(url, pcm)

    error, (_, done) = asyncio.run(run())
    assert error == {"type": "error", "error": error["error"], "code": "model_not_validated"}
    assert done == expected_texts["numbers.wav"]


def test_a_wrong_token_is_refused_at_the_handshake(served):
    client = openai.AsyncOpenAI(api_key="wrong", base_url=served.url + "/v1")

    async def run() -> None:
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
            await connection.recv()

    with pytest.raises(Exception, match="401"):
        asyncio.run(run())
