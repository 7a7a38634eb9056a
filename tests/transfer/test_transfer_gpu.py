"""audiomask.transfer on a CUDA device: no stalls, no corruption, sync_check.

These check structure with wide margins (did the host wait for a 50 ms GPU
queue or not; is every byte intact), never tight timings: the 0.1 ms figures
come from scripts/bench_transfer.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from audiomask.bench.harness import QueueFiller, mask_builder
from audiomask.transfer import (
    VIEW_ALIGN_BYTES,
    KiB,
    MiB,
    PinnedRegion,
    PinnedRing,
    UnsafeCopyError,
    copy_pinned,
    sync_check,
    to_device,
    to_host,
)
from audiomask.transfer.baselines import COPY_METHODS, direct_copy, pin_per_copy
from audiomask.transfer.staging import LARGE_COPY_PIECES

pytestmark = pytest.mark.gpu

BUSY_MS = 50.0  # GPU work queued ahead of the copy under test
STALL_FLOOR_MS = BUSY_MS / 2  # a copy that waited for the queue took at least this long
SIZES = [16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
REPEATS = 3
INTEGRITY_ROUNDS = 3000
# Payloads up to 256 KiB: beyond what a driver might inline into its command buffer at enqueue time,
# so every copy really reads the slot when it runs.
INTEGRITY_SLOT_BYTES = 256 * KiB
COPY_DELAY_MS = 0.5  # queued on a side stream before each delayed copy
STALL_EVERY = 500  # rounds between longer delays of the side stream ...
STALL_DELAY_MS = 20.0  # ... during which the host laps it: every slot in flight, the ring must wait
EARLY_REUSE_BYTES = MiB
EARLY_REUSE_ROUNDS = 20
EARLY_REUSE_DELAY_MS = 5.0  # each copy waits this long; the host overwrites the slot within ~0.1 ms


@pytest.fixture(scope="module")
def filler() -> QueueFiller:
    return QueueFiller("cuda")


def host_ms(action) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    return (time.perf_counter() - start) * 1e3, result


def behind_busy_queue(filler: QueueFiller, action) -> tuple[float, bool, object]:
    """Run action with BUSY_MS of work queued on the current stream: (host ms, queue still busy after, result)."""
    torch.cuda.synchronize()
    filler.fill(BUSY_MS)
    elapsed, result = host_ms(action)
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return elapsed, still_busy, result


def weights(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) % 251 + 1


def checksum(values: np.ndarray) -> int:
    """A position-weighted sum: catches both wrong bytes and bytes from another payload."""
    return int(np.dot(values.astype(np.int64), weights(values.size)))


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.frombuffer(rng.bytes(n), dtype=np.uint8)


# --------------------------------------------------------------------------- no stalls


@pytest.mark.parametrize("nbytes", SIZES, ids=lambda n: f"{n // KiB}KiB")
def test_to_device_does_not_wait_for_a_busy_queue(filler: QueueFiller, nbytes: int) -> None:
    payload = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    to_device(payload, "cuda")  # the ring grows to this size here, not in the timed calls
    # ... and once behind a busy queue: an idle consumer takes the copy itself, so the first
    # copy-stream allocation of this size would otherwise fall in a timed call (it costs up to
    # ~1 ms without waiting for the queue). The claim is the steady state.
    behind_busy_queue(filler, lambda: to_device(payload, "cuda"))
    torch.cuda.synchronize()
    runs = [behind_busy_queue(filler, lambda: to_device(payload, "cuda")) for _ in range(REPEATS)]
    times = sorted(elapsed for elapsed, _, _ in runs)
    assert all(still_busy for _, still_busy, _ in runs), f"to_device waited for the queue: {times} ms"
    assert torch.equal(runs[-1][2].cpu(), torch.from_numpy(payload))


def test_a_payload_over_the_ring_bound_crosses_in_pieces_without_waiting(filler: QueueFiller) -> None:
    ring = PinnedRing(slot_bytes=MiB, num_slots=2, max_pinned_bytes=8 * MiB)
    payload = np.random.default_rng(1).integers(0, 256, (64, 512 * KiB), dtype=np.uint8)  # 32 MiB: 16 pieces
    to_device(payload, "cuda", ring=ring)  # the ring's slots pinned here, not in the timed calls
    runs = [behind_busy_queue(filler, lambda: to_device(payload, "cuda", ring=ring)) for _ in range(REPEATS)]
    assert all(still_busy for _, still_busy, _ in runs), f"waited for the queue: {[ms for ms, _, _ in runs]} ms"
    assert torch.equal(runs[-1][2].cpu(), torch.from_numpy(payload))
    assert ring.stats().pinned_bytes <= 8 * MiB


def test_mask_built_in_a_slot_is_submitted_without_waiting(filler: QueueFiller) -> None:
    name, build = mask_builder()
    ring = PinnedRing()
    shape = (16, 256, 256)  # 1 MiB of bool
    for _ in range(REPEATS):
        with ring.stage(shape, np.bool_) as staged:
            build(staged.array, np.random.default_rng(0))
            expected = torch.from_numpy(staged.array.copy())
            elapsed, still_busy, mask = behind_busy_queue(filler, lambda: staged.to("cuda"))
        assert still_busy, f"submit of a mask built by {name} waited for the queue ({elapsed:.2f} ms)"
        assert mask.dtype == torch.bool and torch.equal(mask.cpu(), expected)


def test_pageable_non_blocking_copy_stalls_behind_a_busy_queue(filler: QueueFiller) -> None:
    """Negative control: proves that the measurement above would see a stall."""
    payload = torch.from_numpy(np.random.default_rng(1).integers(0, 256, 16 * MiB, dtype=np.uint8))
    direct_copy(payload, "cuda")
    elapsed, _, result = behind_busy_queue(filler, lambda: direct_copy(payload, "cuda"))
    assert elapsed >= STALL_FLOOR_MS, f"a pageable 16 MiB copy returned after {elapsed:.2f} ms"
    assert torch.equal(result.cpu(), payload)


def test_consumer_stream_waits_for_a_delayed_copy(filler: QueueFiller) -> None:
    payload = np.random.default_rng(2).integers(0, 256, MiB, dtype=np.uint8)
    slow = torch.cuda.Stream()
    filler.fill(20, slow)
    total = to_device(payload, "cuda", stream=slow).to(torch.int64).sum()  # queued on the current stream
    assert total.item() == int(payload.astype(np.int64).sum())


# --------------------------------------------------------------------------- integrity under reuse


def test_every_copy_arrives_intact_under_slot_reuse(filler: QueueFiller) -> None:
    """Thousands of payloads through 3 slots and one reused source buffer, while the GPU is kept busy.

    A third of the copies run on the ring's idle copy stream while the current
    stream is busy (device memory reuse: each result is dropped at once, before
    its checksum has run); two thirds run on a side stream delayed by
    COPY_DELAY_MS, and now and then by STALL_DELAY_MS, so their slots are
    still in flight when the host comes back for them (slot reuse: the ring
    must wait).
    """
    ring = PinnedRing(slot_bytes=INTEGRITY_SLOT_BYTES, num_slots=3, max_pinned_bytes=3 * INTEGRITY_SLOT_BYTES)
    slow = torch.cuda.Stream()
    rng = np.random.default_rng(3)
    device_weights = to_device(weights(INTEGRITY_SLOT_BYTES), "cuda")
    source = np.empty(INTEGRITY_SLOT_BYTES, dtype=np.uint8)  # the caller refills it right after each call
    expected, sums, copies = [], [], 0
    piece_bytes = ring.max_pinned_bytes // LARGE_COPY_PIECES
    for i in range(INTEGRITY_ROUNDS):
        n = int(rng.integers(1, INTEGRITY_SLOT_BYTES + 1))
        source[:n] = random_bytes(rng, n)
        expected.append(checksum(source[:n]))
        if i % 100 == 0:
            filler.fill(2.0)  # the checksums below run late
        if i % STALL_EVERY == 1:
            filler.fill(STALL_DELAY_MS, slow)
        if i % 3 < 2:
            copies += -(-n // piece_bytes)  # over the piece bound a payload crosses in pieces, a copy each
        else:
            copies += 1
        if i % 3 == 0:
            result = to_device(source[:n], "cuda", ring=ring)
        elif i % 3 == 1:
            filler.fill(COPY_DELAY_MS, slow)
            result = to_device(source[:n], "cuda", ring=ring, stream=slow)
        else:
            with ring.stage(n, np.uint8) as staged:
                staged.array[:] = source[:n]
                filler.fill(COPY_DELAY_MS, slow)
                result = staged.to("cuda", stream=slow)
        sums.append((result.to(torch.int64) * device_weights[:n]).sum())
        del result
    torch.cuda.synchronize()
    assert torch.stack(sums).cpu().tolist() == expected
    stats = ring.stats()
    assert stats.copies == copies and stats.slot_waits > 0 and stats.slots == 3


def test_small_copies_riding_a_busy_consumer_arrive_intact_from_segment_slots(filler: QueueFiller) -> None:
    """Small copies queued behind a busy consumer hold their slots: the ring grows segments of them, carved from one block.

    Every copy must carry its own payload: no two slots of a segment overlap,
    and none is reused while its copy waits in the queue.
    """
    ring = PinnedRing(slot_bytes=4 * KiB, num_slots=1, max_pinned_bytes=64 * MiB)
    rng = np.random.default_rng(11)
    device_weights = to_device(weights(16 * KiB), "cuda")
    source = np.empty(16 * KiB, dtype=np.uint8)
    expected, sums = [], []
    filler.fill(20.0)  # every copy below waits in this queue
    for _ in range(500):
        n = int(rng.integers(1, 16 * KiB + 1))
        source[:n] = random_bytes(rng, n)
        expected.append(checksum(source[:n]))
        result = to_device(source[:n], "cuda", ring=ring)
        sums.append((result.to(torch.int64) * device_weights[:n]).sum())
    torch.cuda.synchronize()
    assert torch.stack(sums).cpu().tolist() == expected
    stats = ring.stats()
    segments = {id(slot.segment) for slot in ring._pool.slots if slot.segment is not None}
    assert len(segments) >= 3 and stats.grows <= 40 and stats.slot_waits == 0, stats  # not one pin per slot


def test_large_copies_of_changing_payloads_arrive_intact(filler: QueueFiller) -> None:
    """Large to_device copies from one reused source, idle and behind a busy queue: each must carry its own payload."""
    nbytes = 32 * MiB
    ring = PinnedRing(slot_bytes=nbytes, num_slots=2, max_pinned_bytes=2 * nbytes)
    rng = np.random.default_rng(5)
    device_weights = to_device(weights(nbytes), "cuda")
    source = np.empty(nbytes, dtype=np.uint8)
    expected, sums = [], []
    for i in range(40):
        source[:] = random_bytes(rng, nbytes)
        expected.append(checksum(source))
        if i % 10 == 0:
            filler.fill(20.0)  # half the copies behind a busy queue, on the ring's copy stream
        result = to_device(source, "cuda", ring=ring)
        sums.append((result.to(torch.int64) * device_weights).sum())
    torch.cuda.synchronize()
    assert torch.stack(sums).cpu().tolist() == expected
    pieces = -(-nbytes // (ring.max_pinned_bytes // LARGE_COPY_PIECES))  # over the piece bound: it crosses in pieces
    assert ring.stats().copies == 40 * pieces


def test_integrity_check_sees_a_slot_reused_too_early(filler: QueueFiller) -> None:
    """Negative control: releasing slots without their copy's event corrupts copies, and the check sees it."""
    ring = PinnedRing(slot_bytes=EARLY_REUSE_BYTES, num_slots=1, max_pinned_bytes=EARLY_REUSE_BYTES)
    slow = torch.cuda.Stream()
    rng = np.random.default_rng(4)
    payloads = [random_bytes(rng, EARLY_REUSE_BYTES) for _ in range(EARLY_REUSE_ROUNDS)]
    expected = [checksum(payload) for payload in payloads]
    device_weights = to_device(weights(EARLY_REUSE_BYTES), "cuda")
    sums, results = [], []  # results stay alive: only the slot may be reused early
    torch.cuda.synchronize()
    for payload in payloads:
        with ring.stage(EARLY_REUSE_BYTES, np.uint8) as staged:
            staged.array[:] = payload
            filler.fill(EARLY_REUSE_DELAY_MS, slow)
            with torch.cuda.stream(slow):
                result = direct_copy(staged.tensor, "cuda")
            staged.release()  # no event: the slot is handed out again while the copy waits
        torch.cuda.current_stream().wait_stream(slow)
        sums.append((result.to(torch.int64) * device_weights).sum())
        results.append(result)
    torch.cuda.synchronize()
    wrong = sum(got != want for got, want in zip(torch.stack(sums).cpu().tolist(), expected, strict=True))
    assert wrong >= EARLY_REUSE_ROUNDS // 2, f"only {wrong} of {EARLY_REUSE_ROUNDS} copies were corrupted"


