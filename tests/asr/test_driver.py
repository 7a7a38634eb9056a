"""audiomask.asr.driver: the driver's encoder outputs equal the offline ``hard``-masked forward; batch independence.

Tiny random Phi-4MM encoders on the CPU. Streams of random lengths start at
random cycles and share the slots of one batch.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from audiomask.asr.decoding import greedy_decode
from audiomask.asr.driver import RECENT_CYCLES, CycleTiming, RunStats, StreamingDriver
from audiomask.features import WhisperFrontend
from audiomask.models.ctc import CTCHead
from audiomask.streaming import Phi4MMSlots, open_slots

TOLERANCE = 1e-4  # float32 on CPU


def driver_of(encoder, head, batch_size: int = 1, chunk_size: int = 2, left_chunk: int = 1, **options):
    """A driver over ``batch_size`` Phi-4MM slots."""
    return StreamingDriver(Phi4MMSlots(encoder, batch_size, chunk_size, left_chunk), head, **options)


def test_single_stream_equals_offline(encoder, head, chunking, random_signals, offline_outputs, joined_outputs):
    chunk_size, left_chunk = chunking
    for samples in random_signals(chunk_size, 2, high=24000):
        driver = driver_of(encoder, head, 1, chunk_size, left_chunk, keep_outputs=True)
        (stream,) = driver.run([samples])
        driver.close()
        reference = offline_outputs(encoder, samples, chunk_size, left_chunk)
        outputs = joined_outputs(stream)
        assert outputs.shape == reference.shape
        assert (outputs - reference).abs().max().item() <= TOLERANCE


def test_batched_streams_with_offsets_equal_offline(
    encoder, head, chunking, random_signals, offline_outputs, joined_outputs
):
    """More streams than slots: slots are freed and reused mid-run, streams start at random cycles."""
    chunk_size, left_chunk = chunking
    batch = random_signals(10 + chunk_size, 9)
    starts = np.random.default_rng(chunk_size).integers(0, 6, len(batch)).tolist()
    driver = driver_of(encoder, head, 4, chunk_size, left_chunk, keep_outputs=True)
    streams = driver.run(batch, starts)
    driver.close()
    assert all(s.done for s in streams)
    for samples, stream in zip(batch, streams):
        reference = offline_outputs(encoder, samples, chunk_size, left_chunk)
        outputs = joined_outputs(stream)
        assert outputs.shape == reference.shape, stream.name
        assert (outputs - reference).abs().max().item() <= TOLERANCE, stream.name
        ids = greedy_decode(head(reference)[None])[0]
        assert stream.ids == ids, stream.name


def test_batch_independence(encoder, head, random_signals, joined_outputs):
    """The same stream alone and inside a batch of 64 streams of random lengths and start offsets."""
    target = random_signals(99, 1, 12000, 12001)[0]
    alone = driver_of(encoder, head, keep_outputs=True)
    (single,) = alone.run([target])
    alone.close()
    others = random_signals(5, 63, 400, 20000)
    rng = np.random.default_rng(5)
    starts = [*rng.integers(0, 4, len(others)).tolist(), 2]
    crowd = driver_of(encoder, head, 64, keep_outputs=True)
    streams = crowd.run([*others, target], starts)
    crowd.close()
    assert streams[-1].tokens == single.tokens
    assert (joined_outputs(streams[-1]) - joined_outputs(single)).abs().max().item() <= 1e-5
    assert streams[-1].ids == single.ids


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-processes"])
def test_serial_mode_equals_pipelined_on_a_thread_and_in_processes(
    encoder, head, random_signals, joined_outputs, workers
):
    """Bit for bit, whoever computes the features: in line, a thread, one process, or two processes sharing
    the 3 slots unevenly; streams start and end mid-run and take the slots freed."""
    batch = random_signals(3, 5)
    results = []
    modes = ({"overlap": False}, {}, {"frontend_process": True, "frontend_workers": workers})
    for options in modes:
        driver = driver_of(encoder, head, 3, keep_outputs=True, **options)
        try:
            results.append(driver.run(batch, [0, 1, 2, 0, 3]))
            stats = driver.stats
        finally:
            driver.close()
        assert driver.frontend_workers == (workers if "frontend_workers" in options else 0)
        assert stats.cpu_s > 0 and stats.frontend_cpu_s > 0  # the front end's time is counted wherever it ran
    serial, threaded, in_processes = results
    for one, other, third in zip(serial, threaded, in_processes):
        assert torch.equal(joined_outputs(one), joined_outputs(other))
        assert torch.equal(joined_outputs(one), joined_outputs(third))
        assert one.ids == other.ids == third.ids and one.tokens == other.tokens == third.tokens


def test_instrumentation(encoder, head, random_signals):
    driver = driver_of(encoder, head, 2)
    signals = random_signals(4, 3)
    streams = driver.run(signals)
    driver.close()
    stats = driver.stats
    assert len(stats.cycles) >= max(s.tokens for s in streams) // 2
    assert [c.cycle for c in stats.cycles] == list(range(len(stats.cycles)))
    for c in stats.cycles:
        assert c.cpu_s >= 0 and c.enqueue_s >= 0 and c.encode_s >= 0 and c.wait_s >= 0 and 1 <= c.streams <= 2
        assert c.frontend_cpu_s >= 0 and c.host_cpu_s >= 0 and c.enqueue_cpu_s >= 0
        assert 0 < c.step_cpu_s <= c.enqueue_cpu_s  # on the CPU the step is computed inside the enqueue
    assert stats.wall_s > 0 and stats.cpu_s > 0 and stats.gpu_s > 0
    assert stats.overlap() <= 1.0 + 1e-9 or stats.cpu_s + stats.gpu_s > stats.wall_s
    # Every sample fed went through one cycle's block: the audio the per-stage costs are divided by.
    assert stats.audio_s == pytest.approx(sum(len(s) for s in signals) / 16000)
    costs = stats.cpu_per_audio_s()
    assert list(costs) == ["frontend", "feed", "host", "enqueue"]
    assert all(cost > 0 for cost in costs.values())
    assert costs["host"] == pytest.approx(stats.host_cpu_s / stats.audio_s)


class _SpinningEvent:
    """A CUDA event's stand-in whose ``synchronize`` spins the CPU, as the CUDA runtime does while it waits."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def synchronize(self) -> None:
        started = time.thread_time()
        while time.thread_time() - started < self.seconds:
            pass

    def elapsed_time(self, end: object) -> float:
        return 0.0


