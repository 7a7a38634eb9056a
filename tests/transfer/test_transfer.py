"""audiomask.transfer on the CPU: density, to_device, ring bookkeeping, sync_check.

The CUDA-only parts (events, streams, stalls) are in test_transfer_gpu.py; here
the ring's event handling runs with stand-in events, and sync_check watches
copies to the ``meta`` device, which count as host->device.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.transfer import (
    VIEW_ALIGN_BYTES,
    CopyVerdict,
    KiB,
    MiB,
    PinnedRing,
    UnsafeCopyError,
    UnsafeCopyWarning,
    _resolve,
    classify_copy,
    is_dense,
    staging,
    sync_check,
    to_device,
)
from audiomask.transfer import staging as staging_module
from audiomask.transfer.baselines import direct_copy
from audiomask.transfer.ring import DEFAULT_CONSUMER_COPY_BYTES, SMALL_SLOT_BYTES

# --------------------------------------------------------------------------- is_dense


def dense_reference(t: torch.Tensor) -> bool:
    """Brute force: the storage offsets of all elements are a contiguous range, each hit once."""
    offsets = np.full((), t.storage_offset(), dtype=np.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = offsets[..., None] + np.arange(size, dtype=np.int64) * stride
    offsets = offsets.ravel()
    if offsets.size == 0:
        return True
    return np.unique(offsets).size == offsets.size and int(offsets.max() - offsets.min()) + 1 == offsets.size


@st.composite
def strided_tensors(draw: st.DrawFn) -> torch.Tensor:
    """Any sizes and (non-negative) strides, through as_strided over a large enough storage."""
    ndim = draw(st.integers(0, 4))
    sizes = draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim))
    strides = draw(st.lists(st.integers(0, 24), min_size=ndim, max_size=ndim))
    offset = draw(st.integers(0, 3))
    span = offset + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True) if n > 0) + 1
    return torch.zeros(span).as_strided(sizes, strides, offset)


@st.composite
def viewed_tensors(draw: st.DrawFn) -> torch.Tensor:
    """What real code makes: permutes, strided or plain slices, expands, selects of a contiguous tensor."""
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    t = torch.zeros(shape)
    for _ in range(draw(st.integers(0, 4))):
        dim = draw(st.integers(0, t.dim() - 1)) if t.dim() else 0
        op = draw(st.sampled_from(["permute", "slice", "expand", "select", "unsqueeze"]))
        if op == "permute" and t.dim():
            t = t.permute(draw(st.permutations(range(t.dim()))))
        elif op == "slice" and t.dim() and t.shape[dim]:
            start = draw(st.integers(0, t.shape[dim] - 1))
            stop = draw(st.integers(start, t.shape[dim]))
            t = t.narrow(dim, start, stop - start)[(slice(None),) * dim + (slice(None, None, draw(st.integers(1, 3))),)]
        elif op == "expand" and t.dim():
            ones = [i for i, n in enumerate(t.shape) if n == 1]
            if ones:
                sizes = list(t.shape)
                sizes[draw(st.sampled_from(ones))] = draw(st.integers(1, 4))
                t = t.expand(sizes)
        elif op == "select" and t.dim() > 1 and t.shape[dim]:
            t = t.select(dim, draw(st.integers(0, t.shape[dim] - 1)))
        elif op == "unsqueeze":
            t = t.unsqueeze(draw(st.integers(0, t.dim())))
    return t


@given(strided_tensors())
def test_is_dense_matches_brute_force_over_any_strides(t: torch.Tensor) -> None:
    assert is_dense(t) == dense_reference(t)


@given(viewed_tensors())
def test_is_dense_matches_brute_force_over_views(t: torch.Tensor) -> None:
    assert is_dense(t) == dense_reference(t)


@pytest.mark.parametrize(
    ("make", "dense"),
    [
        (lambda: torch.zeros(3, 4), True),
        (lambda: torch.zeros(3, 4).t(), True),
        (lambda: torch.zeros(2, 3, 4).permute(2, 0, 1), True),
        (lambda: torch.zeros(3, 4)[1:], True),
        (lambda: torch.zeros(3, 4)[:, 1:], False),
        (lambda: torch.zeros(3, 4)[::2], False),
        (lambda: torch.zeros(1, 4).expand(3, 4), False),
        (lambda: torch.zeros(4)[:1].expand(1), True),
        (lambda: torch.zeros(3, 1, 4).as_strided((3, 1, 4), (4, 99, 1)), True),
        (lambda: torch.zeros(0, 5)[:, ::2], True),
        (lambda: torch.zeros(()), True),
        (lambda: torch.zeros(5).to_sparse(), False),
    ],
)
def test_is_dense_cases(make, dense: bool) -> None:
    assert is_dense(make()) is dense


def test_is_dense_rejects_non_tensors() -> None:
    with pytest.raises(ValueError, match="t must be a torch.Tensor, got ndarray"):
        is_dense(np.zeros(3))


# --------------------------------------------------------------------------- to_device


@pytest.mark.parametrize(
    ("np_dtype", "torch_dtype"),
    [
        (np.bool_, torch.bool),
        (np.int64, torch.int64),
        (np.int32, torch.int32),
        (np.uint8, torch.uint8),
        (np.float16, torch.float16),
        (np.float32, torch.float32),
        (np.float64, torch.float64),
        (np.complex64, torch.complex64),
    ],
)
@pytest.mark.parametrize("staged", [False, True])
def test_to_device_keeps_numpy_dtype_and_values(np_dtype, torch_dtype, staged: bool) -> None:
    data = (np.arange(12).reshape(3, 4) % 3).astype(np_dtype)
    result = to_device(data, "cpu", ring=PinnedRing(slot_bytes=KiB, num_slots=1) if staged else None)
    assert result.dtype == torch_dtype
    assert result.is_contiguous()
    np.testing.assert_array_equal(result.numpy(), data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([[1, 2], [3, 4]], torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)),
        ((True, False), torch.tensor([True, False])),
        ([0.5], torch.tensor([0.5], dtype=torch.float64)),
        (3, torch.tensor(3, dtype=torch.int64)),
        (np.float32(1.5), torch.tensor(1.5, dtype=torch.float32)),
        ([], torch.zeros(0, dtype=torch.float64)),
    ],
)
def test_to_device_lists_and_numbers_convert_as_numpy_does(data, expected: torch.Tensor) -> None:
    result = to_device(data, "cpu")
    assert result.dtype == expected.dtype
    assert torch.equal(result, expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(24.0).reshape(4, 6).T,
        lambda: np.arange(24.0).reshape(4, 6)[:, ::2],
        lambda: np.arange(24.0)[::-3],
        lambda: np.broadcast_to(np.arange(6.0), (4, 6)),
        lambda: np.arange(24.0).astype(">f8").reshape(4, 6),
        lambda: np.frombuffer(np.arange(6.0).tobytes(), dtype=np.float64),
        lambda: torch.arange(24.0).reshape(4, 6).t(),
        lambda: torch.arange(6.0).expand(4, 6),
        lambda: torch.arange(24.0).reshape(4, 6)[1:, ::3],
    ],
)
@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_to_device_makes_any_layout_dense(make, staged: bool, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "torch":  # the multi-threaded copy that large payloads take
        monkeypatch.setattr(staging, "parallel_copy_bytes", lambda: 0)
    data = make()
    expected = np.array(data.numpy() if isinstance(data, torch.Tensor) else data, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read-only arrays must not warn
        result = to_device(data, "cpu", ring=PinnedRing(slot_bytes=KiB, num_slots=1) if staged else None)
    assert result.is_contiguous()
    np.testing.assert_array_equal(result.numpy(), expected)


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("make", [lambda: np.arange(6), lambda: torch.arange(6)])
def test_to_device_never_aliases_host_data(make, staged: bool) -> None:
    data = make()
    result = to_device(data, "cpu", ring=PinnedRing(slot_bytes=KiB, num_slots=1) if staged else None)
    data[:] = -1  # the caller reuses its buffer at once
    assert result.tolist() == [0, 1, 2, 3, 4, 5]


def test_to_device_detaches_tensors() -> None:
    source = torch.ones(3, requires_grad=True)
    result = to_device(source, "cpu")
    assert not result.requires_grad
    assert result.grad_fn is None


@pytest.mark.parametrize("dtype", [torch.float16, np.float16, "float16", np.dtype("float16")])
def test_to_device_converts_dtype(dtype) -> None:
    result = to_device(np.array([1.5, 2.5]), "cpu", dtype=dtype)
    assert result.dtype == torch.float16
    assert result.tolist() == [1.5, 2.5]


@pytest.mark.parametrize(
    ("threads", "nbytes", "engine"),
    [(16, MiB - 1, "numpy"), (16, MiB, "torch"), (4, 4 * MiB, "torch"), (2, MiB, "numpy"), (2, 32 * MiB, "torch")],
)
def test_staging_copy_goes_multi_threaded_from_a_size(
    threads: int, nbytes: int, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    engines: list[str] = []
    numpy_copyto, torch_copy = np.copyto, torch.Tensor.copy_

    def spy_numpy(dst, src, **kwargs):
        engines.append("numpy")
        return numpy_copyto(dst, src, **kwargs)

    def spy_torch(dst, src, non_blocking=False):
        if dst.device.type == "cpu" and src.device.type == "cpu" and dst.data_ptr() != 0:
            engines.append("torch")
        return torch_copy(dst, src, non_blocking)

    monkeypatch.setattr(np, "copyto", spy_numpy)
    monkeypatch.setattr(torch.Tensor, "copy_", spy_torch)
    data = np.arange(nbytes, dtype=np.uint8)
    ring = PinnedRing(slot_bytes=KiB, num_slots=1, max_pinned_bytes=64 * MiB)
    result = to_device(data, "cpu", ring=ring)
    assert engines[0] == engine  # the staging memcpy (the copy out of the slot follows)
    assert torch.equal(result, torch.from_numpy(data))


def test_to_device_hands_the_slot_back_when_staging_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=1)

    def fail(*args, **kwargs):
        raise MemoryError("staging failed")

    monkeypatch.setattr(np, "copyto", fail)
    with pytest.raises(MemoryError, match="staging failed"):
        to_device(np.arange(4), "cpu", ring=ring)
    assert ring.stats().leased == 0 and ring.stats().copies == 0


def test_to_device_stages_dtypes_numpy_lacks() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=1)
    result = to_device(np.array([1.0, 2.0]), "cpu", dtype=torch.bfloat16, ring=ring)
    assert result.dtype == torch.bfloat16
    assert result.tolist() == [1.0, 2.0]
    assert ring.stats().copies == 1


@pytest.mark.parametrize("staged", [False, True])
def test_to_device_copies_into_out(staged: bool) -> None:
    out = torch.zeros(2, 3, dtype=torch.float32)
    result = to_device(
        np.arange(6).reshape(2, 3), "cpu", out=out, ring=PinnedRing(slot_bytes=KiB, num_slots=1) if staged else None
    )
    assert result is out
    assert out.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]  # out's dtype wins when dtype is not given


def test_to_device_copies_into_a_transposed_out() -> None:
    out = torch.zeros(3, 2).t()
    to_device(np.arange(6.0).reshape(2, 3), "cpu", out=out, ring=PinnedRing(slot_bytes=KiB, num_slots=1))
    assert out.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback of machines without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:3", torch.device("cuda", 1), 0])
def test_to_device_falls_back_to_cpu_without_cuda(device) -> None:
    result = to_device(np.arange(3), device)
    assert result.device.type == "cpu"
    assert result.tolist() == [0, 1, 2]


@pytest.mark.parametrize("device", [0, np.int64(1), "cuda:0", torch.device("cuda", 0)])
def test_a_cuda_device_falls_back_to_cpu_where_torch_has_no_cuda(device, cpu_only_torch) -> None:
    assert _resolve.resolve_device(device) == cpu_only_torch("cpu")
    result = to_device(np.arange(3), device)
    assert result.device.type == "cpu" and result.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data": [1], "device": "gpu"}, "device must be 'cpu', 'cuda', 'cuda:N' or a CUDA index, got 'gpu'"),
        ({"data": [1], "device": "meta"}, "device must be a CPU or CUDA device, got 'meta'"),
        ({"data": [1], "device": True}, "device must be .* got True"),
        ({"data": np.array([None]), "device": "cpu"}, "data has dtype object, which torch cannot hold"),
        ({"data": np.array(["a"]), "device": "cpu"}, "data has dtype <U1"),
        ({"data": np.array([None]), "device": "cpu", "out": torch.zeros(1)}, "data has dtype object"),
        ({"data": [[1, 2], [3]], "device": "cpu"}, "data must be a rectangular nested sequence"),
        ({"data": {"a": 1}, "device": "cpu"}, "data must be a numpy array, .* got dict"),
        ({"data": [1], "device": "cpu", "dtype": "bogus"}, "dtype must be a torch.dtype or a numpy dtype"),
        ({"data": [1], "device": "cpu", "dtype": object}, "dtype must be a torch.dtype or a numpy dtype"),
        ({"data": [1], "device": "cpu", "out": np.zeros(1)}, "out must be a torch.Tensor, got ndarray"),
        (
            {"data": [1, 2], "device": "cpu", "out": torch.zeros(3)},
            r"out has shape \(3,\), but the data has shape \(2,\)",
        ),
        (
            {"data": [1.0], "device": "cpu", "dtype": torch.float16, "out": torch.zeros(1)},
            r"dtype \(torch.float16\) does not match out.dtype \(torch.float32\)",
        ),
        ({"data": [1, 2], "device": "cpu", "out": torch.zeros(1).expand(2)}, "out must be dense"),
        ({"data": [1], "device": "cpu", "out": torch.zeros(1, device="meta")}, "out is on meta, but device is cpu"),
        ({"data": [1], "device": "cpu", "stream": object()}, "stream must be None for device cpu"),
        ({"data": [1], "device": "cpu", "ring": object()}, "ring must be a PinnedRing or None, got object"),
    ],
)
def test_to_device_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_device(**kwargs)


@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    dtype=st.sampled_from([np.bool_, np.int64, np.float32, np.uint8, np.float16]),
    transpose=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_to_device_staged_equals_direct(shape: list[int], dtype, transpose: bool, seed: int) -> None:
    data = np.random.default_rng(seed).integers(0, 3, size=shape).astype(dtype)
    if transpose:
        data = data.T
    staged = to_device(data, "cpu", ring=_SHARED_RING)
    assert staged.dtype == to_device(data, "cpu").dtype
    np.testing.assert_array_equal(staged.numpy(), data)


_SHARED_RING = PinnedRing(slot_bytes=KiB, num_slots=2)

# --------------------------------------------------------------------------- PinnedRing


class FakeEvent:
    """Stands in for torch.cuda.Event: pending until completed by the test or by synchronize()."""

    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def small_ring(
    num_slots: int = 2, slot_bytes: int = KiB, max_slots: int | None = None, consumer_copy_bytes: int = 0
) -> PinnedRing:
    """A ring of ``num_slots`` slots of ``slot_bytes``; by default every copy may take the copy stream."""
    return PinnedRing(
        slot_bytes=slot_bytes,
        num_slots=num_slots,
        max_pinned_bytes=slot_bytes * (max_slots or num_slots),
        consumer_copy_bytes=consumer_copy_bytes,
    )


def stage_pointer(ring: PinnedRing, event: FakeEvent | None = None, nbytes: int = 16) -> int:
    """Stage nbytes, note the slot's address, release the slot guarded by event."""
    staged = ring.stage(nbytes, np.uint8)
    pointer = staged.array.ctypes.data
    staged.release(event)
    return pointer


