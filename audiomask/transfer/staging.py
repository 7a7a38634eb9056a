"""``to_device``: move host data to a device through the pinned ring, without stalling the host."""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np
import torch

from audiomask.errors import PinnedMemoryWarning
from audiomask.transfer._resolve import (
    as_torch_dtype,
    check_out_tensor,
    check_stream,
    numpy_dtype,
    resolve_device,
    torch_dtype_of,
)
from audiomask.transfer.ring import MiB, PinnedRing

__all__ = [
    "FEW_THREADS_PARALLEL_COPY_BYTES",
    "LARGE_COPY_PIECES",
    "PARALLEL_COPY_BYTES",
    "PARALLEL_COPY_MIN_THREADS",
    "default_ring",
    "parallel_copy_bytes",
    "pinned_empty",
    "stage_copy",
    "to_device",
    "to_host",
]

# From this size the staging memcpy goes to torch's multi-threaded copy, when torch has at least
# PARALLEL_COPY_MIN_THREADS intra-op threads: on a host busy as a streaming server's is, torch's copy
# then moves several times what numpy's single thread does; below it numpy is as fast and has no
# parallel region to wake. A parallel region waits for its slowest thread, which costs milliseconds
# right after the host idled and on a loaded host of few cores, so with fewer threads numpy copies
# everything under FEW_THREADS_PARALLEL_COPY_BYTES. Figures: docs/defaults.md.
PARALLEL_COPY_BYTES = 1 * MiB
PARALLEL_COPY_MIN_THREADS = 4
FEW_THREADS_PARALLEL_COPY_BYTES = 32 * MiB
# A payload over a ring's max_pinned_bytes / LARGE_COPY_PIECES crosses in pieces along its first axis, a slot
# each: no copy needs the whole bound (one step's features of tens of thousands of streams exceed it), and the
# host fills the next piece's slot while the previous pieces cross the bus.
LARGE_COPY_PIECES = 4


def parallel_copy_bytes() -> int:
    """The payload size from which :func:`stage_copy` uses torch's multi-threaded copy, for this process now.

    >>> parallel_copy_bytes() in (PARALLEL_COPY_BYTES, FEW_THREADS_PARALLEL_COPY_BYTES)
    True
    """
    return (
        PARALLEL_COPY_BYTES if torch.get_num_threads() >= PARALLEL_COPY_MIN_THREADS else FEW_THREADS_PARALLEL_COPY_BYTES
    )


_DEFAULT_RINGS: dict[torch.device, PinnedRing] = {}
_DEFAULT_RINGS_LOCK = threading.Lock()


def default_ring(device: object) -> PinnedRing:
    """The module's persistent ring for ``device``, created with default sizes on first use.

    :func:`to_device` stages through it unless given another ring; read its
    :meth:`~PinnedRing.stats` to see how the copies went.
    """
    target = resolve_device(device)
    ring = _DEFAULT_RINGS.get(target)
    if ring is None:
        with _DEFAULT_RINGS_LOCK:
            if target not in _DEFAULT_RINGS:
                _DEFAULT_RINGS[target] = PinnedRing()
            ring = _DEFAULT_RINGS[target]
    return ring


def _host_source(data: object) -> np.ndarray | torch.Tensor:
    """``data`` without copying: a numpy array where its dtype allows, else a (detached) tensor."""
    if isinstance(data, torch.Tensor):
        if data.layout != torch.strided:
            raise ValueError(f"data must be a strided (dense-layout) tensor, got layout {data.layout}")
        data = data.detach()
        if data.device.type != "cpu" or numpy_dtype(data.dtype) is None:
            return data
        return data.resolve_conj().resolve_neg().numpy()
    if isinstance(data, (list, tuple, int, float, complex, np.generic)):
        try:
            data = np.asarray(data)
        except (ValueError, TypeError) as error:
            raise ValueError(f"data must be a rectangular nested sequence of numbers: {error}") from None
    if not isinstance(data, np.ndarray):
        raise ValueError(
            f"data must be a numpy array, a list or tuple, a number or a torch.Tensor, got {type(data).__name__}"
        )
    return data


def _source_dtype(source: np.ndarray | torch.Tensor) -> torch.dtype:
    if isinstance(source, torch.Tensor):
        return source.dtype
    try:
        return as_torch_dtype("data", source.dtype)
    except ValueError:
        raise ValueError(f"data has dtype {source.dtype}, which torch cannot hold") from None


