"""audiomask.asr.recognizer: StreamingRecognizer's text equals greedy CTC decoding of the offline encoder outputs."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from audiomask.asr.decoding import GreedyCTCDecoder, greedy_decode
from audiomask.asr.model import ASRModel
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.errors import AudioError
from audiomask.features import Phi4MMFrontend, WhisperFrontend
from audiomask.models.ctc import CTCHead


def offline_text(model: ASRModel, samples: np.ndarray, chunk_size: int, left_chunk: int) -> str:
    return model.tokenizer.decode(offline_tokens(model, samples, chunk_size, left_chunk)[0])


def offline_tokens(
    model: ASRModel, samples: np.ndarray, chunk_size: int, left_chunk: int
) -> tuple[list[int], list[int]]:
    """Greedy CTC over the whole utterance's chunk-masked forward: the token ids and the output frame of each."""
    features = torch.from_numpy(Phi4MMFrontend()(samples))
    with torch.no_grad():
        outputs, lengths = model.encoder(
            features[None],
            [len(features)],
            chunk_size=chunk_size,
            left_chunk=left_chunk,
            mask_mode="hard",
        )
        best = model.head(outputs).argmax(dim=-1).numpy()
    ids, frames = GreedyCTCDecoder(1).push_best_at(best, lengths.numpy(), np.zeros(1, np.int64))
    return ids[0], frames[0]