def test_ring_starts_with_its_slots() -> None:
    stats = PinnedRing(slot_bytes=2 * KiB, num_slots=3, max_pinned_bytes=64 * KiB).stats()
    assert (stats.slots, stats.pinned_bytes, stats.leased, stats.copies, stats.grows) == (3, 6 * KiB, 0, 0, 0)
    assert stats.pinned == torch.cuda.is_available()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slot_bytes": 0}, "slot_bytes must be >= 1, got 0"),
        ({"slot_bytes": 1.5}, "slot_bytes must be an integer, got 1.5"),
        ({"num_slots": 0}, "num_slots must be >= 1, got 0"),
        ({"num_slots": True}, "num_slots must be an integer, got True"),
        ({"consumer_copy_bytes": -1}, "consumer_copy_bytes must be >= 0, got -1"),
        (
            {"slot_bytes": KiB, "num_slots": 4, "max_pinned_bytes": 3 * KiB},
            "max_pinned_bytes must be >= .* = 4096, got 3072",
        ),
    ],
)
def test_ring_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PinnedRing(**kwargs)


def test_ring_views_alias_the_slot_and_copies_do_not() -> None:
    ring = small_ring()
    with ring.stage((2, 3), np.int32) as staged:
        staged.array[:] = np.arange(6).reshape(2, 3)
        assert staged.array.flags.c_contiguous and staged.array.flags.writeable
        assert staged.array.ctypes.data == staged.tensor.data_ptr()
        assert staged.tensor.tolist() == [[0, 1, 2], [3, 4, 5]]  # written through numpy, seen by torch
        result = staged.to("cpu")
    assert result.data_ptr() != staged_pointer_of(ring)
    assert result.dtype == torch.int32 and result.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_ring_checks_every_stage_whose_layout_it_remembers() -> None:
    ring = small_ring()
    for _ in range(2):  # the second round stages the same (shape, dtype) again: from the remembered layout
        with ring.stage((2, 3), np.int16) as staged:
            assert staged.array.shape == (2, 3) and staged.array.dtype == np.int16
            staged.array.shape = (3, 2)  # reshaping the view handed out leaves the ring's own view as it was
            staged.array[:] = 7
            assert staged.to("cpu").tolist() == [[7, 7, 7], [7, 7, 7]]
    with ring.stage(1, np.uint8) as staged:
        staged.release()
    for shape in (True, (True, 3), (np.True_,)):  # equal and hash-equal to 1, (1, 3), (1,): still refused
        with pytest.raises(ValueError, match="must be an integer, got (np.)?True"):
            ring.stage(shape, np.uint8)
    with ring.stage([2, 3], np.int16) as staged:  # an unhashable shape: checked, not remembered
        assert staged.array.shape == (2, 3)


