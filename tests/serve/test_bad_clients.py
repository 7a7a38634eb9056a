"""Bad clients get a precise error and a close code that says which; a good client beside them is unaffected.

Every bad client runs while one good client streams a sample at real time;
afterwards the good client's text is ``audiomask transcribe``'s and the
server holds no connection and no stream.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from audiomask.serve.client import stream_audio

SETTLE_TIMEOUT_S = 15.0  # the server frees what a connection held within this
PAUSE_S = 0.05
MAX_ERROR_CHARS = 400  # an error quotes a bad message in part, never whole
FLOAT32 = "<f4"
WENET_START = json.dumps({"signal": "start", "nbest": 1, "continuous_decoding": False})


def _audio(samples: np.ndarray) -> bytes:
    return samples[:4000].astype(FLOAT32).tobytes()


def _error_of(reply: str | bytes) -> str:
    """The error message of a sherpa (``{"error"}``) or WeNet (``{"status": "failed"}``) reply."""
    message = json.loads(reply)
    return message["error"] if "error" in message else message["message"]


async def _disconnect_abruptly(url: str, token: str, audio: bytes) -> None:
    """Send some audio, then drop the TCP connection without a close frame."""
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, proxy=None) as socket_:
        await socket_.send(audio)
        await asyncio.sleep(0.5)  # its samples accepted, its stream open
        socket_.transport.abort()


def _wait_until_idle(served) -> dict:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        status, health = served.health()
        if health["connections"] == 0 and health["streams"] == 0 or time.monotonic() > deadline:
            return health
        time.sleep(PAUSE_S)


def test_each_bad_client_gets_its_error_and_a_good_client_is_unaffected(served, sample_audio, expected_texts, exchange):
    hello = sample_audio["hello_world.wav"]
    sherpa, wenet = served.ws_url + "/", served.ws_url + "/wenet"
    limit = 65536  # SHARED_MAX_MESSAGE_BYTES
    nan = np.zeros(1000, np.float32)
    nan[500] = np.nan
    cases = {
        # name: (url, messages, expected close code, words the error must hold)
        "text other than Done": (sherpa, [_audio(hello), "hello"], 1003, "unexpected text message 'hello'"),
        "int16 sent as float32": (sherpa, [b"\x01\x00" * 1001], 1007, "looks like int16 PCM"),
        "WAV file sent as samples": (sherpa, [b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(32)], 1007, "WAV file header"),
        "NaN sample": (sherpa, [_audio(hello), nan.tobytes()], 1007, "non-finite sample (nan) at frame 4500"),
        "message over the limit": (sherpa, [bytes(limit + 4)], 1009, f"over the limit of {limit} bytes"),
        "idle past the timeout": (sherpa, [_audio(hello)], 1008, "no message for 3 s (--idle-timeout-s)"),
        "wenet: text not JSON": (wenet, ["hello"], 1007, "is not JSON"),
        "wenet: audio before start": (wenet, [bytes(3200)], 1007, "start signal is expected before binary data"),
        "wenet: unknown signal": (wenet, [WENET_START, '{"signal": "pause"}'], 1007, "unexpected signal 'pause'"),
        "wenet: JSON nested too deep": (wenet, ["[" * 60000], 1007, "nested too deep"),
        "wenet: deep JSON in an object": (
            wenet,
            ['{"signal": "start", "x": ' + "[" * 5000 + "]" * 5000 + "}"],
            1007,
            "nested too deep",
        ),
        "wenet: JSON not an object": (wenet, ["[" + "1, " * 20000 + "1]"], 1007, "must be a JSON object"),
        "wenet: nbest not a number": (wenet, ['{"signal": "start", "nbest": "two"}'], 1007, "nbest must be a positive"),
        "wenet: odd byte count": (wenet, [WENET_START, bytes(3201)], 1007, "not a whole number of int16 samples"),
    }

    async def run_all():
        good = asyncio.create_task(stream_audio(sherpa, hello, realtime=True, token=served.token))
        await asyncio.sleep(0.5)  # the good client is streaming
        bad = [exchange(url, messages, token=served.token) for url, messages, _, _ in cases.values()]
        results = await asyncio.gather(*bad, _disconnect_abruptly(sherpa, served.token, _audio(hello)))
        return await good, results[:-1]

    good, results = asyncio.run(run_all())

    assert good.text == expected_texts["hello_world.wav"]
    for (name, (_, _, code, words)), result in zip(cases.items(), results):
        assert result.close_code == code, f"{name}: closed with {result.close_code} {result.close_reason!r}"
        error = _error_of(result.replies[-1])
        assert words in error, f"{name}: {error!r}"
        assert len(error) <= MAX_ERROR_CHARS, f"{name}: an error of {len(error)} characters"
        assert result.close_reason and error.startswith(result.close_reason.removesuffix("...")), name
    health = _wait_until_idle(served)
    assert (health["connections"], health["streams"]) == (0, 0), health


def test_a_message_far_over_the_limit_is_refused_unread(served, exchange):
    result = asyncio.run(exchange(served.ws_url + "/", [bytes(4 * 65536)], token=served.token))
    assert result.close_code == 1009
    assert result.replies == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic dGVzdA=="}])
def test_a_missing_or_wrong_token_is_refused_with_401_at_the_handshake(served, headers):
    async def handshake():
        async with connect(served.ws_url + "/", additional_headers=headers, proxy=None):
            pass

    with pytest.raises(InvalidStatus) as refused:
        asyncio.run(handshake())
    response = refused.value.response
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert b"token" in response.body
    assert served.health()[1]["streams"] == 0


def test_the_token_may_come_in_the_query(served, sample_audio, expected_texts):
    url = f"{served.ws_url}/wenet?token={served.token}"
    result = asyncio.run(stream_audio(url, sample_audio["weather.wav"], protocol="wenet"))
    assert result.text == expected_texts["weather.wav"]


def test_connections_over_the_limit_get_503_with_retry_after(served, sample_audio, expected_texts):
    limit = 16  # SHARED_MAX_CONNECTIONS
    headers = {"Authorization": f"Bearer {served.token}"}

    async def overfill():
        held = [await connect(served.ws_url + "/", additional_headers=headers, proxy=None) for _ in range(limit)]
        try:
            with pytest.raises(InvalidStatus) as refused:
                await connect(served.ws_url + "/", additional_headers=headers, proxy=None)
            assert served.health()[1]["connections"] == limit
        finally:
            for socket_ in held:
                await socket_.close()
        return refused.value.response

    response = asyncio.run(overfill())
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) > 0
    assert b"--max-connections" in response.body
    assert _wait_until_idle(served)["connections"] == 0
    result = asyncio.run(stream_audio(served.ws_url + "/", sample_audio["numbers.wav"], token=served.token))
    assert result.text == expected_texts["numbers.wav"]
