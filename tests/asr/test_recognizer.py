"""audiomask.asr.recognizer: StreamingRecognizer's text equals greedy CTC decoding of the offline encoder outputs."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch
from encoder_models import tiny_phi4mm, torch_one_thread  # noqa: F401 (an autouse fixture)

from audiomask.asr.decoding import CharTokenizer, greedy_decode
from audiomask.asr.model import ASRModel
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.features import Phi4MMFrontend
from audiomask.models.ctc import CTCHead

ALPHABET = "abcdefgh "


@pytest.fixture(scope="module")
def model():
    tokenizer = CharTokenizer(ALPHABET)
    torch.manual_seed(1)
    encoder = tiny_phi4mm()
    head = CTCHead(16, tokenizer.vocab_size).eval()
    # The tiny random encoder's outputs barely move over time: centre and amplify them in the head,
    # so that the argmax changes from token to token and the texts are not a single character.
    features = torch.from_numpy(Phi4MMFrontend()(noise(100, 32000)))
    with torch.no_grad():
        outputs, _ = encoder(
            features[None],
            [len(features)],
            chunk_size=2,
            left_chunk=1,
            mask_mode="hard",
        )
        mean, spread = outputs[0].mean(0), outputs[0].std(0) + 1e-6
        head.proj.weight.copy_(head.proj.weight / spread * 3.0)
        head.proj.bias.copy_(-head.proj.weight @ mean)
    return ASRModel(encoder, head, tokenizer)


def noise(seed: int, n: int) -> np.ndarray:
    """Noise whose loudness jumps every 0.1 s (varied features, so the texts are not one character)."""
    rng = np.random.default_rng(seed)
    envelope = np.repeat(10.0 ** rng.uniform(-4, 0, n // 1600 + 1), 1600)[:n]
    return (envelope * rng.standard_normal(n)).astype(np.float32)


def offline_text(model: ASRModel, samples: np.ndarray, chunk_size: int, left_chunk: int) -> str:
    features = torch.from_numpy(Phi4MMFrontend()(samples))
    with torch.no_grad():
        outputs, lengths = model.encoder(
            features[None],
            [len(features)],
            chunk_size=chunk_size,
            left_chunk=left_chunk,
            mask_mode="hard",
        )
        ids = greedy_decode(model.head(outputs), lengths.numpy())[0]
    return model.tokenizer.decode(ids)


@pytest.mark.parametrize(("chunk_ms", "left_chunks"), [(80, 0), (160, 1), (320, 4)])
def test_stream_text_equals_offline_greedy(model, chunk_ms, left_chunks):
    samples = noise(chunk_ms, 21000)
    expected = offline_text(model, samples, chunk_ms // 80, left_chunks)
    assert len(expected) > 1
    with StreamingRecognizer(model, chunk_ms=chunk_ms, left_chunks=left_chunks) as recognizer:
        stream = recognizer.open_stream("s1")
        cuts = np.sort(np.random.default_rng(0).integers(0, len(samples), 9))
        partials = []
        for piece in np.split(samples, cuts):
            stream.accept(piece)
            partials.append(stream.partial())
        text = stream.finish()
        assert text == expected
        assert all(expected.startswith(p) for p in partials)  # greedy CTC partials only grow
        assert stream.finish() == text  # idempotent
        assert recognizer.transcribe(samples) == expected


@pytest.mark.parametrize("frontend_process", [False, True], ids=["thread", "process"])
def test_many_streams_interleaved(model, frontend_process):
    signals = [noise(s, n) for s, n in zip(range(5), (9000, 17000, 4000, 12000, 600))]
    with StreamingRecognizer(
        model, chunk_ms=160, left_chunks=2, max_streams=3, frontend_process=frontend_process
    ) as recognizer:
        streams = [recognizer.open_stream(f"u{i}") for i in range(len(signals))]
        for position in range(0, 17000, 2500):
            for stream, samples in zip(streams, signals):
                if position < len(samples):
                    stream.accept(samples[position : position + 2500])
        with pytest.raises(RuntimeError, match="u0"):
            streams[0].finish()  # u1 and u2 share its step and have not ended: the batch cannot advance
        for stream in streams:
            stream.input_finished()
        texts = [stream.finish() for stream in streams]
        assert recognizer.stats.cycles  # instrumentation recorded
    assert texts == [offline_text(model, s, 2, 2) for s in signals]


def test_transcribe_file(model, tmp_path):
    samples = noise(3, 16000)
    path = tmp_path / "a.wav"
    sf.write(path, samples, 16000, subtype="FLOAT")
    with StreamingRecognizer(model, chunk_ms=240, left_chunks=1) as recognizer:
        assert recognizer.transcribe(path) == offline_text(model, samples, 3, 1)
        assert recognizer.chunk_ms == 240 and recognizer.left_chunks == 1


def test_errors(model):
    with StreamingRecognizer(model, chunk_ms=80) as recognizer:
        stream = recognizer.open_stream("caller-7")
        stream.accept(noise(1, 3000))
        stream.finish()
        with pytest.raises(ValueError, match="caller-7"):
            stream.accept(noise(1, 10))
        with pytest.raises(ValueError, match="path_or_samples"):
            recognizer.transcribe(np.zeros((2, 10), np.float32))
    with pytest.raises(ValueError, match="chunk_ms"):
        StreamingRecognizer(model, chunk_ms=100)
    with pytest.raises(ValueError, match="chunk_ms"):
        StreamingRecognizer(model)  # the tiny config's chunk_size is full attention
    with pytest.raises(ValueError, match="model"):
        StreamingRecognizer(object(), chunk_ms=80)
    with pytest.raises(ValueError, match="vocab_size"):
        ASRModel(model.encoder, CTCHead(16, 3), model.tokenizer)