def staged_pointer_of(ring: PinnedRing) -> int:
    with ring.stage(1, np.uint8) as staged:
        return staged.tensor.data_ptr()


def test_ring_reuses_a_released_slot_and_never_hands_out_a_leased_one() -> None:
    ring = small_ring(num_slots=2)
    first = ring.stage(8, np.uint8)
    second = ring.stage(8, np.uint8)
    assert first.array.ctypes.data != second.array.ctypes.data
    pointer = first.array.ctypes.data
    first.release()
    with ring.stage(8, np.uint8) as third:
        assert third.array.ctypes.data == pointer
    second.release()
    assert ring.stats().leased == 0


def test_ring_waits_for_the_oldest_copy_only_at_the_bound() -> None:
    ring = small_ring(num_slots=2)
    events = [FakeEvent(), FakeEvent()]
    pointers = [stage_pointer(ring, event) for event in events]
    assert stage_pointer(ring) == pointers[0]  # both in flight, no room to grow: wait for the older one
    assert events[0].waited == 1 and events[1].waited == 0
    stats = ring.stats()
    assert (stats.slot_waits, stats.grows, stats.slots) == (1, 0, 2)


def test_ring_reuses_a_slot_without_waiting_once_its_copy_completed() -> None:
    ring = small_ring(num_slots=1)
    event = FakeEvent()
    pointer = stage_pointer(ring, event)
    event.done = True
    assert stage_pointer(ring) == pointer
    assert event.waited == 0 and ring.stats().slot_waits == 0


def test_ring_grows_rather_than_waits_below_the_bound() -> None:
    ring = small_ring(num_slots=2, max_slots=3)
    events = [FakeEvent(), FakeEvent()]
    pointers = [stage_pointer(ring, event) for event in events]
    grown = stage_pointer(ring, FakeEvent())
    assert grown not in pointers
    stats = ring.stats()
    assert (stats.grows, stats.slots, stats.slot_waits, stats.pinned_bytes) == (1, 3, 0, 3 * KiB)
    stage_pointer(ring)  # now at the bound: waits
    assert ring.stats().slot_waits == 1