def stage_copy(dst: torch.Tensor, source: np.ndarray | torch.Tensor) -> None:
    """Copy ``source`` into the host tensor ``dst`` of the same shape, converting the dtype: the staging memcpy.

    ``source`` is a numpy array (any strides, read-only included) or a CPU
    tensor. Payloads under :func:`parallel_copy_bytes` are copied by numpy,
    single-threaded: small copies have no parallel region to wake, and with
    few torch threads the single thread stays steady when other threads load
    the cores. Larger payloads are bandwidth-bound and go to torch's
    multi-threaded copy, as do dtypes numpy lacks (bfloat16).

    >>> dst = torch.empty(2, 3)
    >>> stage_copy(dst, np.arange(6).reshape(3, 2).T)
    >>> dst
    tensor([[0., 2., 4.],
            [1., 3., 5.]])
    """
    if isinstance(source, np.ndarray):
        if dst.nbytes < parallel_copy_bytes() and numpy_dtype(dst.dtype) is not None:
            np.copyto(dst.detach().numpy(), source, casting="unsafe")
            return
        if not source.dtype.isnative or any(stride < 0 for stride in source.strides):
            source = source.astype(source.dtype.newbyteorder("="), order="C")  # torch wraps neither
        if source.flags.writeable:
            source = torch.from_numpy(source)
        else:  # torch warns that it cannot protect read-only arrays (np.broadcast_to); they are only read here
            with warnings.catch_warnings():  # costs microseconds: only where the warning would come
                warnings.simplefilter("ignore", UserWarning)
                source = torch.from_numpy(source)
    dst.copy_(source)


def to_device(
    data: object,
    device: object,
    *,
    dtype: object = None,
    out: torch.Tensor | None = None,
    stream: torch.cuda.Stream | None = None,
    ring: PinnedRing | None = None,
) -> torch.Tensor:
    """Copy ``data`` to ``device`` without stalling the host, and return the device tensor.

    Args:
        data: a numpy array (any strides, read-only included), a (nested) list
            or tuple, a number, or a torch tensor. Numpy dtypes keep their torch
            counterpart (``bool -> torch.bool``, ``int64 -> torch.int64``);
            lists convert as ``numpy.asarray`` does (``[0.5]`` is float64).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device`` or a
            CUDA index. Without CUDA every CUDA device means the CPU.
        dtype: torch or numpy dtype of the result (default: ``out.dtype`` if
            ``out`` is given, else the data's); the conversion happens on the
            host while staging, so only result bytes cross the bus.
        out: a dense tensor on ``device`` of the data's shape to copy into,
            ordered after the work already queued on the current stream.
        stream: the CUDA stream that runs the copy (default: the current
            stream when ``out`` is given, for payloads up to the ring's
            ``consumer_copy_bytes`` (64 KiB), or when nothing is queued on it,
            else the ring's copy stream for the device).
        ring: the :class:`PinnedRing` to stage through (default:
            :func:`default_ring` for a CUDA device; on the CPU, the data is
            staged only if a ring is given).

    Host data is staged: copied (dense, converted) into a pinned ring slot,
    then copied to the device with ``non_blocking=True`` on the stream above;
    work queued on the current CUDA stream afterwards sees the result (a copy on
    the copy stream is waited for, and the caching allocator knows the result
    is used on the current stream), and the slot is reused only after the
    copy has completed. So the call costs the staging memcpy plus a submit,
    whatever the GPU queue holds, and the caller may reuse ``data`` as soon as
    it returns. A payload over the ring's ``max_pinned_bytes`` /
    :data:`LARGE_COPY_PIECES` (128 MiB of the default 512) crosses in pieces of
    whole rows of its first axis, a slot each, into one result (or a contiguous
    ``out``); only a single row over ``max_pinned_bytes`` is refused.

    The result never shares memory with host ``data``, on any device: for
    ``device="cpu"`` it is a fresh dense copy too, so code that refills a
    buffer after the call behaves the same with and without a GPU. Host
    tensors are detached. A tensor already on a non-CPU device is not staged:
    it is returned as it is when it is on ``device`` with the requested dtype,
    else converted with ``Tensor.to`` (or copied into ``out``).

    Raises ``ValueError`` naming the argument for an unknown device, an
    unsupported data type or dtype (object arrays, strings, ragged lists), or
    an ``out`` of the wrong shape, dtype or device.

    >>> to_device(np.array([[True, False]]), "cpu")
    tensor([[ True, False]])
    >>> to_device([1, 2, 3], "cpu", dtype=torch.float32)
    tensor([1., 2., 3.])
    >>> to_device(np.array(["a"]), "cpu")
    Traceback (most recent call last):
    ...
    ValueError: data has dtype <U1, which torch cannot hold
    """
    target = resolve_device(device)
    if ring is not None and not isinstance(ring, PinnedRing):
        raise ValueError(f"ring must be a PinnedRing or None, got {type(ring).__name__}")
    if type(data) is np.ndarray and out is None and stream is None and target.type != "cpu":
        held = torch_dtype_of(data.dtype)  # None: strings and objects, refused below whatever the dtype
        torch_dtype = held if dtype is None else dtype
        ring = ring or _DEFAULT_RINGS.get(target) or default_ring(target)
        if (
            held is not None
            and isinstance(torch_dtype, torch.dtype)
            and numpy_dtype(torch_dtype) is not None
            and data.size * torch_dtype.itemsize <= ring.consumer_copy_bytes
        ):
            return ring._copy_array(data, torch_dtype, target)
    source = _host_source(data)
    source_dtype = _source_dtype(source)  # refuses object and string arrays whatever the target dtype
    if dtype is None:
        dtype = out.dtype if isinstance(out, torch.Tensor) else source_dtype
    else:
        dtype = as_torch_dtype("dtype", dtype)
        if isinstance(out, torch.Tensor) and out.dtype != dtype:
            raise ValueError(f"dtype ({dtype}) does not match out.dtype ({out.dtype})")
    if out is not None:
        check_out_tensor(out, source.shape, dtype, target)
    check_stream(stream, target)

    if isinstance(source, torch.Tensor) and source.device.type != "cpu":
        return data.to(target, dtype=dtype) if out is None else out.copy_(source)  # type: ignore[union-attr]
    if target.type == "cpu" and ring is None:
        result = torch.empty(source.shape, dtype=dtype) if out is None else out
        stage_copy(result, source)
        return result
    ring = ring or default_ring(target)
    piece_bytes = ring.max_pinned_bytes // LARGE_COPY_PIECES
    if (
        source.ndim
        and source.shape[0] > 1
        and math.prod(source.shape) * dtype.itemsize > piece_bytes
        and (out is None or out.is_contiguous())
    ):
        return _to_device_in_pieces(source, target, dtype, out, stream, ring, piece_bytes)
    staged = ring._stage_checked(tuple(source.shape), dtype)
    try:
        stage_copy(staged._staging_views()[0], source)
        return staged._to(target, out, stream)
    except BaseException:
        if staged._slot is not None:  # not submitted: hand the slot back (a with block's cost, only on failure)
            staged.release()
        raise


