"""Faults: no CUDA, out of memory, pinned memory refused, streams that stop or send after the end, bad streams.

Each fault ends in a clear error naming what to change, or in the documented
fallback; the other streams of a recognizer never notice a bad one (their
texts and encoder outputs equal those of each stream run alone). GPU tests
(``gpu`` marker) really exhaust the H200's memory and pin memory there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from audiomask import AudioError
from audiomask.asr.driver import StreamingDriver
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.errors import PinnedMemoryWarning
from audiomask.streaming import Phi4MMSlots
from audiomask.transfer import KiB, PinnedRing, to_device

CHUNK_MS, LEFT_CHUNKS = 160, 1
CHUNK_SAMPLES = CHUNK_MS * 16  # 16 kHz
OOM_STREAMS = 64  # enough that one step's activations outgrow every block a one-stream step freed


@pytest.fixture(scope="module")
def alone(transcribe_alone):
    """The text of samples streamed alone with this module's chunking."""
    return lambda model, samples: transcribe_alone(model, samples, CHUNK_MS, LEFT_CHUNKS)


# ---- devices and memory ----


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0, torch.device("cuda", 1)])
def test_cuda_device_without_cuda_is_a_clear_value_error(model, device):
    with pytest.raises(ValueError, match=r"CUDA is not available on this machine .*pass device='cpu'"):
        StreamingRecognizer(model, device, chunk_ms=CHUNK_MS)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0, np.int64(0)])
def test_a_cuda_device_on_a_torch_build_without_cuda_is_a_clear_value_error(model, device, cpu_only_torch):
    with pytest.raises(ValueError, match=r"CUDA is not available on this machine .*pass device='cpu'"):
        StreamingRecognizer(model, device, chunk_ms=CHUNK_MS)


@pytest.mark.parametrize("device", ["tpu", "mps", "cuda:x", True])
def test_unknown_devices_name_the_device(model, device):
    with pytest.raises(ValueError, match="device"):
        StreamingRecognizer(model, device, chunk_ms=CHUNK_MS)


@pytest.mark.gpu
def test_missing_cuda_index_is_a_clear_value_error(model):
    index = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"'cuda:{index}' does not exist: this machine has {index} CUDA device"):
        StreamingRecognizer(model, f"cuda:{index}", chunk_ms=CHUNK_MS)


class OutOfMemoryAfter:
    """Wraps a forward: raises CUDA's out-of-memory error from call ``calls + 1`` on."""

    def __init__(self, forward, calls: int) -> None:
        self.forward, self.calls, self.count = forward, calls, 0

    def __call__(self, *args, **kwargs):
        self.count += 1
        if self.count > self.calls:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return self.forward(*args, **kwargs)


def test_out_of_memory_in_a_step_names_what_to_reduce_and_stops_the_recognizer(model, noise, alone, monkeypatch):
    speech = noise(5, 16000)
    step = OutOfMemoryAfter(model.head.forward, calls=3)  # the CTC head runs in every chunk step
    monkeypatch.setattr(model.head, "forward", step)
    with StreamingRecognizer(model, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, max_streams=2) as recognizer:
        first, second = recognizer.open_stream("first"), recognizer.open_stream("second")
        with pytest.raises(torch.OutOfMemoryError, match=r"reduce max_streams \(2\), chunk_ms \(160\) or left_chunks"):
            for start in range(0, len(speech), CHUNK_SAMPLES):
                for stream in (first, second):
                    before = first.partial(), second.partial()
                    stream.accept(speech[start : start + CHUNK_SAMPLES])
        assert step.count == 4
        assert (first.partial(), second.partial()) == before  # the text so far stays readable
        for call in (lambda: first.accept(speech[:10]), first.finish, recognizer.open_stream):
            with pytest.raises(RuntimeError, match="stopped after an error inside an encoder step .*open a new one"):
                call()
    monkeypatch.undo()
    assert alone(model, speech).startswith(before[0])  # what had been decoded was right