def test_ring_grows_a_larger_slot_once_and_keeps_it() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=2, max_pinned_bytes=16 * KiB)
    with ring.stage(3 * KiB, np.uint8) as staged:  # rounds up to a 4 KiB slot
        big = staged.array.ctypes.data
    with ring.stage(3 * KiB + 1, np.uint8) as staged:
        assert staged.array.ctypes.data == big
    with ring.stage(10, np.uint8) as staged:  # small requests keep to small slots
        assert staged.array.ctypes.data != big
    stats = ring.stats()
    assert (stats.grows, stats.slots, stats.pinned_bytes, stats.evictions) == (1, 3, 6 * KiB, 0)


def test_ring_grows_small_slots_for_copies_that_ride_the_consumer() -> None:
    ring = PinnedRing(slot_bytes=MiB, num_slots=1, max_pinned_bytes=4 * MiB, consumer_copy_bytes=256 * KiB)
    sizes = []
    for nbytes in (16, 16, 200 * KiB, 300 * KiB):  # each in flight while the next is staged: the ring grows
        sizes.append(ring.stage(nbytes, np.uint8)._slot.capacity)  # type: ignore[union-attr]
    assert sizes == [MiB, SMALL_SLOT_BYTES, 256 * KiB, MiB]  # the first takes the idle slot; then per request


def test_a_small_copy_frees_a_slot_of_its_size_before_it_takes_a_large_idle_one() -> None:
    ring = PinnedRing(slot_bytes=MiB, num_slots=1, max_pinned_bytes=4 * MiB, consumer_copy_bytes=256 * KiB)
    large = ring.stage(16, np.uint8)  # the only slot: taken, since none of its size exists yet
    small = ring.stage(16, np.uint8)  # grows one of its size
    small_pointer = small.array.ctypes.data
    event = FakeEvent()
    small.release(event)  # its copy in flight
    large.release()  # idle
    event.done = True
    with ring.stage(16, np.uint8) as again:  # asks about its own size's copy rather than take the 1 MiB slot
        assert again.array.ctypes.data == small_pointer
    assert ring.stats().grows == 1


def test_small_slots_grow_in_segments_that_double_within_the_bound() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=1, max_pinned_bytes=40 * KiB, consumer_copy_bytes=KiB)
    held = [ring.stage(16, np.uint8) for _ in range(40)]  # all leased at once: none can be reused
    stats = ring.stats()
    # The first slot, then blocks of 1, 2, 4, 8, 16 slots (32 held) and, in the 8 KiB left, one of 8.
    assert (stats.slots, stats.grows, stats.pinned_bytes) == (40, 6, 40 * KiB)
    for i, staged in enumerate(held):
        staged.array[:] = i
    assert [int(staged.array[0]) for staged in held] == list(range(40))  # no two slots share memory
    for staged in held:
        staged.release()


def test_a_segment_is_dropped_whole_and_only_once_every_slot_of_it_is_idle() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=1, max_pinned_bytes=8 * KiB, consumer_copy_bytes=KiB)
    held = [ring.stage(16, np.uint8) for _ in range(4)]  # the first slot, then blocks of 1 and of 2 slots
    assert (ring.stats().grows, ring.stats().pinned_bytes) == (2, 4 * KiB)
    leased = held[3]  # in the 2-slot segment
    for staged in held[:3]:
        staged.release()
    with pytest.raises(RuntimeError, match="cannot stage 8192 bytes"):  # its segment frees nothing yet
        ring.stage(8 * KiB, np.uint8)
    assert (ring.stats().slots, ring.stats().evictions) == (4, 0)
    leased.release()
    with ring.stage(8 * KiB, np.uint8):
        pass
    stats = ring.stats()
    assert (stats.slots, stats.pinned_bytes, stats.evictions) == (1, 8 * KiB, 4)


def test_ring_drops_idle_small_slots_to_make_room() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=4, max_pinned_bytes=4 * KiB)
    with ring.stage(4 * KiB, np.uint8) as staged:
        staged.array[:] = 7
        assert staged.to("cpu").sum().item() == 7 * 4 * KiB
    stats = ring.stats()
    assert (stats.slots, stats.pinned_bytes, stats.evictions, stats.grows) == (1, 4 * KiB, 4, 1)


def test_ring_waits_for_an_in_flight_small_slot_to_make_room() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=2, max_pinned_bytes=2 * KiB)
    events = [FakeEvent(), FakeEvent()]
    for event in events:
        stage_pointer(ring, event)
    with ring.stage(2 * KiB, np.uint8):
        pass
    assert [event.waited for event in events] == [1, 1]
    stats = ring.stats()
    assert (stats.slots, stats.slot_waits, stats.evictions) == (1, 2, 2)


def test_ring_refuses_a_request_over_the_bound() -> None:
    ring = small_ring(num_slots=2)
    with pytest.raises(ValueError, match=r"a request of 2049 bytes exceeds max_pinned_bytes=2048"):
        ring.stage(2 * KiB + 1, np.uint8)
    assert ring.stats().leased == 0


def test_ring_says_so_when_every_slot_is_staged() -> None:
    ring = small_ring(num_slots=1)
    with ring.stage(8, np.uint8), pytest.raises(RuntimeError, match="all 1 slots .* are staged and not yet submitted"):
        ring.stage(8, np.uint8)


def test_ring_counts_copies_and_bytes() -> None:
    ring = small_ring()
    for n in (10, 20, 30):
        with ring.stage(n, np.uint8) as staged:
            staged.to("cpu")
    with ring.stage(5, np.uint8):  # released unused: not a copy
        pass
    stats = ring.stats()
    assert (stats.copies, stats.bytes_copied, stats.leased) == (3, 60, 0)


def test_ring_packs_arrays_at_aligned_offsets() -> None:
    ring = PinnedRing(slot_bytes=4 * KiB, num_slots=1, max_pinned_bytes=4 * KiB)
    specs = [((3,), np.bool_), ((2, 5), np.float32), ((), np.int64), ((0, 4), np.float16), ((7,), np.uint8)]
    with ring.stage_many(specs) as staged:
        base = staged.tensors[0].data_ptr()
        assert base % 64 == 0  # CPU allocations are 64-byte aligned, pinned ones page aligned
        for array, tensor, (shape, dtype) in zip(staged.arrays, staged.tensors, specs, strict=True):
            assert array.shape == shape and array.dtype == dtype
            assert (array.ctypes.data - base) % VIEW_ALIGN_BYTES == 0
            if array.size:  # torch reports address 0 for empty tensors
                assert tensor.data_ptr() == array.ctypes.data
        for i, array in enumerate(staged.arrays):
            array[...] = i + 1
        results = staged.to_many("cpu")
    assert [tuple(r.shape) for r in results] == [shape for shape, _ in specs]
    assert [r.dtype for r in results] == [torch.bool, torch.float32, torch.int64, torch.float16, torch.uint8]
    assert [r.float().mean().item() for r in results if r.numel()] == [1.0, 2.0, 3.0, 5.0]
    assert ring.stats().bytes_copied == 3 * VIEW_ALIGN_BYTES + 7  # the empty array takes no room