def _to_device_in_pieces(
    source: np.ndarray | torch.Tensor,
    target: torch.device,
    dtype: torch.dtype,
    out: torch.Tensor | None,
    stream: torch.cuda.Stream | None,
    ring: PinnedRing,
    piece_bytes: int,
) -> torch.Tensor:
    """:func:`to_device` of a payload over ``piece_bytes``: rows of ``source``'s first axis, at most
    ``piece_bytes`` a piece (one row at least), each staged in a slot of ``ring``. Into ``out`` (contiguous),
    each piece is copied into its rows, after the work queued on the stream that copies it. Without ``out`` (and
    ``stream``) each piece crosses as :func:`to_device` copies a payload of its own (on the ring's copy stream
    while the current stream is busy, so that the ring's slots come back without waiting for that queue),
    and the pieces are joined on the device."""
    rows = len(source)
    per_piece = max(1, piece_bytes // (math.prod(source.shape[1:]) * dtype.itemsize))
    bounds = [(start, min(start + per_piece, rows)) for start in range(0, rows, per_piece)]
    if out is None and stream is None:
        return torch.cat([to_device(source[start:stop], target, dtype=dtype, ring=ring) for start, stop in bounds])
    if out is None:
        out = torch.empty(tuple(source.shape), dtype=dtype, device=target)
    for start, stop in bounds:
        to_device(source[start:stop], target, out=out[start:stop], stream=stream, ring=ring)
    return out


def pinned_empty(shape: int | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised host tensor of ``shape`` and ``dtype``, page-locked where CUDA is available.

    For results that come back from the device again and again (:func:`to_host`
    with ``out=``): allocate once, reuse every step. Where pinning fails (the
    locked-memory limit), the tensor is pageable and a
    :class:`~audiomask.errors.PinnedMemoryWarning` says so.

    >>> pinned_empty((2, 3), torch.int64).shape
    torch.Size([2, 3])
    """
    if not torch.cuda.is_available():
        return torch.empty(shape, dtype=dtype)
    try:
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    except RuntimeError as error:
        warnings.warn(
            f"could not pin a host tensor of shape {shape} ({str(error).strip().splitlines()[0]}); "
            "using pageable memory: copies into it make the host wait for the GPU",
            PinnedMemoryWarning,
            stacklevel=2,
        )
        return torch.empty(shape, dtype=dtype)


def to_host(tensor: torch.Tensor, *, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Start a copy of ``tensor`` to host memory without waiting for it; return ``(host, done)``.

    For a CUDA tensor the copy is ``non_blocking`` on the current CUDA stream into
    ``out`` (a pinned CPU tensor of the same shape and dtype, e.g. from
    :func:`pinned_empty`, reused by the caller once it has read it) or else a
    fresh pinned tensor (from torch's pinned-memory cache). A pageable ``out``
    (where pinning failed) gets a blocking copy and ``done=None``. ``done`` is a CUDA event recorded
    after it: read ``host`` only once ``done`` has completed
    (``done.synchronize()`` or ``done.query()``). A CPU tensor comes back as a
    copy (into ``out`` if given) with ``done=None``.

    >>> host, done = to_host(torch.arange(3))
    >>> host, done
    (tensor([0, 1, 2]), None)
    """
    if out is not None:
        check_out_tensor(out, tuple(tensor.shape), tensor.dtype, torch.device("cpu"))
    if tensor.device.type == "cpu" or (out is not None and not out.is_pinned()):
        # A pageable out (pinned_empty's fallback) takes a copy that waits for the device: done at once.
        return (tensor.clone() if out is None else out.copy_(tensor)), None
    host = pinned_empty(tuple(tensor.shape), tensor.dtype) if out is None else out
    host.copy_(tensor, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done