@pytest.mark.gpu
def test_real_cuda_out_of_memory_names_what_to_reduce(model, noise, recognizer_clock):
    """Fill the GPU, then a step cannot allocate: the recognizer's error, not a bare allocator message.

    The clock stands still: no ready chunk's wait for the others ever ends."""
    hog = []
    try:
        with StreamingRecognizer(  # eager: a CUDA graph's step takes its memory once, at capture, and never fails
            model, "cuda", chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, max_streams=OOM_STREAMS, cuda_graph=False
        ) as recognizer:
            recognizer.transcribe(noise(4, 8000))  # warm: lazy initialisation done before memory runs out
            # Every step so far had one stream. The first stream runs alone, then holds the full cycle
            # (it has no next chunk yet, and with the clock standing still the others' chunks wait for
            # it) while the others take the slots; its next audio then starts a step of all of them,
            # whose activations are larger than any block freed so far.
            streams = [recognizer.open_stream(f"filled {i}") for i in range(OOM_STREAMS)]
            for stream in streams:
                stream.accept(noise(5, 4 * CHUNK_SAMPLES))
            torch.cuda.empty_cache()  # no cached block left for the step to take
            # Bytes: the large pool (> 1 MiB) down to its smallest request, then the small pool down to its
            # 512-byte rounding, so no free fragment of a cached segment is left for the step to take.
            for block in (2**30, 2**25, 2**21, 2**20 + 512, 2**16, 2**12, 2**9):
                while True:
                    try:
                        hog.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
                    except torch.OutOfMemoryError:
                        break
            with pytest.raises(
                torch.OutOfMemoryError, match=rf"ran out of memory .*reduce max_streams \({OOM_STREAMS}\)"
            ):
                streams[0].accept(noise(6, 4 * CHUNK_SAMPLES))
            hog.clear()
            with pytest.raises(RuntimeError, match="open a new one"):
                streams[1].accept(noise(5, 100))
    finally:
        hog.clear()
        torch.cuda.empty_cache()
        model.encoder.cpu(), model.head.cpu()  # the module's model, for the tests after this one


