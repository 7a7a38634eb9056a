"""audiomask.asr.outputs: a stream's encoder output chunks, delivered by the driver and the recognizer.

The contract of the module docstring: in order, exactly once, the last flagged
final, concatenating to the offline forward; independent of the batch; a slow
consumer fails its own stream only; nothing kept after the end. Tiny random
Phi-4MM and Qwen3-ASR encoders on the CPU (one GPU test: where embeddings live).
"""

from __future__ import annotations

import copy
import gc
import threading
import weakref

import numpy as np
import pytest
import torch

from audiomask.asr.driver import StreamingDriver
from audiomask.asr.outputs import ChunkQueue, EncoderChunk, OutputError
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.features import WhisperFrontend
from audiomask.streaming import Phi4MMSlots, open_slots

TOLERANCE = 1e-4  # float32 on CPU, as the driver's outputs
CHUNK_SIZE, LEFT_CHUNK = 2, 1  # the Phi-4MM driver's chunking: 2 tokens per chunk


def offline(family: str, encoder, samples: np.ndarray, offline_outputs) -> torch.Tensor:
    """``(L, D)``: the whole-utterance forward that a stream's outputs equal."""
    if family == "phi4mm":
        return offline_outputs(encoder, samples, CHUNK_SIZE, LEFT_CHUNK)
    frontend = WhisperFrontend.qwen3_asr(floor="running")  # what a stream's front end computes
    with torch.no_grad():
        outputs, lengths = encoder(torch.from_numpy(frontend(samples))[None], [frontend.num_frames(len(samples))])
    return outputs[0, : int(lengths[0])]


@pytest.fixture(params=["phi4mm", "qwen3_asr"])
def family(request) -> str:
    return request.param


@pytest.fixture
def family_encoder(family, encoder, tiny_qwen3_asr):
    return encoder if family == "phi4mm" else tiny_qwen3_asr()


def family_driver(family: str, encoder, head, batch_size: int, **options) -> StreamingDriver:
    if family == "phi4mm":
        return StreamingDriver(Phi4MMSlots(encoder, batch_size, CHUNK_SIZE, LEFT_CHUNK), head, **options)
    return StreamingDriver(open_slots(encoder, batch_size=batch_size), head, **options)


