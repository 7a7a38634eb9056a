"""``audiomask serve --model DIR`` with a tiny random Qwen3-ASR checkpoint: partials as the audio comes, the
offline answer as the final, on both routes; a Phi-4-multimodal one the same way; options for the other kind of
model are one line, status 2.

The checkpoint is ``tests/llm``'s (:mod:`bench.llm_checkpoints`). Chunks of 0.5 s keep the server quick on a CPU.
The synthetic signals are no speech to a voice-activity detector: those servers run without endpoints
(``--endpoint-silence-s 0``), one segment per connection; the realtime test streams the sample files.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from audiomask.constants import SAMPLE_RATE
from audiomask.llm.policy import StreamPolicy
from audiomask.serve.client import stream_audio
from bench.llm_checkpoints import TINY_AUDIO, TINY_TEXT, save_qwen3_asr
from bench.llm_checkpoints import speech as speech_signal

pytest.importorskip("transformers")

REPOSITORY = Path(__file__).resolve().parents[2]
CHUNK_MS = 500
NO_ENDPOINTS = ("--endpoint-silence-s", "0")
MESSAGE_SAMPLES = 1600  # 0.1 s a message, sent in real time
USAGE_TIMEOUT_S = 60.0
EXIT_USAGE = 2


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Qwen3-ASR checkpoint of ``tests/llm`` (``tiny_qwen3_asr_dir``), saved for this module."""
    return save_qwen3_asr(tmp_path_factory.mktemp("qwen3-asr-tiny"), TINY_AUDIO, TINY_TEXT, seed=0)


@pytest.fixture(scope="module")
def speech() -> Callable[[float, int], np.ndarray]:
    """``speech(seconds, seed)``: :func:`bench.llm_checkpoints.speech`."""
    return speech_signal


def _offline(directory: Path, signals: list[np.ndarray]) -> list[str]:
    """The model's offline answers (float32, CPU): what each stream's final must be."""
    from audiomask.llm import checkpoint

    model = checkpoint.load(directory)
    return [model.transcribe([signal])[0].text for signal in signals]


def _int16(samples: np.ndarray) -> np.ndarray:
    """``samples`` as the WeNet route receives them: int16 PCM, back to float32."""
    return (np.clip(np.rint(samples * 32768.0), -32768, 32767) / np.float32(32768.0)).astype(np.float32)


