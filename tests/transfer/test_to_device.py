"""audiomask.transfer on the CPU: is_dense against brute force, and to_device.

to_device: dtypes, lists and numbers, any layout made dense, never aliasing
host data, staging through a ring (multi-threaded copies from a size), the
fallback to the CPU without CUDA, bad arguments. The CUDA-only parts are in
test_transfer_gpu.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from audiomask.transfer import KiB, MiB, PinnedRing, _resolve, is_dense, staging, to_device

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
    ring = PinnedRing(slot_bytes=KiB, num_slots=1, max_pinned_bytes=128 * MiB)
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


@pytest.mark.parametrize("transpose", [False, True])
def test_to_device_copies_a_payload_over_the_bound_in_pieces_of_rows(transpose: bool) -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=2, max_pinned_bytes=16 * KiB)
    data = (
        np.random.default_rng(0).standard_normal((40, 100)).astype(np.float32)
    )  # 8,000 bytes as bfloat16, pieces of 4 KiB at most
    data = data.T.copy().T if transpose else data  # a column-major source: its rows are strided
    result = to_device(data, "cpu", dtype=torch.bfloat16, ring=ring)
    np.testing.assert_array_equal(
        result.float().numpy(), torch.from_numpy(np.ascontiguousarray(data)).bfloat16().float()
    )
    stats = ring.stats()
    rows_per_piece = 16 * KiB // staging.LARGE_COPY_PIECES // (100 * 2)  # 20 rows of 200 bytes
    assert stats.copies == -(-40 // rows_per_piece)
    assert stats.pinned_bytes <= ring.max_pinned_bytes and stats.leased == 0


def test_to_device_fills_a_contiguous_out_in_pieces_and_refuses_a_row_over_the_bound() -> None:
    ring = PinnedRing(slot_bytes=KiB, num_slots=2, max_pinned_bytes=16 * KiB)
    data = np.arange(3 * 4096, dtype=np.int32).reshape(3, 4096)  # rows of 16 KiB: one piece each
    out = torch.zeros(3, 4096, dtype=torch.int32)
    assert to_device(data, "cpu", out=out, ring=ring) is out
    np.testing.assert_array_equal(out.numpy(), data)
    assert ring.stats().copies == 3
    with pytest.raises(ValueError, match=r"a request of 16388 bytes exceeds max_pinned_bytes=16384"):
        to_device(np.zeros((2, 4097), np.int32), "cpu", ring=ring)