def check_sequence(chunks: list[EncoderChunk], name: str) -> None:
    """In order, each token exactly once, exactly one final chunk and it comes last."""
    assert chunks, name
    assert all(chunk.stream == name for chunk in chunks)
    assert [chunk.start for chunk in chunks] == [0, *(chunk.stop for chunk in chunks[:-1])]
    assert [chunk.final for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all(len(chunk) > 0 for chunk in chunks[:-1])  # only the final chunk may be empty
    assert all(chunk.times_ms.shape == (len(chunk),) for chunk in chunks)


def joined(chunks: list[EncoderChunk]) -> torch.Tensor:
    return torch.cat([chunk.embeddings for chunk in chunks])


def live_run(driver: StreamingDriver, signals: list[np.ndarray], piece: int, **open_options) -> list:
    """Feed every signal in pieces of ``piece`` samples, round-robin, advancing after each round; then end."""
    streams = [driver.open(f"s{i}", **open_options) for i in range(len(signals))]
    for position in range(0, max(len(s) for s in signals), piece):
        for stream, samples in zip(streams, signals):
            if position < len(samples):
                driver.feed(stream, samples[position : position + piece])
        driver.advance()
    for stream in streams:
        driver.end(stream)
    driver.advance()
    return streams


def test_chunks_are_in_order_exactly_once_and_equal_the_offline_forward(
    family, family_encoder, head, random_signals, offline_outputs
):
    """Live streams sharing a batch, fed in pieces: the callback and the queue see the same chunks, which join
    to the offline forward; token times follow the chunks (Phi-4MM: 10 ms * time_reduction per token;
    Qwen3-ASR: 1 s per conv chunk of 13 tokens, 80 ms apart)."""
    signals = [*random_signals(31, 2, 3000, 40000), random_signals(32, 1, 150000, 150001)[0]]
    seen: dict[str, list[EncoderChunk]] = {f"s{i}": [] for i in range(len(signals))}

    def on_output(chunk: EncoderChunk) -> None:
        seen[chunk.stream].append(chunk)

    driver = family_driver(family, family_encoder, head, 2)
    streams = live_run(driver, signals, 7000, outputs=True, on_output=on_output, max_pending=None)
    driver.close()
    for samples, stream in zip(signals, streams):
        chunks = stream.chunks.take()
        assert chunks == seen[stream.name]  # the same objects, in the same order
        check_sequence(chunks, stream.name)
        reference = offline(family, family_encoder, samples, offline_outputs)
        assert chunks[-1].stop == stream.tokens == len(reference)
        assert (joined(chunks) - reference).abs().max().item() <= TOLERANCE, stream.name
        tokens = np.arange(stream.tokens)
        if family == "phi4mm":
            expected_ms = tokens * 10.0 * family_encoder.config.time_reduction
        else:
            expected_ms = tokens // 13 * 1000.0 + tokens % 13 * 80.0
        np.testing.assert_array_equal(np.concatenate([chunk.times_ms for chunk in chunks]), expected_ms)
    assert max(len(seen[name]) for name in seen) > 1  # the long one spans chunks (Qwen3-ASR: windows of 8 s)


def test_a_streams_chunks_do_not_depend_on_its_batch(family, family_encoder, head, random_signals):
    target = random_signals(41, 1, 30000, 30001)[0]
    alone = family_driver(family, family_encoder, head, 1, keep_outputs=True)
    (single,) = alone.run([target])
    alone.close()
    crowd = family_driver(family, family_encoder, head, 4, keep_outputs=True)
    streams = crowd.run([*random_signals(42, 5, 400, 60000), target], [0, 0, 1, 2, 3, 2])
    crowd.close()
    ours, theirs = single.chunks.take(), streams[-1].chunks.take()
    assert [(c.start, len(c), c.final) for c in ours] == [(c.start, len(c), c.final) for c in theirs]
    assert (joined(ours) - joined(theirs)).abs().max().item() <= 1e-5


def test_a_slow_consumer_fails_its_own_stream_only(encoder, head, random_signals):
    """A queue of 2 that nobody reads overflows at its third chunk: its consumer gets the 2, then the error, and
    the stream refuses samples; its text and the other stream's chunks go on as if nothing happened."""
    slow_samples, other_samples = random_signals(51, 2, 20000, 20001)
    reference = family_driver("phi4mm", encoder, head, 2, keep_outputs=True)
    expected = reference.run([slow_samples, other_samples])
    reference.close()
    driver = family_driver("phi4mm", encoder, head, 2)
    slow = driver.open("slow", outputs=True, max_pending=2)
    other = driver.open("other", outputs=True)
    taken: list[EncoderChunk] = []
    for position in range(0, len(slow_samples), 4000):
        for stream, samples in ((slow, slow_samples), (other, other_samples)):
            if not (stream is slow and slow.chunks.error is not None):
                driver.feed(stream, samples[position : position + 4000])
        driver.advance()
        taken += other.chunks.take()  # the other consumer keeps up
    with pytest.raises(OutputError, match=r"'slow'.*max_pending=2"):
        driver.feed(slow, slow_samples[:10])
    for stream in (slow, other):
        driver.end(stream)
    driver.advance()
    driver.close()
    taken += other.chunks.take()
    held = [slow.chunks.get(timeout=0), slow.chunks.get(timeout=0)]
    assert [chunk.start for chunk in held] == [0, CHUNK_SIZE]
    with pytest.raises(OutputError, match="max_pending=2"):
        slow.chunks.get(timeout=0)
    assert slow.done and slow.ids == expected[0].ids[: len(slow.ids)] and slow.ids
    check_sequence(taken, "other")
    assert torch.equal(joined(taken), torch.cat(expected[1].outputs))


def test_an_on_output_that_raises_fails_that_stream_only(encoder, head, random_signals):
    signals = random_signals(61, 2, 9000, 9001)

    def broken(chunk: EncoderChunk) -> None:
        raise KeyError("decoder gone")

    driver = family_driver("phi4mm", encoder, head, 2)
    bad = driver.open("bad", on_output=broken, outputs=True)
    good = driver.open("good", outputs=True)
    for stream, samples in zip((bad, good), signals):
        driver.feed(stream, samples)
        driver.end(stream)
    driver.advance()
    driver.close()
    with pytest.raises(OutputError, match="on_output of stream 'bad' raised KeyError") as raised:
        bad.chunks.get(timeout=0)
    assert isinstance(raised.value.__cause__, KeyError)
    check_sequence(good.chunks.take(), "good")
    assert bad.done and good.done


def test_nothing_is_kept_after_the_final_chunk(encoder, head, random_signals):
    driver = family_driver("phi4mm", encoder, head, 2)
    stream = driver.open("s", outputs=True)
    driver.feed(stream, random_signals(71, 1, 9000, 9001)[0])
    driver.end(stream)
    driver.advance()
    chunks = list(stream.chunks)  # ends after the final chunk
    assert chunks[-1].final and len(stream.chunks) == 0
    references = [weakref.ref(chunk) for chunk in chunks]
    del chunks
    gc.collect()
    assert all(reference() is None for reference in references)  # neither the driver nor the queue keeps them
    with pytest.raises(EOFError, match="final chunk was taken"):
        stream.chunks.get(timeout=0)
    driver.close()


def test_chunk_queue_waits_and_reports():
    queue = ChunkQueue("q", max_pending=1)
    with pytest.raises(TimeoutError, match="'q' within 0.01 s"):
        queue.get(timeout=0.01)
    chunk = EncoderChunk("q", 0, torch.zeros(0, 4), np.zeros(0), final=True)
    threading.Timer(0.05, queue.deliver, [chunk]).start()
    assert queue.get(timeout=10) is chunk  # woken by the delivery
    assert queue.finished and queue.delivered == 1
    queue.deliver(chunk)  # after the final one: ignored
    assert len(queue) == 0
    for bad, message in (({"max_pending": -1}, "max_pending"), ({"on_output": 3}, "on_output must be callable")):
        with pytest.raises(ValueError, match=message):
            ChunkQueue("q", **bad)
    with pytest.raises(ValueError, match="max_pending=0 keeps no chunk"):
        ChunkQueue("q", max_pending=0)


def test_device_embeddings_stay_on_the_encoder_device(encoder, head, random_signals):
    samples = random_signals(81, 1, 9000, 9001)[0]
    results = []
    for place in ("host", "device"):
        driver = family_driver("phi4mm", encoder, head, 1, keep_outputs=True, outputs_on=place)
        (stream,) = driver.run([samples])
        driver.close()
        results.append(stream.chunks.take())
    host, device = results
    assert all(chunk.embeddings.device == driver.device for chunk in device)
    assert torch.equal(joined(host), joined(device))
    with pytest.raises(ValueError, match="outputs_on must be one of"):
        family_driver("phi4mm", encoder, head, 1, outputs_on="gpu")


def test_recognizer_streams_outputs_to_a_consumer_thread(tiny_asr_model, noise):
    """A consumer thread iterates a stream's outputs while the main thread accepts audio: it gets every token of
    the stream in order, and the text is the text of a stream without outputs."""
    model = tiny_asr_model()
    samples = noise(91, 30000)
    with StreamingRecognizer(model, chunk_ms=160, left_chunks=2, max_streams=2) as recognizer:
        expected = recognizer.transcribe(samples)
        stream = recognizer.open_stream("caller", outputs=True, max_pending=None)
        received: list[EncoderChunk] = []
        consumer = threading.Thread(target=lambda: received.extend(stream.outputs()))
        consumer.start()
        for position in range(0, len(samples), 3000):
            stream.accept(samples[position : position + 3000])
        text = stream.finish()
        consumer.join(timeout=60)
        assert not consumer.is_alive()
        plain = recognizer.open_stream("plain")
        with pytest.raises(ValueError, match="'plain' was opened without outputs=True"):
            plain.outputs()
    assert text == expected
    check_sequence(received, "caller")
    assert received[-1].stop == -(-model.frontend.num_frames(len(samples)) // model.encoder.config.time_reduction)


def test_a_recognizer_that_stops_fails_the_unfinished_queues(tiny_asr_model, noise, monkeypatch):
    model = tiny_asr_model(seed=1)
    with StreamingRecognizer(model, chunk_ms=80, overlap=False) as recognizer:
        stream = recognizer.open_stream("caller", outputs=True)
        stream.accept(noise(92, 4000))
        held = len(stream.outputs())
        monkeypatch.setattr(model.head, "forward", lambda *args: (_ for _ in ()).throw(RuntimeError("device fault")))
        with pytest.raises(RuntimeError, match="device fault"):
            stream.accept(noise(93, 4000))
        chunks = stream.outputs()
        assert [chunks.get(timeout=0) for _ in range(held)]
        with pytest.raises(OutputError, match="'caller' will get no more chunks.*device fault"):
            chunks.get(timeout=0)


@pytest.mark.gpu
def test_cuda_outputs_are_pinned_on_the_host_or_left_on_the_device(
    encoder, head, random_signals, offline_outputs, monkeypatch
):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    samples = random_signals(95, 1, 20000, 20001)[0]
    reference = offline_outputs(encoder, samples, CHUNK_SIZE, LEFT_CHUNK)
    cuda_encoder, cuda_head = copy.deepcopy(encoder).to("cuda"), copy.deepcopy(head).to("cuda")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # float32 must mean float32 here
    for place, device in (("host", "cpu"), ("device", "cuda")):
        driver = family_driver("phi4mm", cuda_encoder, cuda_head, 2, keep_outputs=True, outputs_on=place)
        (stream,) = driver.run([samples])
        driver.close()
        chunks = stream.chunks.take()
        check_sequence(chunks, stream.name)
        assert all(chunk.embeddings.device.type == device for chunk in chunks)
        assert all(chunk.embeddings.is_pinned() for chunk in chunks) == (place == "host")
        assert (joined(chunks).cpu() - reference).abs().max().item() <= TOLERANCE