@pytest.mark.parametrize(("chunk_ms", "left_chunks"), [(80, 0), (160, 1), (320, 4)])
def test_stream_text_equals_offline_greedy(model, noise, chunk_ms, left_chunks):
    samples = noise(chunk_ms, 21000)
    expected = offline_text(model, samples, chunk_ms // 80, left_chunks)
    assert len(expected) > 1
    with StreamingRecognizer(model, chunk_ms=chunk_ms, left_chunks=left_chunks) as recognizer:
        stream = recognizer.open_stream("s1")
        cuts = np.sort(np.random.default_rng(0).integers(0, len(samples), 9))
        partials, counts = [], []
        for piece in np.split(samples, cuts):
            stream.accept(piece)
            partials.append(stream.partial())
            counts.append(stream.token_count)
        text = stream.finish()
        assert text == expected
        assert all(expected.startswith(p) for p in partials)  # greedy CTC partials only grow
        # token_count grows exactly when the text does
        steps = list(zip(partials, counts))
        assert all((a != b) == (m != n) for (a, m), (b, n) in zip(steps, steps[1:])) and counts[-1] > 0
        assert stream.finish() == text  # idempotent
        assert recognizer.transcribe(samples) == expected


@pytest.mark.parametrize(
    "frontend",
    [
        {},
        {"frontend_process": True, "frontend_workers": 2},
        {"lanes": 3},
        {"lanes": 3, "frontend_process": True, "frontend_workers": 1},
    ],
    ids=["thread", "two-processes", "three-lanes", "three-lanes-one-process"],
)
def test_many_streams_interleaved(model, noise, frontend):
    signals = [noise(s, n) for s, n in zip(range(5), (9000, 17000, 4000, 12000, 600))]
    with StreamingRecognizer(model, chunk_ms=160, left_chunks=2, max_streams=3, **frontend) as recognizer:
        streams = [recognizer.open_stream(f"u{i}") for i in range(len(signals))]
        for position in range(0, 17000, 2500):
            for stream, samples in zip(streams, signals):
                if position < len(samples):
                    stream.accept(samples[position : position + 2500])
        first = streams[0].finish()  # u1 and u2 share its step and have not ended: it goes on without them
        for stream in streams[1:]:
            stream.input_finished()
        texts = [first, *(stream.finish() for stream in streams[1:])]
        assert recognizer.stats.cycles  # instrumentation recorded
        assert recognizer.max_wait_s * 1000 == 160 // recognizer.lanes  # by default a chunk among the lanes
    assert texts == [offline_text(model, s, 2, 2) for s in signals]


def test_transcribe_file(model, noise, tmp_path):
    samples = noise(3, 16000)
    path = tmp_path / "a.wav"
    sf.write(path, samples, 16000, subtype="FLOAT")
    with StreamingRecognizer(model, chunk_ms=240, left_chunks=1) as recognizer:
        assert recognizer.transcribe(path) == offline_text(model, samples, 3, 1)
        assert recognizer.chunk_ms == 240 and recognizer.left_chunks == 1


def test_errors(model, noise):
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
    with pytest.raises(ValueError, match="lanes must be <= 2"):
        StreamingRecognizer(model, chunk_ms=80, max_streams=2, lanes=3)  # a lane of no slot
    with pytest.raises(ValueError, match="lanes must be >= 1"):
        StreamingRecognizer(model, chunk_ms=80, lanes=0)
    with pytest.raises(ValueError, match="vocab_size"):
        ASRModel(model.encoder, CTCHead(16, 3), model.tokenizer)


def test_qwen3_asr_model_text_equals_offline_greedy(tiny_asr_model, noise):
    """An ASRModel over the Qwen3-ASR encoder streams with its family's front end and 1 s chunks; each stream's
    text equals the greedy decoding of the offline forward of its running-floor features."""
    model = tiny_asr_model(family="qwen3_asr")
    assert isinstance(model.frontend, WhisperFrontend)
    signals = [noise(seed, n) for seed, n in ((20, 150000), (21, 23000), (22, 5000))]
    offline = WhisperFrontend.qwen3_asr(floor="running")
    expected = []
    for samples in signals:
        with torch.no_grad():
            features = torch.from_numpy(offline(samples))[None]
            outputs, lengths = model.encoder(features, [offline.num_frames(len(samples))])
            expected.append(model.tokenizer.decode(greedy_decode(model.head(outputs), lengths.numpy())[0]))
    assert len(expected[0]) > 1  # the long one: varied text, across windows
    with StreamingRecognizer(model, max_streams=2) as recognizer:
        assert (recognizer.chunk_ms, recognizer.left_chunks) == (1000, None)
        streams = [recognizer.open_stream(f"q{i}") for i in range(len(signals))]
        for position in range(0, 150000, 7000):
            for stream, samples in zip(streams, signals):
                if position < len(samples):
                    stream.accept(samples[position : position + 7000])
        for stream in streams:
            stream.input_finished()
        assert [stream.finish() for stream in streams] == expected


def test_accept_many_queues_every_stream_and_reports_each_refusal(model, noise):
    signals = [noise(seed, 9000) for seed in range(3)]
    with StreamingRecognizer(model, chunk_ms=160, left_chunks=2, max_streams=3) as recognizer:
        streams = [recognizer.open_stream(f"u{i}") for i in range(3)]
        ended = recognizer.open_stream("ended")
        ended.finish()
        for position in range(0, 9000, 1500):
            pieces = [samples[position : position + 1500] for samples in signals]
            bad = np.full(4, np.nan, np.float32)
            errors = recognizer.accept_many([*zip(streams, pieces), (ended, pieces[0]), (streams[0], bad)])
            assert errors[:3] == [None, None, None]
            assert isinstance(errors[3], ValueError) and "ended" in str(errors[3])
            assert isinstance(errors[4], AudioError) and "u0" in str(errors[4])  # refused whole, nothing queued
        texts = [stream.finish() for stream in streams]
    assert texts == [offline_text(model, samples, 2, 2) for samples in signals]


def test_accept_many_ends_the_finished_streams_and_runs_their_last_chunks(model, noise):
    signals = [noise(seed, 9100) for seed in range(2)]
    with StreamingRecognizer(model, chunk_ms=160, left_chunks=2, max_streams=3) as recognizer:
        streams = [recognizer.open_stream(f"u{i}") for i in range(2)]
        silent = recognizer.open_stream("silent")
        recognizer.accept_many([(streams[0], signals[0][:5000]), (streams[1], signals[1][:5000])])
        assert not any(stream.finished or stream.done for stream in streams)
        errors = recognizer.accept_many([(streams[0], signals[0][5000:])], finished=[streams[0], silent])
        assert errors == [None] and streams[0].done and silent.done  # encoded to its end in this one call
        assert not streams[1].finished  # the others go on
        with pytest.raises(ValueError, match="'u0' has ended"):
            streams[0].accept(signals[0][:10])
        assert streams[0].finish() == offline_text(model, signals[0], 2, 2) and silent.finish() == ""
        recognizer.accept_many([(streams[1], signals[1][5000:])], finished=[streams[1]])
        assert streams[1].partial() == offline_text(model, signals[1], 2, 2)


def test_cancel_ends_a_stream_at_the_next_call_and_frees_its_slot(model, noise):
    speech = noise(5, 8000)
    with StreamingRecognizer(model, chunk_ms=160, left_chunks=2, max_streams=1) as recognizer:
        gone = recognizer.open_stream("gone")
        gone.accept(speech[:4000])
        text_so_far = gone.partial()
        gone.cancel()
        assert not gone.finished  # nothing runs on the caller's thread
        recognizer.poll()
        assert gone.finished and gone.partial().startswith(text_so_far)
        gone.cancel()  # again: nothing more to do
        after = recognizer.open_stream("after")  # the one slot is free again
        after.accept(speech)
        assert after.finish() == offline_text(model, speech, 2, 2)


def test_transcript_times_are_where_offline_greedy_ctc_emits_each_token(model, noise):
    samples = noise(4, 16000)
    with StreamingRecognizer(model, chunk_ms=160, left_chunks=2) as recognizer:
        stream = recognizer.open_stream("timed")
        for start in range(0, len(samples), 1234):
            stream.accept(samples[start : start + 1234])
            snapshot = stream.transcript()
            assert snapshot.text == stream.partial() == "".join(snapshot.tokens)
        text = stream.finish()
        transcript = stream.transcript()
    ids, frames = offline_tokens(model, samples, 2, 2)
    token_s = 160 / 2 / 1000  # chunk_ms / tokens per chunk of the tiny model (time_reduction 8)
    assert transcript.text == text == model.tokenizer.decode(ids) and len(ids) > 3
    assert transcript.tokens == tuple(model.tokenizer.decode([i]) for i in ids)
    assert transcript.times_s == pytest.approx([frame * token_s for frame in frames])


def test_a_default_cpu_recognizer_steps_lanes_of_one_width(model, noise):
    """Without ``lanes``, a CPU recognizer's slots form lanes of one width, rounded up to fill them (17 slots: 9
    lanes of 2): every step computes as many rows whichever lane its streams joined, and each text is the one
    the stream gives alone."""
    signals = [noise(seed, 5000 + 700 * seed) for seed in range(12)]
    rows: list[int] = []
    with StreamingRecognizer(model, chunk_ms=160, left_chunks=2, max_streams=17) as recognizer:
        assert (recognizer.lanes, recognizer.max_streams) == (9, 18)
        hook = recognizer.model.head.register_forward_hook(lambda module, args, output: rows.append(len(args[0])))
        try:
            streams = [recognizer.open_stream(f"u{i}") for i in range(len(signals))]
            for position in range(0, 13000, 1600):
                recognizer.accept_many([(s, x[position : position + 1600]) for s, x in zip(streams, signals)])
            texts = [stream.finish() for stream in streams]
        finally:
            hook.remove()
    assert set(rows) == {2}
    assert texts == [offline_text(model, samples, 2, 2) for samples in signals]
