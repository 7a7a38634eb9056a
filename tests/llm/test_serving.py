"""The server's LLM recogniser (:class:`LLMServingRecognizer`) without the server: what the engine reads of a stream."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from audiomask.llm import checkpoint
from audiomask.llm.serving import LLMServingRecognizer
from audiomask.llm.streaming import StreamPolicy

pytest.importorskip("transformers")

CHUNK_SAMPLES = 8000  # 0.5 s chunks


@pytest.fixture(scope="module")
def qwen3_asr(tiny_qwen3_asr_dir: Path):
    return checkpoint.load(tiny_qwen3_asr_dir)


def test_token_count_moves_every_chunk_whether_or_not_the_text_changed_then_with_the_final(
    qwen3_asr, speech: Callable
) -> None:
    """The engine sends a result each time ``token_count`` moves: a client hears from every update, so a partial's
    latency can be timed from its chunk; the final is the model's offline answer."""
    signal = speech(3.0, 4)
    policy = StreamPolicy(chunk_s=CHUNK_SAMPLES / 16000, update_tokens=1, unfixed_tokens=1)
    with LLMServingRecognizer(qwen3_asr, max_streams=2, policy=policy, max_wait_ms=0) as recognizer:
        stream = recognizer.open_stream("caller")
        counts, texts = [], []
        for start in range(0, len(signal), CHUNK_SAMPLES):
            stream.accept(signal[start : start + CHUNK_SAMPLES])
            counts.append(stream.token_count)
            texts.append(stream.partial())
        assert counts == list(range(1, len(counts) + 1))
        assert len(set(texts)) < len(texts), "one answer token rolled back each update: some texts repeat"
        final = stream.finish(timeout=60)
        assert stream.done and stream.token_count == len(counts) + 1
    assert final == qwen3_asr.transcribe([signal])[0].text