def test_staged_guards_its_life_cycle() -> None:
    ring = small_ring()
    staged = ring.stage_many([(2, np.uint8), (2, np.uint8)])
    with pytest.raises(ValueError, match="this slot holds 2 arrays; use .arrays"):
        staged.to("cpu")
    staged.to_many("cpu")
    for use in (lambda: staged.arrays, lambda: staged.to_many("cpu"), staged.release):
        with pytest.raises(RuntimeError, match="already submitted or released"):
            use()
    with (
        pytest.raises(ValueError, match="dtype torch.bfloat16 has no numpy equivalent"),
        ring.stage(2, torch.bfloat16) as bf16,
    ):
        bf16.array  # noqa: B018
    with pytest.raises(ValueError, match=r"shape of array 0\[1\] must be >= 0, got -1"):
        ring.stage((2, -1), np.uint8)
    with pytest.raises(ValueError, match="specs must name at least one"):
        ring.stage_many([])
    assert ring.stats().leased == 0


def test_staged_copies_into_out_and_checks_it() -> None:
    ring = small_ring()
    with ring.stage(3, np.int64) as staged:
        staged.array[:] = [4, 5, 6]
        with pytest.raises(ValueError, match="out has dtype torch.int32, expected torch.int64"):
            staged.to("cpu", out=torch.zeros(3, dtype=torch.int32))
        out = torch.zeros(3, dtype=torch.int64)
        assert staged.to("cpu", out=out) is out
    assert out.tolist() == [4, 5, 6]


