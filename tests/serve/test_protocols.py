"""Both routes against a real server: every sample's final text is ``audiomask transcribe``'s, partials only grow.

The messages are read with the ``websockets`` client, as sherpa-onnx's
``online-websocket-client-decode-file.py`` and WeNet's Python client do.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from audiomask.asr.checkpoint import load_model
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.asr.transcript import Transcript
from audiomask.serve.client import stream_audio

SHERPA_CLIENT_MESSAGE_SAMPLES = 8000  # sherpa-onnx's file client's default --samples-per-message
SHERPA_RESULT_KEYS = {"text", "segment", "is_final", "is_eof", "tokens", "timestamps", "start_time"}
INT16_FULL_SCALE = 32768


def single_stream_transcript(samples: np.ndarray) -> Transcript:
    """The shipped model's transcript of ``samples`` streamed alone, as ``audiomask transcribe`` streams it."""
    with StreamingRecognizer(load_model()) as recognizer:
        stream = recognizer.open_stream()
        stream.accept(samples)
        stream.finish()
        return stream.transcript()


def _assert_grows(texts: list[str], final: str) -> None:
    """Each text extends the one before it, and the final text extends the last."""
    for before, after in zip(["", *texts], [*texts, final]):
        assert after.startswith(before), f"{after!r} does not extend {before!r}"
    assert len(set(texts)) == len(texts), f"a text was sent twice: {texts}"


@pytest.mark.parametrize("protocol", ["sherpa", "wenet"])
def test_every_sample_gets_the_text_of_audiomask_transcribe(served, sample_audio, expected_texts, protocol):
    route = "/" if protocol == "sherpa" else "/wenet"

    async def run_all():
        return {
            name: await stream_audio(served.ws_url + route, samples, protocol=protocol, token=served.token)
            for name, samples in sample_audio.items()
        }

    results = asyncio.run(run_all())
    assert {name: result.text for name, result in results.items()} == expected_texts
    for name, result in results.items():
        texts = [text for _, text in result.partials]
        assert texts, f"{name}: no partial result before the final one"
        _assert_grows(texts, result.text)


def test_sherpa_messages_are_those_of_its_online_protocol(served, sample_audio, expected_texts, exchange):
    samples = sample_audio["hello_world.wav"]
    messages = [
        samples[start : start + SHERPA_CLIENT_MESSAGE_SAMPLES].astype("<f4").tobytes()
        for start in range(0, len(samples), SHERPA_CLIENT_MESSAGE_SAMPLES)
    ]
    result = asyncio.run(exchange(served.ws_url + "/", [*messages, "Done"], token=served.token))

    assert result.replies[-1] == "Done!"
    assert result.close_code == 1000
    results = [json.loads(reply) for reply in result.replies[:-1]]
    assert all(set(message) == SHERPA_RESULT_KEYS for message in results), results
    *partials, final = results
    assert final["is_final"] and final["is_eof"]
    assert final["text"] == expected_texts["hello_world.wav"]
    assert final["tokens"] == list(final["text"])
    # Each token's start: where the recognizer alone emits it (its transcript), in order, inside the audio.
    assert final["timestamps"] == list(single_stream_transcript(sample_audio["hello_world.wav"]).times_s)
    assert final["timestamps"] == sorted(final["timestamps"])
    assert final["timestamps"][0] >= 0 and final["timestamps"][-1] < len(sample_audio["hello_world.wav"]) / 16000
    for message in partials:
        assert message["tokens"] == list(message["text"])
        assert message["timestamps"] == final["timestamps"][: len(message["tokens"])]
    assert partials and not any(message["is_final"] or message["is_eof"] for message in partials)
    assert {message["segment"] for message in results} == {0}
    _assert_grows([message["text"] for message in partials], final["text"])


def test_wenet_messages_are_those_of_its_websocket_protocol(served, sample_audio, expected_texts, exchange):
    pcm = np.rint(sample_audio["numbers.wav"] * INT16_FULL_SCALE).astype("<i2").tobytes()
    start = json.dumps({"signal": "start", "nbest": 1, "continuous_decoding": False})
    messages = [start, *(pcm[offset : offset + 3200] for offset in range(0, len(pcm), 3200))]
    result = asyncio.run(exchange(served.ws_url + "/wenet", [*messages, '{"signal": "end"}'], token=served.token))

    replies = [json.loads(reply) for reply in result.replies]
    assert replies[0] == {"status": "ok", "type": "server_ready"}
    assert replies[-1] == {"status": "ok", "type": "speech_end"}
    assert result.close_code == 1000
    *partials, final = replies[1:-1]
    assert final["type"] == "final_result" and final["status"] == "ok"
    assert json.loads(final["nbest"]) == [{"sentence": expected_texts["numbers.wav"]}]
    assert partials and {reply["type"] for reply in partials} == {"partial_result"}
    texts = [json.loads(reply["nbest"])[0]["sentence"] for reply in partials]
    _assert_grows(texts, expected_texts["numbers.wav"])


def test_no_audio_gives_an_empty_final_result(served, exchange):
    result = asyncio.run(exchange(served.ws_url + "/", ["Done"], token=served.token))
    assert [json.loads(result.replies[0])["text"], result.replies[1]] == ["", "Done!"]
    assert result.close_code == 1000


def test_a_pause_ends_a_segment_on_the_sherpa_route_and_the_segments_make_up_the_stream(served, sample_audio, exchange):
    first, second = sample_audio["hello_world.wav"], sample_audio["numbers.wav"]
    pause = np.zeros(2 * 16000, np.float32)  # 2 s: past the 0.5 s of silence that end a segment
    samples = np.concatenate([first, pause, second])
    messages = [samples[start : start + 1600].astype("<f4").tobytes() for start in range(0, len(samples), 1600)]
    result = asyncio.run(exchange(served.ws_url + "/", [*messages, "Done"], token=served.token))

    *results, done = result.replies
    assert done == "Done!" and result.close_code == 1000
    results = [json.loads(reply) for reply in results]
    ended = [r for r in results if r["is_final"] and not r["is_eof"]]
    last = results[-1]
    assert [r["segment"] for r in ended] == [0] and last["segment"] == 1 and last["is_eof"]
    whole = single_stream_transcript(samples)
    assert ended[0]["text"] + last["text"] == whole.text  # the segments split the stream's text
    assert ended[0]["text"].startswith("hello") and last["text"].strip().startswith("seven")
    assert len(first) / 16000 < last["start_time"] < (len(first) + len(pause)) / 16000
    # Each segment is a stream of its own from its start: its text and token times are that audio's alone.
    alone = single_stream_transcript(samples[round(last["start_time"] * 16000) :])
    assert (last["text"], last["timestamps"]) == (alone.text, [pytest.approx(t, abs=0.002) for t in alone.times_s])
    for r in results:  # each segment's partials grow, and start afresh
        assert r["text"] == "".join(r["tokens"])
    streamed = asyncio.run(stream_audio(served.ws_url + "/", samples, token=served.token))
    assert streamed.text == whole.text
    # The package's client tells which segment each partial reports, where it starts, and which ended it.
    assert [place for place in streamed.partial_segments if place[2]] == [(0, ended[0]["start_time"], True)]
    assert {place[:2] for place in streamed.partial_segments} == {(0, ended[0]["start_time"]), (1, last["start_time"])}
    wenet = asyncio.run(
        stream_audio(served.ws_url + "/wenet", samples, protocol="wenet", token=served.token)
    )  # WeNet's route: no endpoints, one utterance
    assert wenet.partial_segments == [None] * len(wenet.partials)
    assert wenet.text == whole.text