def test_the_host_cost_of_a_cycle_leaves_out_the_wait_for_the_device(encoder, head, random_signals, monkeypatch):
    """A thread spinning on the device's event is waiting, not working: that CPU counts as the cycle's wait."""
    spin_s = 0.05
    encode = StreamingDriver._encode

    def on_a_spinning_device(self, plan):
        record = encode(self, plan)
        record.done, record.events = _SpinningEvent(spin_s), (_SpinningEvent(0.0), _SpinningEvent(0.0))
        return record

    monkeypatch.setattr(StreamingDriver, "_encode", on_a_spinning_device)
    driver = driver_of(encoder, head, 2)
    driver.run(random_signals(4, 2))
    driver.close()
    cycles = driver.stats.cycles
    assert len(cycles) >= 2
    assert sum(cycle.wait_s for cycle in cycles) >= len(cycles) * spin_s  # every cycle's results were waited for
    assert all(cycle.host_cpu_s < spin_s for cycle in cycles)


def test_stats_stay_bounded_and_totals_count_every_cycle():
    """A driver running for days keeps the recent timings only; the totals still cover every cycle."""
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
    stats = RunStats([CycleTiming(0, 1, 2.0, 0.1, 3.0, 0.0)], wall_s=3.5)
    assert stats.overlap() == pytest.approx((2.0 + 3.0 - 3.5) / 2.0)
    assert RunStats().overlap() == 0.0