def _health(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.parametrize(("ws_workers", "frontend_workers"), [(0, 0), (1, 0), (0, 2)])
def test_two_clients_at_once_get_partials_and_the_offline_answer(
    start_server, qwen3_dir, speech, ws_workers, frontend_workers
):
    served = start_server(
        "--model",
        str(qwen3_dir),
        "--device",
        "cpu",
        "--chunk-ms",
        str(CHUNK_MS),
        "--ws-workers",
        str(ws_workers),
        "--frontend-workers",
        str(frontend_workers),
        *NO_ENDPOINTS,
    )
    health = _health(served.url)
    assert (health["chunk_ms"], health["device"], health["max_connections"]) == (CHUNK_MS, "cpu", 4)
    sherpa_audio, wenet_audio = speech(3.0, 1), speech(2.6, 2)

    async def both():
        return await asyncio.gather(
            stream_audio(served.ws_url, sherpa_audio, message_samples=MESSAGE_SAMPLES, realtime=True),
            stream_audio(
                served.ws_url + "/wenet", wenet_audio, protocol="wenet", message_samples=MESSAGE_SAMPLES, realtime=True
            ),
        )

    sherpa, wenet = asyncio.run(both())
    assert [sherpa.text, wenet.text] == _offline(qwen3_dir, [sherpa_audio, _int16(wenet_audio)])
    for result, audio in ((sherpa, sherpa_audio), (wenet, wenet_audio)):
        chunks = len(audio) * 1000 // (CHUNK_MS * SAMPLE_RATE)
        # A result every chunk, its text changed or not (the last chunk's may come with the final instead).
        assert chunks - 1 <= len(result.partials) <= chunks, (len(result.partials), chunks)
        assert result.partials[0][0] < result.done_at, "the first partial came after the end of the audio"
        assert result.segments == []  # one segment per connection: no endpoints
    health = _health(served.url)
    # An update is a cycle and each stream it carried a chunk: one a partial of each connection.
    expected = sum(len(audio) * 1000 // (CHUNK_MS * SAMPLE_RATE) for audio in (sherpa_audio, wenet_audio))
    assert health["cycles"] > 0 and expected - 2 <= health["chunks"] <= expected, health  # a last one may go final


def test_a_result_comes_every_chunk_when_its_text_repeats(start_server, qwen3_dir, speech):
    # One token an update, then rolled back: the answer never grows, so the partials repeat one text.
    served = start_server(
        "--model", str(qwen3_dir), "--device", "cpu", "--chunk-ms", str(CHUNK_MS), "--fixed-tokens", "1", *NO_ENDPOINTS
    )
    audio = speech(2.0, 4)
    result = asyncio.run(stream_audio(served.ws_url, audio, message_samples=MESSAGE_SAMPLES, realtime=True))
    texts = [text for _, text in result.partials]
    chunks = len(audio) * 1000 // (CHUNK_MS * SAMPLE_RATE)
    assert chunks - 1 <= len(texts) <= chunks, texts
    assert len(set(texts[StreamPolicy().unfixed_chunks :])) == 1, texts


def test_a_client_gone_mid_stream_frees_its_slot(start_server, qwen3_dir, speech):
    served = start_server("--model", str(qwen3_dir), "--device", "cpu", "--chunk-ms", str(CHUNK_MS), *NO_ENDPOINTS)
    audio = speech(1.5, 3)

    async def run():
        for _ in range(5):  # more than --max-connections 4: each leaves before its end
            await _leave(served.ws_url, audio[:12000])
        return await stream_audio(served.ws_url, audio, message_samples=MESSAGE_SAMPLES)

    result = asyncio.run(run())
    assert result.text == _offline(qwen3_dir, [audio])[0]


async def _leave(url: str, samples: np.ndarray) -> None:
    """Connect, send ``samples``, wait two chunks' time and close without the end message."""
    from websockets.asyncio.client import connect

    async with connect(url, proxy=None) as connection:
        await connection.send(samples.astype("<f4").tobytes())
        await asyncio.sleep(2 * CHUNK_MS / 1000)


def _serve_usage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "audiomask", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=USAGE_TIMEOUT_S,
        check=False,
        cwd=REPOSITORY,
    )


@pytest.mark.parametrize(
    "options",
    [("--left-chunks", "2"), ("--dtype", "bfloat16")],
)
def test_a_ctc_option_with_an_llm_checkpoint_is_one_line(qwen3_dir, options):
    result = _serve_usage("--model", str(qwen3_dir), *options)
    assert result.returncode == EXIT_USAGE
    (line,) = result.stderr.splitlines()
    assert options[0] in line and "LLM checkpoint" in line


def test_a_phi4_checkpoint_streams_by_re_feeding_to_its_offline_answer(start_server, tmp_path, speech):
    """Phi-4-multimodal's encoder attends over the whole utterance: each update encodes all the audio again (the
    recipe as it is), a result every chunk, and the final is the offline answer."""
    from tests.llm.conftest import save_phi4mm

    phi4mm_dir = save_phi4mm(tmp_path, seed=0, tie_word_embeddings=True, lora=False)
    served = start_server("--model", str(phi4mm_dir), "--device", "cpu", "--chunk-ms", str(CHUNK_MS), *NO_ENDPOINTS)
    audio = speech(2.6, 5)
    result = asyncio.run(stream_audio(served.ws_url, audio, message_samples=MESSAGE_SAMPLES, realtime=True))
    assert result.text == _offline(phi4mm_dir, [audio])[0]
    chunks = len(audio) * 1000 // (CHUNK_MS * SAMPLE_RATE)
    assert chunks - 1 <= len(result.partials) <= chunks, (len(result.partials), chunks)


@pytest.mark.parametrize("options", [("--context", "names"), ("--language", "English"), ("--fixed-tokens", "13")])
def test_an_llm_option_with_a_ctc_model_is_one_line(options):
    result = _serve_usage(*options)
    assert result.returncode == EXIT_USAGE
    (line,) = result.stderr.splitlines()
    assert f"{options[0]}: need an LLM checkpoint directory" in line


def test_fixed_tokens_and_the_longest_segment_reach_the_servers_policy(qwen3_dir):
    """The server ends every segment within --max-segment-s (default 20 s): its streams' segments hold the 8 s
    windows that takes (two closed, a third open), so a slot holds fewer positions than streams never cut."""
    from audiomask.llm.serving import build_llm_recognizer
    from audiomask.llm.streaming import StreamPolicy
    from audiomask.serve.settings import ServeSettings

    made = {}
    for longest_s in (20.0, 16.0, 100.0):
        settings = ServeSettings(
            model=str(qwen3_dir),
            device="cpu",
            chunk_ms=CHUNK_MS,
            max_connections=1,
            fixed_tokens=3,
            max_segment_s=longest_s,
        )
        with build_llm_recognizer(settings) as recognizer:
            made[longest_s] = recognizer.policy, recognizer._streams.capacity
    assert made[20.0][0] == StreamPolicy(chunk_s=CHUNK_MS / 1000, fixed_tokens=3, segment_windows=3) == made[16.0][0]
    assert made[100.0][0] == StreamPolicy(chunk_s=CHUNK_MS / 1000, fixed_tokens=3)  # four windows: never cut sooner
    assert made[20.0][1] < made[100.0][1]
    with pytest.raises(ValueError, match="--fixed-tokens"):
        ServeSettings(model=str(qwen3_dir), fixed_tokens=0)


def test_server_vad_ends_each_items_stream_and_its_final_is_the_offline_answer_of_its_audio(
    start_server, qwen3_dir, sample_audio
):
    """Two sentences with a pause, over ``/v1/realtime`` with server VAD (16 kHz PCM, so that the server hears these
    very samples): two items, each the language model's offline answer over the audio its events bound."""
    import base64

    from websockets.asyncio.client import connect

    served = start_server("--model", str(qwen3_dir), "--device", "cpu", "--chunk-ms", str(CHUNK_MS))
    pause = np.zeros(SAMPLE_RATE, np.float32)
    audio = np.concatenate([sample_audio["hello_world.wav"], pause, sample_audio["numbers.wav"], pause])
    pcm = (np.clip(audio, -1, 32767 / 32768) * 32768).astype("<i2")
    heard = pcm.astype(np.float32) / np.float32(32768)  # what the server decodes
    session = {
        "type": "transcription",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": {"type": "server_vad"}}
        },
    }

    async def run() -> list[dict]:
        async with connect(served.ws_url + "/v1/realtime?intent=transcription", proxy=None) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            for start in range(0, len(pcm), MESSAGE_SAMPLES):
                chunk = base64.b64encode(pcm[start : start + MESSAGE_SAMPLES].tobytes()).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            events = []
            while sum(e["type"].endswith("transcription.completed") for e in events) < 2:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            return events

    events = asyncio.run(run())
    starts = [e["audio_start_ms"] for e in events if e["type"] == "input_audio_buffer.speech_started"]
    ends = [e["audio_end_ms"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    finals = [e["transcript"] for e in events if e["type"].endswith("transcription.completed")]
    assert len(starts) == len(ends) == 2
    spans = [heard[start * SAMPLE_RATE // 1000 : end * SAMPLE_RATE // 1000] for start, end in zip(starts, ends)]
    assert finals == _offline(qwen3_dir, spans)


def test_more_connections_than_the_memory_holds_is_one_line_naming_the_option(qwen3_dir):
    result = _serve_usage("--model", str(qwen3_dir), "--device", "cpu", "--max-connections", "4000000000")
    assert result.returncode != 0
    (line,) = result.stderr.splitlines()
    assert "--max-connections 4000000000" in line and "slots fit" in line