# --------------------------------------------------------------------------- API on the device


def test_to_device_on_the_gpu_keeps_values_and_dtypes() -> None:
    cases = [
        np.random.default_rng(5).random((3, 7, 7)) > 0.5,
        np.arange(5, dtype=np.int64),
        np.arange(24, dtype=np.float32).reshape(4, 6).T,
        [[1, 2], [3, 4]],
        torch.arange(6.0).expand(3, 6),
    ]
    for data in cases:
        result = to_device(data, "cuda")
        assert result.device.type == "cuda" and result.is_contiguous()
        reference = to_device(data, "cpu")
        assert result.dtype == reference.dtype and torch.equal(result.cpu(), reference)
    out = torch.empty(3, dtype=torch.float16, device="cuda")
    assert to_device([1, 2, 3], "cuda", out=out) is out
    assert out.tolist() == [1.0, 2.0, 3.0]
    same_stream = to_device(np.ones(4), "cuda", stream=torch.cuda.current_stream())
    assert same_stream.tolist() == [1.0] * 4


def test_to_device_passes_device_tensors_through() -> None:
    x = torch.arange(3, device="cuda")
    assert to_device(x, "cuda") is x
    assert to_device(x, "cuda", dtype=torch.float32).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="out is on cpu, but device is cuda:0"):
        to_device([1, 2, 3], "cuda", out=torch.empty(3, dtype=torch.int64))