def refuse_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ``torch.empty(..., pin_memory=True)`` fail as it does past the locked-memory limit."""
    empty = torch.empty

    def empty_without_pinning(*args, pin_memory=False, **kwargs):
        if pin_memory:
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty_without_pinning)


def test_a_slot_that_cannot_be_pinned_falls_back_to_pageable_memory_with_a_warning(monkeypatch):
    ring = PinnedRing(slot_bytes=4 * KiB, num_slots=1, max_pinned_bytes=1024 * KiB)
    ring.pinned = True  # as on a CUDA machine: new slots ask to be pinned
    refuse_pinning(monkeypatch)
    data = np.arange(16 * KiB, dtype=np.int32)  # 64 KiB: the ring grows a slot, which cannot be pinned
    with pytest.warns(PinnedMemoryWarning, match="could not pin a 65536-byte ring block .*cudaHostAlloc.*pageable"):
        result = to_device(data, "cpu", ring=ring)
    np.testing.assert_array_equal(result.numpy(), data)
    stats = ring.stats()
    assert stats.slots == 2 and stats.grows == 1 and stats.copies == 1
    assert not stats.pinned  # one slot is pageable: the ring no longer claims to be pinned

    def no_memory_at_all(*args, **kwargs):
        raise RuntimeError("no memory at all")

    monkeypatch.setattr(torch, "empty", no_memory_at_all)
    ring.pinned = False
    with pytest.raises(RuntimeError, match="no memory at all"):  # a plain allocation failure is not hidden
        ring._new_slots(KiB)


@pytest.mark.gpu
def test_pinning_refused_on_cuda_still_copies_intact(monkeypatch):
    refuse_pinning(monkeypatch)
    with pytest.warns(PinnedMemoryWarning):
        ring = PinnedRing(slot_bytes=64 * KiB, num_slots=2, max_pinned_bytes=1024 * KiB)
    data = np.random.default_rng(0).standard_normal((64, 100)).astype(np.float32)
    for _ in range(8):  # slots are reused: each copy is guarded by its event as before
        result = to_device(data, "cuda", ring=ring)
        np.testing.assert_array_equal(result.cpu().numpy(), data)
        data = data + 1


@pytest.mark.gpu
def test_result_buffers_fall_back_to_pageable_memory_and_still_copy(monkeypatch):
    from audiomask.transfer import pinned_empty, to_host

    refuse_pinning(monkeypatch)
    with pytest.warns(PinnedMemoryWarning, match=r"could not pin a host tensor of shape \(4, 8\)"):
        out = pinned_empty((4, 8), torch.int64)
    source = torch.arange(32, device="cuda").reshape(4, 8)
    host, done = to_host(source, out=out)  # a blocking copy into pageable memory: complete on return
    assert done is None and host is out and torch.equal(out, source.cpu())


# ---- streams that stop, or send after their end ----


def test_accept_after_finish_or_input_finished_names_the_stream(model, noise, alone):
    with StreamingRecognizer(model, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, max_streams=2) as recognizer:
        finished, ended = recognizer.open_stream("done-1"), recognizer.open_stream("ended-2")
        finished.accept(noise(1, 5000))
        ended.accept(noise(2, 5000))
        ended.input_finished()
        finished.finish()
        with pytest.raises(ValueError, match="accept after finish: stream 'done-1' has ended"):
            finished.accept(noise(1, 10))
        with pytest.raises(ValueError, match="accept after finish: stream 'ended-2' has ended"):
            ended.accept(noise(1, 10))
        assert ended.finish() == alone(model, noise(2, 5000))


def test_finish_never_waits_for_a_silent_stream_of_the_batch(model, noise, alone):
    with StreamingRecognizer(model, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, max_streams=2) as recognizer:
        leaving, silent = recognizer.open_stream("leaving"), recognizer.open_stream("silent")
        silent.accept(noise(2, 3000))  # one chunk, then it stops sending
        leaving.accept(noise(1, 9000))  # a step for both; its next ones go without 'silent'
        assert leaving.finish() == alone(model, noise(1, 9000))
        silent.input_finished()
        assert silent.finish() == alone(model, noise(2, 3000))


def test_finish_without_a_free_slot_names_the_streams_holding_them(model, noise, alone):
    with StreamingRecognizer(model, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, max_streams=1) as recognizer:
        holder, late = recognizer.open_stream("holder"), recognizer.open_stream("late")
        holder.accept(noise(2, 3000))  # takes the one slot, then stops sending
        late.accept(noise(1, 9000))
        message = r"stream 'late' cannot finish: it waits for a slot, .*\(max_streams\) .*\(not ended: 'holder'\)"
        with pytest.raises(RuntimeError, match=message):
            late.finish()
        with pytest.raises(RuntimeError, match="cannot finish"):
            late.finish(timeout=0.05)  # waits a little for another thread that never comes
        holder.input_finished()
        assert late.finish() == alone(model, noise(1, 9000))
        assert holder.finish() == alone(model, noise(2, 3000))


def test_an_idle_stream_is_ended_after_the_idle_timeout(model, noise, alone, recognizer_clock):
    clock = recognizer_clock
    with StreamingRecognizer(
        model, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, max_streams=1, idle_timeout_s=30
    ) as recognizer:
        gone, talking = recognizer.open_stream("gone"), recognizer.open_stream("talking")
        gone.accept(noise(2, 4000))  # takes the one slot
        speech = noise(1, 12000)
        talking.accept(speech[:6000])
        clock.now += 20
        talking.accept(speech[6000:])
        with pytest.raises(RuntimeError, match=r"\(not ended: 'gone'\)"):  # 20 s idle: not yet
            talking.finish()
        clock.now += 11  # 31 s since 'gone' last sent audio
        assert talking.finish() == alone(model, speech)
        assert gone.finished
        with pytest.raises(ValueError, match=r"stream 'gone' was ended after 30.0 s without audio \(idle_timeout_s\)"):
            gone.accept(noise(2, 10))
        assert gone.finish() == alone(model, noise(2, 4000))  # what it sent is transcribed, nothing lost
    with pytest.raises(ValueError, match="idle_timeout_s must be None or a number of seconds in \\(0.0, "):
        StreamingRecognizer(model, chunk_ms=CHUNK_MS, idle_timeout_s=0)


# ---- one bad stream in a batch ----


def test_a_bad_stream_never_affects_the_others(model, noise, alone):
    """Bad pieces are refused whole and queue nothing; every text equals its stream's good audio run alone."""
    signals = [noise(s, n) for s, n in zip((11, 12, 13), (14000, 11000, 9000))]
    poisoned = signals[1][:4000].copy()
    poisoned[1234] = np.nan
    with StreamingRecognizer(model, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, max_streams=3) as recognizer:
        streams = [recognizer.open_stream(f"s{i}") for i in range(3)]
        for position in range(0, 14000, 2000):
            for stream, samples in zip(streams, signals):
                stream.accept(samples[position : position + 2000])
            if position == 4000:
                bad = streams[1]
                with pytest.raises(
                    AudioError, match=r"^stream 's1': non-finite sample \(nan\) at frame 7234 \(0.452 s\)"
                ):
                    bad.accept(poisoned)  # frame 6000 + 1234 of the stream
                with pytest.raises(AudioError, match=r"^stream 's1': sample 1e\+12 at frame 6000 .*beyond"):
                    bad.accept(np.full(100, 1e12, np.float32))
                with pytest.raises(ValueError, match="samples for stream 's1' must hold floating-point"):
                    bad.accept((signals[1][:100] * 32767).astype(np.int16))
                with pytest.raises(ValueError, match="samples for stream 's1' must be 1-D"):
                    bad.accept(np.zeros((2, 100), np.float32))
        for stream in streams:
            stream.input_finished()
        texts = [stream.finish() for stream in streams]
    assert texts == [alone(model, samples) for samples in signals]