def test_live_feeding_in_odd_pieces(encoder, head, random_signals, offline_outputs, joined_outputs):
    """Samples arriving in arbitrary pieces give the same outputs as the whole signal."""
    samples = random_signals(8, 1, 15000, 15001)[0]
    driver = driver_of(encoder, head, keep_outputs=True)
    stream = driver.open("live")
    cuts = np.sort(np.random.default_rng(8).integers(0, len(samples), 12))
    for piece in np.split(samples, cuts):
        driver.feed(stream, piece)
        driver.advance()
    driver.end(stream)
    driver.advance()
    driver.close()
    assert stream.done
    reference = offline_outputs(encoder, samples, 2, 1)
    assert (joined_outputs(stream) - reference).abs().max().item() <= TOLERANCE
    with pytest.raises(ValueError, match="live"):
        driver.feed(stream, samples)


@pytest.mark.parametrize("max_wait_s", [None, 0.0], ids=["full-cycles", "ready-only"])
def test_streams_that_pause_equal_offline_whether_cycles_wait_for_them_or_not(
    encoder, head, random_signals, offline_outputs, joined_outputs, max_wait_s
):
    """Streams fed in random pieces with pauses: full cycles wait for every occupied slot; ready-only cycles
    (``advance(max_wait_s=0)``) leave a paused slot out, which goes on where it stopped. Either way each
    stream's outputs equal its offline forward, and the stats count the cycles that left slots out."""
    signals = random_signals(21, 4, 6000, 20000)
    driver = driver_of(encoder, head, 3, keep_outputs=True)
    streams = [driver.open(f"s{index}") for index in range(len(signals))]
    rng = np.random.default_rng(21)
    sent = [0] * len(signals)
    while not all(stream.ended for stream in streams):
        for number, (stream, samples) in enumerate(zip(streams, signals)):
            if stream.ended or rng.random() < 0.5:  # a pause
                continue
            piece = int(rng.integers(0, 2 * driver.block_samples))
            driver.feed(stream, samples[sent[number] : sent[number] + piece])
            sent[number] += piece
            if sent[number] >= len(samples):
                driver.end(stream)
        driver.advance(max_wait_s=max_wait_s)
    driver.advance(max_wait_s=max_wait_s)
    driver.close()
    assert all(stream.done for stream in streams)
    for samples, stream in zip(signals, streams):
        reference = offline_outputs(encoder, samples, 2, 1)
        assert joined_outputs(stream).shape == reference.shape, stream.name
        assert (joined_outputs(stream) - reference).abs().max().item() <= TOLERANCE, stream.name
        assert stream.ids == greedy_decode(head(reference)[None])[0], stream.name
    stats = driver.stats
    assert (stats.partial > 0) == (max_wait_s is not None) and (stats.skipped > 0) == (stats.partial > 0)
    assert stats.partial == sum(timing.skipped > 0 for timing in stats.cycles)


@pytest.mark.parametrize("family", ["phi4mm", "qwen3_asr"])
@pytest.mark.parametrize(
    "options", [{}, {"frontend_process": True, "frontend_workers": 2}], ids=["thread", "processes"]
)
def test_lanes_give_each_stream_what_one_stream_of_all_the_slots_gives(
    encoder, tiny_qwen3_asr, head, random_signals, joined_outputs, family, options
):
    """Lanes of 3, 2 and 2 slots: each cycle steps one lane, and every stream's outputs and ids equal those of
    the same streams in one batch of 7 slots (streams start at random cycles and reuse freed slots)."""
    phi4mm = family == "phi4mm"
    model = encoder if phi4mm else tiny_qwen3_asr()

    def opened(batch_size: int):
        return Phi4MMSlots(model, batch_size, 2, 1) if phi4mm else open_slots(model, batch_size=batch_size)

    batch = random_signals(13, 11, 400, 30000 if phi4mm else 60000)
    starts = np.random.default_rng(13).integers(0, 5, len(batch)).tolist()
    results, cycles = [], []
    for slots in (opened(7), [opened(3), opened(2), opened(2)]):
        driver = StreamingDriver(slots, head, keep_outputs=True, **options)
        try:
            results.append(driver.run(batch, starts))
            cycles.append(driver.stats.count)
        finally:
            driver.close()
    one, laned = results
    assert cycles[1] > cycles[0]  # a cycle steps one lane
    for alone, in_lane in zip(one, laned):
        assert in_lane.done and in_lane.tokens == alone.tokens and in_lane.ids == alone.ids, alone.name
        assert (joined_outputs(in_lane) - joined_outputs(alone)).abs().max().item() <= 1e-5, alone.name