def test_ring_is_safe_for_several_producer_threads() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=2, max_pinned_bytes=8 * KiB)
    errors: list[str] = []
    rounds = 200

    def produce(tag: int) -> None:
        for i in range(rounds):
            with ring.stage(64, np.uint8) as staged:
                staged.array[:] = tag
                threading.Event().wait(0.0001 * (i % 3))  # let the other threads interleave
                if not (staged.array == tag).all():
                    errors.append(f"thread {tag} saw its slot overwritten")
                if not (staged.to("cpu") == tag).all():
                    errors.append(f"thread {tag} copied another thread's data")

    threads = [threading.Thread(target=produce, args=(tag,)) for tag in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = ring.stats()
    assert stats.copies == 4 * rounds and stats.leased == 0 and stats.pinned_bytes <= 8 * KiB


# --------------------------------------------------------------------------- the CUDA submit, simulated


class FakeStream:
    made = 0  # streams made so far: each gets an id of its own, as torch's do

    def __init__(self, name: str, log: list[str], idle: bool = False) -> None:
        self.name = name
        self.log = log
        self.idle = idle  # whether all work queued on it has run
        FakeStream.made += 1
        self.stream_id, self.device_index, self.device_type = FakeStream.made, -1, 0

    def query(self) -> bool:
        return self.idle

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")

    def wait_event(self, event: FakeCudaEvent) -> None:
        self.log.append(f"{self.name} waits for {event.name}")


class FakeCudaEvent(FakeEvent):
    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__()
        self.name = name
        self.log = log

    def record(self, stream: FakeStream) -> None:
        assert not self.waited or self.done, f"{self.name} re-recorded before its last record completed"
        self.done = False
        self.log.append(f"{self.name} recorded on {stream.name}")

    def query(self) -> bool:
        self.log.append(f"{self.name} queried")
        return super().query()

    def wait(self, stream: FakeStream) -> None:
        self.log.append(f"{stream.name} waits for {self.name}")


class FakeCuda:
    """torch.cuda's streams and events as stand-ins that log what the submit does; ``meta`` plays the GPU."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[str] = []
        self.events: list[FakeCudaEvent] = []
        self.consumer = self.current = FakeStream("consumer", self.log)
        real_empty, real_copy, real_to = torch.empty, torch.Tensor.copy_, torch.Tensor.to

        def empty(*args, **kwargs):
            if kwargs.get("device") is not None:
                self.log.append(f"allocate on {self.current.name}")
            return real_empty(*args, **kwargs)

        def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
            if dst.device.type == "meta":
                self.log.append(f"copy on {self.current.name}{' non_blocking' if non_blocking else ''}")
            return real_copy(dst, src, non_blocking)

        def to(src: torch.Tensor, *args, **kwargs) -> torch.Tensor:  # a host->meta .to(): allocation and copy
            result = real_to(src, *args, **kwargs)
            if result.device.type == "meta" and src.device.type != "meta":
                self.log.append(f"allocate on {self.current.name}")
                self.log.append(f"copy on {self.current.name}{' non_blocking' if kwargs.get('non_blocking') else ''}")
            return result

        monkeypatch.setattr(torch, "empty", empty)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, stream: self.log.append(f"used on {stream.name}"))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream("copy", self.log))
        monkeypatch.setattr(torch.cuda, "stream", self.stream)
        monkeypatch.setattr(torch.cuda, "set_stream", self.set_stream)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: META.index)  # the meta "GPU" is current
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: self.log.append(f"set device {device}"))
        monkeypatch.setattr(torch.cuda, "Event", self.event)

    @contextlib.contextmanager
    def stream(self, stream: FakeStream):
        previous, self.current = self.current, stream
        self.log.append(f"enter {stream.name}")
        try:
            yield
        finally:
            self.current = previous
            self.log.append(f"exit {stream.name}")

    def set_stream(self, stream: FakeStream) -> None:
        self.current = stream
        self.log.append(f"current stream {stream.name}")

    def event(self) -> FakeCudaEvent:
        self.events.append(FakeCudaEvent(f"event {len(self.events)}", self.log))
        return self.events[-1]


META = torch.device("meta")


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda(monkeypatch)


def test_submit_copies_on_the_copy_stream_and_guards_everything(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=1)
    with ring.stage((2, 3), np.float32) as staged:
        result = staged._to(META, None, None)
    assert (result.device, tuple(result.shape), result.dtype) == (META, (2, 3), torch.float32)
    assert fake_cuda.log == [
        "current stream copy",
        "allocate on copy",  # the copy stream's pool: never a block the consumer's queued work still reads
        "copy on copy non_blocking",
        "current stream consumer",
        "event 0 recorded on copy",  # as the slot joins the copy stream's queue, under the ring's lock
        "consumer waits for event 0",
        "used on consumer",  # not reused before the consumer's work queued so far has run
    ]
    stage_pointer(ring)  # one slot, its copy in flight: the ring waits for exactly that copy's event
    assert fake_cuda.events[0].waited == 1 and ring.stats().slot_waits == 1


def test_a_slot_records_its_own_event_again_only_once_the_last_copy_completed(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=2)
    for _ in range(6):
        with ring.stage(3, np.int64) as staged:
            staged._to(META, None, None)
        for event in fake_cuda.events:
            event.done = True  # the copies complete
    assert [event.name for event in fake_cuda.events] == ["event 0", "event 1"]  # one event per slot, made once
    assert fake_cuda.log.count("event 0 recorded on copy") == fake_cuda.log.count("event 1 recorded on copy") == 3
    # FakeCudaEvent.record asserts that no event is recorded again before it completed


def queries(fake_cuda: FakeCuda) -> list[str]:
    """The event queries logged since the log was last cleared, then clear it."""
    asked = [line for line in fake_cuda.log if "queried" in line]
    fake_cuda.log.clear()
    return asked


def stage_and_release(ring: PinnedRing) -> None:
    with ring.stage(3, np.int64):
        pass


def submit_four(fake_cuda: FakeCuda, ring: PinnedRing) -> None:
    for _ in range(4):
        with ring.stage(3, np.int64) as staged:
            staged._to(META, None, None)
    fake_cuda.log.clear()


def test_acquire_asks_about_the_newest_copy_first_and_then_knows_the_older_ones_completed(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=4)
    submit_four(fake_cuda, ring)  # on the copy stream: the consumer is busy
    for event in fake_cuda.events:
        event.done = True
    stage_and_release(ring)
    assert queries(fake_cuda) == ["event 3 queried"]  # the newest copy on the slot's stream has completed ...
    for _ in range(3):
        stage_and_release(ring)  # ... so every older slot is free: no driver call at all
        assert queries(fake_cuda) == []
    assert ring.stats().slot_waits == 0


def test_acquire_asks_about_the_slots_own_copy_when_the_newest_is_still_running(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=4)
    submit_four(fake_cuda, ring)
    fake_cuda.events[0].done = fake_cuda.events[1].done = True  # the two oldest copies completed
    stage_and_release(ring)
    assert queries(fake_cuda) == ["event 3 queried", "event 0 queried"]  # in reuse order, stopping at the first idle
    stage_and_release(ring)  # that slot was released unused: known idle, the most recently released, and hot
    assert queries(fake_cuda) == []
    fake_cuda.events[1].done = True
    with ring.stage(3, np.int64):  # leased: the next acquire knows of no idle slot, and asks
        stage_and_release(ring)
    assert queries(fake_cuda) == ["event 3 queried", "event 1 queried"]


def test_an_idle_consumer_tells_the_ring_its_earlier_copies_completed(fake_cuda: FakeCuda) -> None:
    fake_cuda.consumer.idle = True  # the copies run on the consumer, and each submit finds it idle
    ring = small_ring(num_slots=2)
    for _ in range(5):
        with ring.stage(3, np.int64) as staged:
            staged._to(META, None, None)
    # No event ever reported completion: the submit's own query of the consumer said so.
    assert queries(fake_cuda) == [] and not any(event.done for event in fake_cuda.events)
    assert ring.stats().slot_waits == 0


def test_acquire_prefers_the_most_recently_released_slot_known_idle(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=4)
    submit_four(fake_cuda, ring)
    for event in fake_cuda.events:
        event.done = True
    stage_and_release(ring)  # asks once (the newest), then knows every slot idle
    pointers = [stage_pointer(ring) for _ in range(3)]  # each released unused: the same (hot) slot again
    assert len(set(pointers)) == 1 and queries(fake_cuda) == ["event 3 queried"]


def test_acquire_asks_about_two_copies_at_most_when_a_stream_is_still_running(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=8, max_slots=9, consumer_copy_bytes=KiB)  # copies ride the busy consumer
    submit_four(fake_cuda, ring)
    submit_four(fake_cuda, ring)
    stage_and_release(ring)  # all 8 in flight: the newest and the oldest are asked, the rest inferred; it grows
    assert queries(fake_cuda) == ["event 7 queried", "event 0 queried"] and ring.stats().grows == 1


def test_a_small_copy_takes_an_idle_large_slot_without_asking_where_none_of_its_size_exists(
    fake_cuda: FakeCuda,
) -> None:
    ring = small_ring(num_slots=2, slot_bytes=2 * SMALL_SLOT_BYTES, consumer_copy_bytes=KiB)
    for _ in range(2):  # the first copy holds one large slot; the second takes the other at once
        with ring.stage(16, np.uint8) as staged:
            staged._to(META, None, None)
    assert queries(fake_cuda) == [] and ring.stats().grows == 0


def test_a_large_request_frees_every_completed_small_copy_with_few_questions(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=1, max_slots=200, consumer_copy_bytes=KiB)
    for _ in range(100):  # small copies riding the busy consumer: each holds a slot of its own
        with ring.stage(16, np.uint8) as staged:
            staged._to(META, None, None)
    assert (ring.stats().slots, ring.stats().grows) == (128, 7)  # the first, then segments of 1, 2, 4, ... 64
    for event in fake_cuda.events[:60]:
        event.done = True  # the queue has reached the 60 oldest copies
    fake_cuda.log.clear()
    with ring.stage(2 * KiB, np.uint8):  # fits no small slot: frees the completed ones, then grows
        pass
    asked = queries(fake_cuda)
    assert len(asked) <= 2 + 2 * 7, asked  # the newest, the oldest, then doubling and bisecting: not 60
    assert asked[:2] == ["event 99 queried", "event 0 queried"]
    idle = {capacity: len(slots) for capacity, slots in ring._pool._idle.items() if slots}
    assert idle == {KiB: 28 + 60, 2 * KiB: 1}  # never used, the 60 completed, not one more; and the new one
    held = [ring.stage(16, np.uint8) for _ in range(88)]  # every completed slot is free now: no more questions
    assert queries(fake_cuda) == [] and ring.stats().grows == 8  # 7 blocks of small slots and the 2 KiB one
    for staged in held:
        staged.release()


def test_what_the_ring_knows_about_one_stream_frees_no_slot_of_another(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=2)
    with ring.stage(3, np.int64) as staged:
        staged._to(META, None, None)  # busy consumer: on the copy stream, event 0, number 1
    fake_cuda.consumer.idle = True
    with ring.stage(3, np.int64) as staged:
        staged._to(META, None, None)  # idle consumer: every event numbered <= 1 on the consumer completed
    fake_cuda.log.clear()
    stage_and_release(ring)  # event 0 (the copy stream) may still be running: ask, then wait for it
    assert queries(fake_cuda) == ["event 0 queried", "event 1 queried"]
    assert fake_cuda.events[0].waited == 1 and ring.stats().slot_waits == 1


@pytest.mark.parametrize("nbytes", [16, 2 * KiB])  # on the consumer (the small path) and on the copy stream
def test_a_copy_is_recorded_under_the_ring_lock_as_it_joins_its_streams_queue(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch, nbytes: int
) -> None:
    """Two threads copying on one stream must queue their slots in the order of their records.

    The ring infers from the newest record's completion that every slot in the
    stream's queue is free: a record made outside the lock could land in the
    queue before an older one and free a slot whose copy is still running.
    """
    ring = small_ring(num_slots=1, slot_bytes=4 * KiB, consumer_copy_bytes=KiB)
    held = []
    real_record = FakeCudaEvent.record

    def record(event: FakeCudaEvent, stream: FakeStream) -> None:
        held.append(ring._pool.lock.locked())
        real_record(event, stream)

    monkeypatch.setattr(FakeCudaEvent, "record", record)
    with ring.stage(nbytes, np.uint8) as staged:
        staged._to(META, None, None)
    assert held == [True]


class SimulatedGpu:
    """Runs the fake streams' recorded events in record order, as a GPU does, and never otherwise."""

    def __init__(self, fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queues: dict[str, list[FakeCudaEvent]] = {}
        self.stream_of: dict[int, str] = {}
        self.consumer = fake_cuda.consumer
        real_record, real_synchronize = FakeCudaEvent.record, FakeCudaEvent.synchronize
        gpu = self

        def record(event: FakeCudaEvent, stream: FakeStream) -> None:
            real_record(event, stream)
            gpu.queues.setdefault(stream.name, []).append(event)
            gpu.stream_of[id(event)] = stream.name
            if stream is gpu.consumer and gpu.consumer.idle:
                gpu.consumer.idle = False  # the copy just queued there has not run yet

        def synchronize(event: FakeCudaEvent) -> None:  # waiting for a record runs every record before it
            queue = gpu.queues[gpu.stream_of[id(event)]]
            gpu.advance(gpu.stream_of[id(event)], queue.index(event) + 1)
            real_synchronize(event)

        monkeypatch.setattr(FakeCudaEvent, "record", record)
        monkeypatch.setattr(FakeCudaEvent, "synchronize", synchronize)

    def advance(self, stream: str, count: int) -> None:
        queue = self.queues.get(stream, [])
        for event in queue[:count]:
            event.done = True
        del queue[:count]
        if stream == "consumer" and not queue:
            self.consumer.idle = True


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["small", "large", "unused"])),
            st.tuples(st.just("advance"), st.sampled_from(["consumer", "copy"]), st.integers(1, 6)),
        ),
        max_size=60,
    )
)
def test_no_slot_is_handed_out_before_its_last_copy_has_run(operations: list[tuple]) -> None:
    """Random interleavings of small copies (on the consumer), large ones (on the copy stream while the
    consumer is busy), unused stages and GPU progress: every slot staged must have no copy still queued."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        fake_cuda = FakeCuda(monkeypatch)
        gpu = SimulatedGpu(fake_cuda, monkeypatch)
        # Small copies grow SMALL_SLOT_BYTES slots, large ones slot_bytes slots: a large request
        # behind completed small copies frees them all (_free_completed).
        ring = small_ring(num_slots=2, slot_bytes=2 * SMALL_SLOT_BYTES, max_slots=6, consumer_copy_bytes=64)
        for operation in operations:
            if operation[0] == "advance":
                gpu.advance(operation[1], operation[2])
                continue
            nbytes = {"small": 16, "large": 2 * SMALL_SLOT_BYTES, "unused": 16}[operation[0]]
            with ring.stage(nbytes, np.uint8) as staged:
                slot = staged._slot
                assert slot is not None and (slot.event is None or slot.event.done), "a slot in flight was reused"
                if operation[0] != "unused":
                    staged._to(META, None, None)
        assert ring.stats().leased == 0 and ring.stats().pinned_bytes <= 6 * 2 * SMALL_SLOT_BYTES


def test_submit_on_another_device_puts_the_callers_device_back(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 7)  # the caller works on another device
    ring = small_ring(num_slots=1)
    with ring.stage(3, np.int64) as staged:
        staged._to(META, None, None)
    assert fake_cuda.log[fake_cuda.log.index("current stream consumer") + 1] == "set device 7"


def test_submit_on_an_idle_consumer_copies_there_without_cross_stream_sync(fake_cuda: FakeCuda) -> None:
    fake_cuda.consumer.idle = True  # nothing queued: the copy may start at once on the consumer itself
    ring = small_ring(num_slots=1)
    with ring.stage((2, 3), np.float32) as staged:
        staged._to(META, None, None)
    assert fake_cuda.log == [
        "allocate on consumer",  # stream-ordered with the consumer's own work: no record_stream needed
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]


def test_a_small_copy_rides_the_busy_consumer_and_a_large_one_the_copy_stream(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=2, slot_bytes=4 * KiB, consumer_copy_bytes=2 * KiB)
    assert not fake_cuda.consumer.query()  # work queued on it
    with ring.stage(2 * KiB, np.uint8) as staged:
        staged._to(META, None, None)
    assert fake_cuda.log == [  # no query of the consumer, no stream switch, no cross-stream wait
        "allocate on consumer",
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]
    fake_cuda.log.clear()
    with ring.stage(2 * KiB + 1, np.uint8) as staged:
        staged._to(META, None, None)
    assert fake_cuda.log[:3] == ["current stream copy", "allocate on copy", "copy on copy non_blocking"]
    assert PinnedRing().consumer_copy_bytes == DEFAULT_CONSUMER_COPY_BYTES == 64 * KiB


def test_to_device_copies_a_small_array_on_the_consumer_in_three_calls(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staging_module, "resolve_device", lambda device: META)  # the meta "GPU"
    ring = small_ring(num_slots=1, slot_bytes=2 * KiB, max_slots=3, consumer_copy_bytes=KiB)
    source = np.arange(6, dtype=np.int32).reshape(2, 3)[:, ::-1]  # strided, converted on the way
    result = to_device(source, "cuda", dtype=torch.int64, ring=ring)
    assert (result.device, tuple(result.shape), result.dtype) == (META, (2, 3), torch.int64)
    assert fake_cuda.log == [  # no query, no stream switch, no cross-stream wait
        "allocate on consumer",
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]
    staged_bytes = ring._pool.slots[0].array[: source.size * 8].view(np.int64).reshape(2, 3)
    assert staged_bytes.tolist() == source.tolist()
    stats = ring.stats()
    assert (stats.copies, stats.bytes_copied, stats.leased) == (1, 48, 0)
    fake_cuda.log.clear()
    to_device(source, "cuda", ring=ring)  # that copy is still queued: its slot is not reused
    assert fake_cuda.log[-1] == "event 1 recorded on consumer" and ring.stats().grows == 1
    with pytest.raises(ValueError, match="data has dtype <U1, which torch cannot hold"):
        to_device(np.array(["1"]), "cuda", dtype=torch.float32, ring=ring)  # refused as on the general path
    fake_cuda.log.clear()
    to_device(np.zeros(KiB // 4 + 1, dtype=np.float32), "cuda", ring=ring)  # over consumer_copy_bytes
    assert "copy on copy non_blocking" in fake_cuda.log  # the general path: the copy stream, the consumer busy


def test_submit_into_out_runs_on_the_busy_consumer_after_its_queued_work(fake_cuda: FakeCuda) -> None:
    ring = small_ring()
    out = torch.empty(3, device="meta")
    fake_cuda.log.clear()
    assert not fake_cuda.consumer.query()  # work queued on it
    with ring.stage(3, np.float32) as staged:
        assert staged._to(META, out, None) is out
    assert fake_cuda.log == [  # after the work that may still read out, with no cross-stream handoff
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]


def test_submit_into_out_on_a_given_stream_waits_for_the_consumer_first(fake_cuda: FakeCuda) -> None:
    ring = small_ring()
    out = torch.empty(3, device="meta")
    fake_cuda.log.clear()
    with ring.stage(3, np.float32) as staged:
        assert staged._to(META, out, ring.copy_stream(META)) is out
    assert fake_cuda.log == [
        "copy waits for consumer",  # work queued before may still read out
        "current stream copy",
        "copy on copy non_blocking",
        "current stream consumer",
        "event 0 recorded on copy",
        "consumer waits for event 0",
    ]


def test_submit_on_the_consumer_stream_needs_no_cross_stream_wait(fake_cuda: FakeCuda) -> None:
    ring = small_ring()
    with ring.stage(3, np.int64) as staged:
        staged._to(META, None, fake_cuda.consumer)
    assert fake_cuda.log == [  # no stream switch, no cross-stream wait, no record_stream
        "allocate on consumer",
        "copy on consumer non_blocking",
        "event 0 recorded on consumer",
    ]


def test_packed_submit_is_one_copy_with_views(fake_cuda: FakeCuda) -> None:
    ring = small_ring(num_slots=1, slot_bytes=4 * KiB)
    with ring.stage_many([((2, 2), np.bool_), ((3,), np.int64)]) as staged:
        mask, lengths = staged._submit(META, None, None)
    assert (tuple(mask.shape), mask.dtype, tuple(lengths.shape), lengths.dtype) == (
        (2, 2),
        torch.bool,
        (3,),
        torch.int64,
    )
    assert mask.untyped_storage().nbytes() == VIEW_ALIGN_BYTES + 24  # both in one allocation
    assert fake_cuda.log.count("copy on copy non_blocking") == 1
    assert fake_cuda.log[-2:] == ["consumer waits for event 0", "used on consumer"]


def test_the_copy_stream_is_made_once_per_device(fake_cuda: FakeCuda) -> None:
    ring = small_ring()
    assert ring.copy_stream(META) is ring.copy_stream(META)


# --------------------------------------------------------------------------- sync_check


@pytest.mark.parametrize(
    ("source", "target", "non_blocking", "pinned", "dense", "verdict"),
    [
        ("cpu", "cuda", True, False, True, CopyVerdict.PAGEABLE),
        ("cpu", "cuda:1", True, False, False, CopyVerdict.PAGEABLE),
        ("cpu", "cuda", True, True, False, CopyVerdict.NOT_DENSE),
        ("cpu", "cuda", True, True, True, CopyVerdict.OK),
        ("cpu", "cuda", False, False, False, CopyVerdict.OK),
        ("cpu", "cpu", True, False, False, CopyVerdict.OK),
        ("cuda", "cpu", True, False, False, CopyVerdict.OK),
        ("cuda:0", "cuda:1", True, False, False, CopyVerdict.OK),
        ("cpu", "meta", True, False, True, CopyVerdict.PAGEABLE),
        (torch.device("cpu"), torch.device("cuda", 0), True, True, True, CopyVerdict.OK),
    ],
)
def test_classify_copy(source, target, non_blocking: bool, pinned: bool, dense: bool, verdict: CopyVerdict) -> None:
    assert (
        classify_copy(source_device=source, target_device=target, non_blocking=non_blocking, pinned=pinned, dense=dense)
        is verdict
    )


@pytest.mark.parametrize("method", ["to", "copy_"])
def test_sync_check_raises_on_a_pageable_non_blocking_copy(method: str) -> None:
    source = torch.ones(4, 4)
    with sync_check() as check, pytest.raises(UnsafeCopyError, match="reads pageable memory"):
        direct_copy(source, "meta", method=method)
    assert [flag.verdict for flag in check.flagged] == [CopyVerdict.PAGEABLE]
    assert check.flagged[0].nbytes == 64 and check.flagged[0].shape == (4, 4)


def test_sync_check_warns_and_lets_the_copy_run() -> None:
    with sync_check("warn") as check, pytest.warns(UnsafeCopyWarning, match="non_blocking host->device copy"):
        result = direct_copy(torch.ones(3), "meta")
    assert result.device.type == "meta"
    assert len(check.flagged) == 1


def test_sync_check_flags_a_strided_pinned_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)  # no pinned memory without CUDA
    with sync_check() as check:
        direct_copy(torch.ones(4, 4), "meta")  # pinned and dense: fine
        with pytest.raises(UnsafeCopyError, match="non-dense tensor"):
            direct_copy(torch.ones(4, 4)[:, ::2], "meta")
    assert [flag.verdict for flag in check.flagged] == [CopyVerdict.NOT_DENSE]


def test_sync_check_ignores_blocking_and_host_copies_and_to_device() -> None:
    with sync_check() as check:
        direct_copy(torch.ones(3), "meta", non_blocking=False)
        direct_copy(torch.ones(3), "cpu")
        torch.ones(3).to(torch.float16)
        to_device(np.ones((2, 2)), "cpu")
        to_device(np.ones((2, 2)), "cpu", ring=PinnedRing(slot_bytes=KiB, num_slots=1))
    assert check.flagged == []


def test_sync_check_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match=r"mode must be one of \('error', 'warn'\), got 'raise'"):
        sync_check("raise")


# --------------------------------------------------------------------------- benchmark script


@pytest.mark.skipif(torch.cuda.is_available(), reason="the H200 runs the full benchmark instead")
def test_bench_transfer_quick_runs_without_cuda(tmp_path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_transfer.py"
    out = tmp_path / "transfer.json"
    completed = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "GPU strategies skipped" in completed.stdout
    report = json.loads(out.read_text())
    assert report["entries"] == []
    assert report["skipped"] == [
        "pageable",
        "pin_per_copy",
        "ring",
        "ring_in_place",
        "staging_numpy",
        "staging_torch",
        "bare_copy",
    ]
    assert {row["method"] for row in report["staging"]} == {"stage_copy", "numpy_copyto", "torch_copy"}
    assert {"command", "date", "torch_version", "gpu", "driver", "cpu_count"} <= report.keys()