def test_packed_arrays_arrive_in_one_copy_at_aligned_addresses() -> None:
    ring = PinnedRing(slot_bytes=MiB, num_slots=2)
    with ring.stage_many([((2, 5, 5), np.bool_), ((2,), np.int64), ((2, 7, 80), np.float32)]) as staged:
        mask, lengths, features = staged.arrays
        assert staged.tensors[0].is_pinned()
        mask[:] = np.tril(np.ones((5, 5), dtype=bool))
        lengths[:] = [5, 3]
        features[:] = np.arange(2 * 7 * 80, dtype=np.float32).reshape(2, 7, 80)
        expected = [torch.from_numpy(a.copy()) for a in staged.arrays]
        results = staged.to_many("cuda")
    assert ring.stats().copies == 1
    for result, want in zip(results, expected, strict=True):
        assert result.device.type == "cuda" and result.data_ptr() % VIEW_ALIGN_BYTES == 0
        assert torch.equal(result.cpu(), want)


# --------------------------------------------------------------------------- sync_check


@pytest.mark.parametrize("method", COPY_METHODS)
def test_sync_check_raises_on_a_pageable_copy(method: str) -> None:
    with sync_check(), pytest.raises(UnsafeCopyError, match="reads pageable memory"):
        direct_copy(torch.ones(1024), "cuda", method=method)


