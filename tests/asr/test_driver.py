"""audiomask.asr.driver: the driver's encoder outputs equal the offline ``hard``-masked forward; batch independence.

Tiny random Phi-4MM encoders on the CPU (see ``encoder_models``). Streams of
random lengths start at random cycles and share the slots of one batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from encoder_models import tiny_phi4mm, torch_one_thread  # noqa: F401 (an autouse fixture)

from audiomask.asr.decoding import greedy_decode
from audiomask.asr.driver import RunStats, StreamingDriver
from audiomask.features import Phi4MMFrontend
from audiomask.models.ctc import CTCHead

TOLERANCE = 1e-4  # float32 on CPU
CHUNKINGS = [(1, 0), (2, 1), (3, 2), (4, 100)]  # (chunk_size tokens, left_chunk chunks)
VOCAB = 7


@pytest.fixture(scope="module")
def encoder():
    return tiny_phi4mm()


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(0)
    return CTCHead(16, VOCAB).eval()


def signals(seed: int, count: int, low: int = 400, high: int = 16000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(int(n))).astype(np.float32) for n in rng.integers(low, high, count)]


def offline(encoder, samples: np.ndarray, chunk_size: int, left_chunk: int) -> torch.Tensor:
    """The whole-utterance ``hard``-masked forward of the offline features: ``(L, D)``."""
    features = torch.from_numpy(Phi4MMFrontend()(samples))
    with torch.no_grad():
        outputs, lengths = encoder(
            features[None],
            [len(features)],
            chunk_size=chunk_size,
            left_chunk=left_chunk,
            mask_mode="hard",
        )
    return outputs[0, : int(lengths[0])]


def joined(stream) -> torch.Tensor:
    return torch.cat(stream.outputs) if stream.outputs else torch.zeros(0, 16)


@pytest.mark.parametrize(("chunk_size", "left_chunk"), CHUNKINGS)
def test_single_stream_equals_offline(encoder, head, chunk_size, left_chunk):
    for samples in signals(chunk_size, 2, high=24000):
        driver = StreamingDriver(
            encoder,
            head,
            chunk_size=chunk_size,
            left_chunk=left_chunk,
            keep_outputs=True,
        )
        (stream,) = driver.run([samples])
        driver.close()
        reference = offline(encoder, samples, chunk_size, left_chunk)
        outputs = joined(stream)
        assert outputs.shape == reference.shape
        assert (outputs - reference).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize(("chunk_size", "left_chunk"), CHUNKINGS)
def test_batched_streams_with_offsets_equal_offline(encoder, head, chunk_size, left_chunk):
    """More streams than slots: slots are freed and reused mid-run, streams start at random cycles."""
    batch = signals(10 + chunk_size, 9)
    starts = np.random.default_rng(chunk_size).integers(0, 6, len(batch)).tolist()
    driver = StreamingDriver(
        encoder,
        head,
        batch_size=4,
        chunk_size=chunk_size,
        left_chunk=left_chunk,
        keep_outputs=True,
    )
    streams = driver.run(batch, starts)
    driver.close()
    assert all(s.done for s in streams)
    for samples, stream in zip(batch, streams):
        reference = offline(encoder, samples, chunk_size, left_chunk)
        outputs = joined(stream)
        assert outputs.shape == reference.shape, stream.name
        assert (outputs - reference).abs().max().item() <= TOLERANCE, stream.name
        ids = greedy_decode(head(reference)[None])[0]
        assert stream.ids == ids, stream.name


def test_batch_independence(encoder, head):
    """The same stream alone and inside a batch of many streams of random lengths and start offsets."""
    target = signals(99, 1, 12000, 12001)[0]
    alone = StreamingDriver(encoder, head, chunk_size=2, left_chunk=1, keep_outputs=True)
    (single,) = alone.run([target])
    alone.close()
    others = signals(5, 63, 400, 20000)
    rng = np.random.default_rng(5)
    starts = [*rng.integers(0, 4, len(others)).tolist(), 2]
    crowd = StreamingDriver(  # issue 5: a batch of 64 streams
        encoder, head, batch_size=64, chunk_size=2, left_chunk=1, keep_outputs=True
    )
    streams = crowd.run([*others, target], starts)
    crowd.close()
    assert streams[-1].tokens == single.tokens
    assert (joined(streams[-1]) - joined(single)).abs().max().item() <= 1e-5
    assert streams[-1].ids == single.ids


def test_serial_mode_equals_pipelined_on_a_thread_and_in_a_process(encoder, head):
    batch = signals(3, 5)
    results = []
    for overlap, frontend_process in ((False, False), (True, False), (True, True)):
        driver = StreamingDriver(
            encoder,
            head,
            batch_size=3,
            chunk_size=2,
            left_chunk=1,
            keep_outputs=True,
            overlap=overlap,
            frontend_process=frontend_process,
        )
        try:
            results.append(driver.run(batch, [0, 1, 2, 0, 3]))
            cpu_s = driver.stats.cpu_s
        finally:
            driver.close()
        assert cpu_s > 0  # the front end's time is counted wherever it ran
    serial, threaded, in_process = results
    for one, other, third in zip(serial, threaded, in_process):
        assert torch.equal(joined(one), joined(other)) and torch.equal(joined(one), joined(third))
        assert one.ids == other.ids == third.ids and one.tokens == other.tokens == third.tokens


def test_instrumentation(encoder, head):
    driver = StreamingDriver(encoder, head, batch_size=2, chunk_size=2, left_chunk=1)
    streams = driver.run(signals(4, 3))
    driver.close()
    stats = driver.stats
    assert len(stats.cycles) >= max(s.tokens for s in streams) // 2
    assert [c.cycle for c in stats.cycles] == list(range(len(stats.cycles)))
    for c in stats.cycles:
        assert c.cpu_s >= 0 and c.enqueue_s >= 0 and c.encode_s >= 0 and c.wait_s >= 0 and 1 <= c.streams <= 2
    assert stats.wall_s > 0 and stats.cpu_s > 0 and stats.gpu_s > 0
    assert stats.overlap() <= 1.0 + 1e-9 or stats.cpu_s + stats.gpu_s > stats.wall_s


def test_stats_stay_bounded_and_totals_count_every_cycle():
    """A driver running for days keeps the recent timings only; the totals still cover every cycle."""
    from audiomask.asr.driver import RECENT_CYCLES, CycleTiming

    stats = RunStats()
    for cycle in range(RECENT_CYCLES + 10):
        stats.record(CycleTiming(cycle, 3, cpu_s=1.0, enqueue_s=0.0, encode_s=0.0, wait_s=0.0))
    stats.set_encode(RECENT_CYCLES + 9, 2.0)  # read one cycle later, as CUDA events are
    stats.set_encode(0, 5.0)  # dropped already: no effect
    assert len(stats.cycles) == RECENT_CYCLES and stats.cycles[0].cycle == 10
    assert (stats.count, stats.chunks) == (RECENT_CYCLES + 10, 3 * (RECENT_CYCLES + 10))
    assert stats.cpu_s == RECENT_CYCLES + 10 and stats.gpu_s == 2.0
    assert [c.cycle for c in stats.since(RECENT_CYCLES + 8)] == [RECENT_CYCLES + 8, RECENT_CYCLES + 9]


def test_overlap_formula():
    from audiomask.asr.driver import CycleTiming

    stats = RunStats([CycleTiming(0, 1, 2.0, 0.1, 3.0, 0.0)], wall_s=3.5)
    assert stats.overlap() == pytest.approx((2.0 + 3.0 - 3.5) / 2.0)
    assert RunStats().overlap() == 0.0


def test_live_feeding_in_odd_pieces(encoder, head):
    """Samples arriving in arbitrary pieces give the same outputs as the whole signal."""
    samples = signals(8, 1, 15000, 15001)[0]
    driver = StreamingDriver(encoder, head, chunk_size=2, left_chunk=1, keep_outputs=True)
    stream = driver.open("live")
    cuts = np.sort(np.random.default_rng(8).integers(0, len(samples), 12))
    for piece in np.split(samples, cuts):
        driver.feed(stream, piece)
        driver.advance()
    driver.end(stream)
    driver.advance()
    driver.close()
    assert stream.done
    reference = offline(encoder, samples, 2, 1)
    assert (joined(stream) - reference).abs().max().item() <= TOLERANCE
    with pytest.raises(ValueError, match="live"):
        driver.feed(stream, samples)


def test_bad_arguments(encoder, head):
    with pytest.raises(ValueError, match="encoder"):
        StreamingDriver(head, head)
    with pytest.raises(ValueError, match="batch_size"):
        StreamingDriver(encoder, head, batch_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        StreamingDriver(encoder, head)
    with pytest.raises(ValueError, match="frontend_process=True needs overlap=True"):
        StreamingDriver(encoder, head, chunk_size=2, overlap=False, frontend_process=True)
    driver = StreamingDriver(encoder, head, chunk_size=2)
    with pytest.raises(ValueError, match="starts"):
        driver.run(signals(1, 2), [0])
    driver.close()
