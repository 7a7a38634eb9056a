"""``audiomask serve --model DIR`` with a tiny random Qwen3-ASR checkpoint: partials as the audio comes, the
offline answer as the final, on both routes; options for the other kind of model are one line, status 2.

The checkpoint is built by ``tests/llm/conftest.py``'s builder (loaded from its path: the test packages are
not importable). Chunks of 0.5 s keep the server quick on a CPU.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from audiomask.serve.client import stream_audio

pytest.importorskip("transformers")

REPOSITORY = Path(__file__).resolve().parents[2]
CHUNK_MS = 500
MESSAGE_SAMPLES = 1600  # 0.1 s a message, sent in real time
USAGE_TIMEOUT_S = 60.0
EXIT_USAGE = 2


def _llm_conftest() -> object:
    spec = importlib.util.spec_from_file_location("llm_checkpoints", REPOSITORY / "tests" / "llm" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Qwen3-ASR checkpoint of ``tests/llm`` (``tiny_qwen3_asr_dir``), saved for this module."""
    return _llm_conftest()._save_qwen3_asr(tmp_path_factory.mktemp("qwen3-asr-tiny"), seed=0)


def _speech(seconds: float, seed: int) -> np.ndarray:
    """Float32 16 kHz audio with a voice-like spectrum (as ``tests/llm``'s ``speech`` fixture makes it)."""
    rng = np.random.default_rng(seed)
    time = np.arange(int(round(seconds * 16000))) / 16000
    pitch = 120 + 60 * np.sin(2 * np.pi * rng.uniform(0.2, 1.0) * time + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(pitch) / 16000
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * time)
    return (0.1 * voice * envelope + 0.01 * rng.standard_normal(len(time))).astype(np.float32)


@pytest.fixture(scope="module")
def speech() -> Callable[[float, int], np.ndarray]:
    """``speech(seconds, seed)``: :func:`_speech`."""
    return _speech


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


@pytest.mark.parametrize("ws_workers", [0, 1])
def test_two_clients_at_once_get_partials_and_the_offline_answer(start_server, qwen3_dir, speech, ws_workers):
    served = start_server(
        "--model", str(qwen3_dir), "--device", "cpu", "--chunk-ms", str(CHUNK_MS), "--ws-workers", str(ws_workers)
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
    for result in (sherpa, wenet):
        assert len(result.partials) >= 2, (
            "a partial a chunk (0.5 s) of the 2.6-3 s streamed: some may carry the same text"
        )
        assert result.partials[0][0] < result.done_at, "the first partial came after the end of the audio"
        assert result.segments == []  # one segment per connection: no endpoints over a revised text
    assert _health(served.url)["cycles"] > 0


def test_a_client_gone_mid_stream_frees_its_slot(start_server, qwen3_dir, speech):
    served = start_server("--model", str(qwen3_dir), "--device", "cpu", "--chunk-ms", str(CHUNK_MS))
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
    [("--left-chunks", "2"), ("--frontend-workers", "1"), ("--dtype", "bfloat16"), ("--endpoint-silence-s", "2")],
)
def test_a_ctc_option_with_an_llm_checkpoint_is_one_line(qwen3_dir, options):
    result = _serve_usage("--model", str(qwen3_dir), *options)
    assert result.returncode == EXIT_USAGE
    (line,) = result.stderr.splitlines()
    assert options[0] in line and "LLM checkpoint" in line


def test_a_phi4_checkpoint_is_refused_in_one_line(tmp_path):
    directory = _llm_conftest()._save_phi4mm(tmp_path, seed=0, tie_word_embeddings=True, lora=False)
    result = _serve_usage("--model", str(directory))
    assert result.returncode == EXIT_USAGE
    (line,) = result.stderr.splitlines()
    assert "phi4_multimodal checkpoint does not stream" in line


@pytest.mark.parametrize("options", [("--context", "names"), ("--language", "English")])
def test_context_or_language_with_a_ctc_model_is_one_line(options):
    result = _serve_usage(*options)
    assert result.returncode == EXIT_USAGE
    (line,) = result.stderr.splitlines()
    assert "--context and --language need an LLM checkpoint" in line