@pytest.mark.parametrize("method", COPY_METHODS)
def test_sync_check_raises_on_a_strided_pinned_copy(method: str) -> None:
    pinned = torch.ones(64, 64, pin_memory=True)
    with sync_check():
        direct_copy(pinned, "cuda", method=method)  # pinned and dense: fine
        with pytest.raises(UnsafeCopyError, match="non-dense tensor"):
            direct_copy(pinned[:, ::2], "cuda", method=method)


def test_sync_check_is_silent_for_to_device_and_ring_slots() -> None:
    ring = PinnedRing(slot_bytes=MiB, num_slots=2)
    with sync_check() as check:
        to_device(np.ones((256, 256), dtype=bool), "cuda")
        to_device(torch.ones(64, 64).t(), "cuda")
        to_device(np.zeros(8 * MiB, dtype=np.uint8), "cuda")  # larger than a default slot: grows
        to_device([1, 2, 3], "cuda", out=torch.empty(3, dtype=torch.int64, device="cuda"))
        with ring.stage((4, 4), np.float32) as staged:
            staged.array[:] = 1.0
            staged.to("cuda")
        with ring.stage_many([(3, np.bool_), (2, np.int64)]) as staged:
            staged.to_many("cuda")
        pin_per_copy(torch.ones(16), "cuda")  # costly on the host, but it does not stall
        torch.cuda.synchronize()
    assert check.flagged == []