def test_bad_arguments(encoder, head, random_signals):
    slots = Phi4MMSlots(encoder, chunk_size=2)
    with pytest.raises(ValueError, match="slots must be an EncoderSlots"):
        StreamingDriver(encoder, head)
    with pytest.raises(ValueError, match="head must be a CTCHead"):
        StreamingDriver(slots, encoder)
    with pytest.raises(ValueError, match=r"head input_size \(8\) must equal the slots' output_size \(16\)"):
        StreamingDriver(slots, CTCHead(8, 5))
    with pytest.raises(ValueError, match=r"frontend must give \(T, n_mels\) features of 80 mels"):
        StreamingDriver(slots, head, WhisperFrontend(n_mels=80))
    with pytest.raises(ValueError, match="frontend_process=True needs overlap=True"):
        StreamingDriver(slots, head, overlap=False, frontend_process=True)
    with pytest.raises(ValueError, match="frontend_workers needs frontend_process=True"):
        StreamingDriver(slots, head, frontend_workers=2)
    with pytest.raises(ValueError, match=r"frontend_workers must be at most the batch_size of the slots .* \(1\)"):
        StreamingDriver(slots, head, frontend_process=True, frontend_workers=2)
    with pytest.raises(ValueError, match="a non-empty sequence of them, got list"):
        StreamingDriver([], head)
    with pytest.raises(ValueError, match=r"slots\[1\] must be another Phi4MMSlots"):
        StreamingDriver([slots, slots], head)
    with pytest.raises(ValueError, match=r"slots\[1\].chunk_frames must equal slots\[0\]'s \(16\)"):
        StreamingDriver([slots, Phi4MMSlots(encoder, chunk_size=3)], head)
    with pytest.raises(ValueError, match="frontend_workers must be >= 1, got 0"):
        StreamingDriver(slots, head, frontend_process=True, frontend_workers=0)
    driver = StreamingDriver(slots, head)
    with pytest.raises(ValueError, match="starts"):
        driver.run(random_signals(1, 2), [0])
    driver.close()


def test_qwen3_asr_streams_equal_the_offline_windowed_forward(tiny_qwen3_asr, head, random_signals, joined_outputs):
    """The Qwen3-ASR family through the same driver: windows of 8 chunks per slot, utterances starting at any
    cycle, short ones and ones of several windows; each equals the offline forward of its running-floor
    features (what a stream's front end computes), and its ids the greedy decoding of that."""
    encoder = tiny_qwen3_asr()
    batch = [*random_signals(6, 3, 3000, 40000), random_signals(7, 1, 150000, 150001)[0], np.zeros(100, np.float32)]
    driver = StreamingDriver(open_slots(encoder, batch_size=3), head, keep_outputs=True)
    streams = driver.run(batch, [0, 2, 0, 1, 9])
    driver.close()
    frontend = WhisperFrontend.qwen3_asr(floor="running")
    for samples, stream in zip(batch, streams):
        with torch.no_grad():
            outputs, lengths = encoder(torch.from_numpy(frontend(samples))[None], [frontend.num_frames(len(samples))])
            reference = outputs[0, : int(lengths[0])]
            ids = greedy_decode(head(reference)[None])[0]
        assert joined_outputs(stream).shape == reference.shape, stream.name
        assert (joined_outputs(stream) - reference).abs().max().item() <= TOLERANCE, stream.name
        assert stream.ids == ids, stream.name
    assert max(len(stream.outputs) for stream in streams) > 1  # the long one spans windows