def test_the_driver_refuses_non_finite_samples(encoder, head):
    driver = StreamingDriver(Phi4MMSlots(encoder, chunk_size=2, left_chunk=1), head)
    stream = driver.open("poisoned")
    with pytest.raises(AudioError, match=r"^samples: non-finite sample \(inf\) at frame 3"):
        driver.feed(stream, np.array([0.0, 0.1, 0.2, np.inf], np.float32))
    driver.close()


def test_non_finite_features_in_one_slot_stay_in_it(encoder, head, monkeypatch):
    """Below every check (as if NaN arose inside the front end): NaN samples in the driver poison only their own
    stream, not the stream that reuses its slot, nor the others of the batch (outputs equal each stream alone)."""
    monkeypatch.setattr("audiomask.samples.check_samples", lambda *args, **kwargs: None)
    rng = np.random.default_rng(3)
    signals = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (24000, 5000, 24000, 8000)]
    signals[1][2000] = np.nan
    starts = [0, 0, 0, 4]  # the fourth opens after the poisoned one ended: it takes its slot

    def run(batch, starts_=None):
        slots = Phi4MMSlots(encoder, len(batch) if starts_ is None else 3, chunk_size=2, left_chunk=1)
        driver = StreamingDriver(slots, head, keep_outputs=True)
        streams = driver.run(batch, starts_)
        driver.close()
        return streams

    together = run(signals, starts)
    assert torch.isnan(torch.cat(together[1].outputs)).any()
    assert together[3]._slot == together[1]._slot == 1
    for index in (0, 2, 3):
        (single,) = run([signals[index]])
        torch.testing.assert_close(torch.cat(together[index].outputs), torch.cat(single.outputs), rtol=0, atol=1e-5)
        assert together[index].ids == single.ids