def test_to_host_returns_before_the_queue_and_lands_in_pinned_memory(filler: QueueFiller) -> None:
    source = torch.arange(1 << 20, device="cuda", dtype=torch.int32)
    torch.cuda.synchronize()
    elapsed, still_busy, (host, done) = behind_busy_queue(filler, lambda: to_host(source))
    assert still_busy, f"to_host waited for the queue ({elapsed:.2f} ms)"
    done.synchronize()
    assert host.is_pinned() and torch.equal(host, source.cpu())


# --------------------------------------------------------------------------- memory page-locked in place


def test_a_region_page_locks_shared_memory_in_place_until_closed() -> None:
    memory = torch.randn(64, 1024, generator=torch.Generator().manual_seed(4)).share_memory_()
    assert not memory.is_pinned()
    with PinnedRegion(memory) as region:
        assert region.pinned and memory.is_pinned() and memory[5:9].is_pinned()
        again = PinnedRegion(memory[5:9])  # page-locked already: nothing of its own to undo
        assert again.pinned
        again.close()
        assert memory.is_pinned()
    assert not region.pinned and not memory.is_pinned()
    result, done = copy_pinned(memory, "cuda")  # pageable again: staged, the memory free at once
    assert done is None and torch.equal(result.cpu(), memory)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_copy_pinned_does_not_wait_for_a_busy_queue_and_casts_as_the_host_does(filler: QueueFiller, dtype) -> None:
    memory = (torch.randn(256, 4096, generator=torch.Generator().manual_seed(5)) * 100).share_memory_()  # 4 MiB
    with PinnedRegion(memory):
        copy_pinned(memory[:8], "cuda", dtype=dtype)  # the copy stream and its pool made here, not below
        elapsed, still_busy, (result, done) = behind_busy_queue(
            filler, lambda: copy_pinned(memory[64:192], "cuda", dtype=dtype)
        )
        assert still_busy, f"copy_pinned waited for the queue ({elapsed:.2f} ms)"
        assert isinstance(done, torch.cuda.Event) and done.query()
        # Round to nearest, ties to even, on both sides: the same bits.
        assert torch.equal(result.cpu(), memory[64:192].to(dtype or memory.dtype))


def test_the_consumer_waits_for_copy_pinned_and_the_source_may_be_written_after_done(filler: QueueFiller) -> None:
    memory = torch.arange(1 << 20, dtype=torch.float32).share_memory_()
    with PinnedRegion(memory):
        filler.fill(20)  # the consumer busy: the copy runs beside it, the sum waits for it
        result, done = copy_pinned(memory, "cuda")
        total = result.double().sum()
        done.synchronize()
        memory.zero_()  # the copy has read it
        assert total.item() == float(np.arange(1 << 20, dtype=np.float64).sum())
        assert torch.equal(result.cpu(), torch.arange(1 << 20, dtype=torch.float32))


def test_sync_check_is_silent_for_copy_pinned() -> None:
    memory = torch.ones(1024).share_memory_()
    with PinnedRegion(memory), sync_check("error") as check:
        copy_pinned(memory, "cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
    assert check.flagged == []
