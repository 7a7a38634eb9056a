"""The pipe benchmark, scaled down: ``audiomask transcribe -`` reads a long pipe whole, in the memory of a short one,
and prints partials of the audio as it arrives at real time."""

from __future__ import annotations

import numpy as np
import pytest

from audiomask.asr.checkpoint import load_model
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.constants import SAMPLE_RATE
from bench.pipe import (
    WAV_UNKNOWN_SIZE,
    first_partial_latency,
    peak_memory,
    speech_samples,
    wav_stream_header,
)

CLI_ARGUMENTS = ("--device", "cpu")
SHORT_S, LONG_S = 20.0, 80.0
# The peak RSS of the two runs differs by well under 1 MiB (measured); holding the 80 s input whole
# (float32 samples, their features) would add several MiB, and a copy per chunk far more.
RSS_MARGIN_BYTES = 32 * 2**20
LATENCY_TEST_S = 3.0  # audio written at real time
CHUNK_MS = 160


@pytest.fixture(scope="module")
def recognizer() -> StreamingRecognizer:
    """The command's recognizer: the shipped model at its default chunk and left context."""
    with StreamingRecognizer(load_model()) as recognizer:
        yield recognizer


def test_the_stream_header_says_unknown_length() -> None:
    header = wav_stream_header()
    assert len(header) == 44 and header.startswith(b"RIFF") and header[8:12] == b"WAVE"
    assert int.from_bytes(header[4:8], "little") == int.from_bytes(header[40:44], "little") == WAV_UNKNOWN_SIZE


def test_the_audio_is_full_scale_speech_of_the_length_asked() -> None:
    samples = speech_samples(12.5)
    assert samples.dtype == np.float32 and samples.shape == (round(12.5 * SAMPLE_RATE),)
    assert 0.25 < np.abs(samples).max() <= 1.0
    assert np.array_equal(speech_samples(5.0), samples[: 5 * SAMPLE_RATE])


def test_a_long_pipe_is_read_whole_in_the_memory_of_a_short_one(recognizer: StreamingRecognizer) -> None:
    short, long = peak_memory(SHORT_S, CLI_ARGUMENTS), peak_memory(LONG_S, CLI_ARGUMENTS)
    assert (short["duration_s"], long["duration_s"]) == (SHORT_S, LONG_S)
    assert long["text"] and long["text"] == recognizer.transcribe(speech_samples(LONG_S))
    assert abs(long["peak_rss_bytes"] - short["peak_rss_bytes"]) < RSS_MARGIN_BYTES, (short, long)


def test_partials_of_audio_written_at_real_time() -> None:
    run = first_partial_latency(CHUNK_MS, LATENCY_TEST_S, CLI_ARGUMENTS)
    with StreamingRecognizer(load_model(), chunk_ms=CHUNK_MS) as same_chunks:
        assert run["final_text"] == same_chunks.transcribe(speech_samples(LATENCY_TEST_S))
    audio_s = [audio for audio, _ in run["partials"]]
    assert audio_s and audio_s == sorted(set(audio_s)) and audio_s[-1] <= LATENCY_TEST_S
    assert all(run["final_text"].startswith(text) for text in run["texts_of_partials"])
    assert run["first_partial"]["audio_s"] == audio_s[0]
    assert run["first_partial"]["latency_chunks"] == pytest.approx(run["partials"][0][1] * 1000 / CHUNK_MS)
