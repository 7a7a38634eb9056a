"""A persistent ring of pinned host slots for stall-free, race-free host->device copies.

Why: a ``non_blocking`` copy from pageable memory stalls the host behind a busy
stream, and ``pin_memory()`` per copy costs 0.1-6 ms of host time (DESIGN.md).
A slot pinned once and reused costs neither, but reusing it while its last copy
is still in flight corrupts that copy. So every copy from a slot records a CUDA
event, and a slot is handed out again only once that event has completed.

A submit does as little as it can, since every call it makes costs ~10-20x
more when the host's caches are cold (right after the host waited, or after a
large memcpy; bench/probes/submit_costs_h200.txt): each slot owns one event,
created once and re-recorded by each copy from the slot (safe: a slot is
leased only once its last event has completed, and a stream that waits on an
event waits on the record made before the wait); the copy stream is switched
in and out through torch's C entry points, without a context manager, and not
at all when the copy runs on the current stream; the slot views the ring
copies through are made once; the result is allocated before the staging
memcpy, and from ``GATED_COPY_BYTES`` the whole submit goes before it, the copy
held on the GPU until the payload is staged (:mod:`audiomask.transfer._gate`).

Which slots are free, asking the driver as little as possible, is
:mod:`audiomask.transfer._pool`'s business: each copy's event joins its stream's
queue, recorded under the pool's lock so that the queue's order is the order of
the records.

Which stream copies: a payload of up to ``consumer_copy_bytes`` (64 KiB: a
step's masks and lengths) is copied on the consumer's own stream, queued
behind its work like the kernels that will read it: two driver calls (the
copy and its event), no stream switch, no cross-stream wait, no allocation
in another stream's pool; its slot is busy until the queue reaches the copy,
which small slots can afford. A larger payload is copied on the ring's copy
stream when the consumer is busy, so that it crosses the bus while the queue
runs and its (large) slot is free again at once: four driver calls, the
consumer query, the copy, the event record and the consumer's wait (and one
event record when the result is freed); on an idle consumer it is copied
there.

Builders write straight into a slot (the pattern of vLLM's ``CpuGpuBuffer.np``,
made race-free)::

    with ring.stage((B, L, L), np.bool_) as staged:
        hs_mask(lengths, max_frames, chunk, left, out=staged.array)
        mask = staged.to("cuda")

Where CUDA is unavailable the slots are plain memory and copies go to the CPU,
with the same bookkeeping, so everything but the events runs anywhere.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.errors import PinnedMemoryWarning
from audiomask.transfer import _gate
from audiomask.transfer._pool import SMALL_SLOT_BYTES, Completion, Segment, Slot, SlotPool
from audiomask.transfer._resolve import (
    as_torch_dtype,
    check_out_tensor,
    check_shape,
    check_stream,
    numpy_dtype,
    resolve_device,
)

__all__ = [
    "DEFAULT_CONSUMER_COPY_BYTES",
    "DEFAULT_MAX_PINNED_BYTES",
    "DEFAULT_NUM_SLOTS",
    "DEFAULT_SLOT_BYTES",
    "GATED_COPY_BYTES",
    "SMALL_SLOT_BYTES",
    "VIEW_ALIGN_BYTES",
    "Completion",
    "KiB",
    "MiB",
    "PinnedRing",
    "RingStats",
    "Staged",
]

KiB = 1024
MiB = 1024 * KiB
DEFAULT_SLOT_BYTES = 4 * MiB  # one step's masks and features for a few streams
DEFAULT_NUM_SLOTS = 4  # enough to double-buffer two producers
DEFAULT_MAX_PINNED_BYTES = 512 * MiB  # pinned memory is locked RAM: bound what the ring may take
# Up to this many bytes a copy rides the consumer's stream (module docstring). Measured on the H200
# (bench/probes/ring_paths_h200.json, busy queue): the submit of 16 KiB 0.021 ms p50 there against
# 0.039 through the copy stream, a tie at 64 KiB, and to_device of 256 KiB-1 MiB slower (0.065 vs
# 0.046 ms at 256 KiB): the slots a busy queue holds are touched cold.
DEFAULT_CONSUMER_COPY_BYTES = 64 * KiB
# From this size to_device queues the copy before its staging memcpy, gated (audiomask.transfer._gate).
# bench/probes/gated_copy_h200.json: over the memcpy alone, a gated to_device cost 0.019 ms at 16 MiB
# against 0.034 for the submit after the memcpy, ~0 against 0.07-0.08 at 64 MiB, but 0.030 against
# 0.018 at 1 MiB; the transfer run with gates from 4 MiB (bench/results/transfer_h200.json) had
# to_device of 4 MiB at 0.18 ms p50 busy, against 0.09 before gates.
GATED_COPY_BYTES = 16 * MiB
# Offsets of arrays packed into one slot: cudaMalloc's alignment, so that the
# device views of a packed copy are as aligned as fresh allocations.
VIEW_ALIGN_BYTES = 256
_VIEW_CACHE_SIZE = 16  # internal torch views kept per slot, by (offset, shape, dtype)
_LAYOUT_CACHE_SIZE = 256  # (shape, dtype) layouts of single-array stages remembered


@dataclass(frozen=True)
class RingStats:
    """A snapshot of a ring's counters.

    ``pinned_bytes`` is the capacity of the slots held now (plain memory,
    counted the same, where CUDA is unavailable); ``bytes_copied`` counts the
    bytes that left the ring, padding between packed arrays included.
    """

    pinned: bool  # whether every slot is page-locked (False without CUDA, or after a pinning failure)
    slots: int  # slots held now
    pinned_bytes: int  # bytes held now
    leased: int  # slots staged and not yet submitted or released
    copies: int  # submits (one host->device copy each)
    bytes_copied: int
    slot_waits: int  # times the host blocked on a slot's last copy
    grows: int  # blocks pinned after construction (one slot each, or a segment of small slots)
    evictions: int  # idle slots dropped to make room for a larger one


class _Part(NamedTuple):
    offset: int  # bytes from the slot start, a multiple of VIEW_ALIGN_BYTES
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def _slot_views(slot: Slot, part: _Part) -> tuple[torch.Tensor, np.ndarray | None]:
    """The torch and numpy views (``None`` for dtypes numpy lacks) of ``part`` in ``slot``, made once."""
    views = slot.views.get(part)
    if views is None:
        if len(slot.views) >= _VIEW_CACHE_SIZE:
            slot.views.clear()
        tensor = slot.buffer[part.offset : part.offset + part.nbytes].view(part.dtype).view(part.shape)
        dtype = numpy_dtype(part.dtype)
        array = None if dtype is None else slot.array[part.offset : part.offset + part.nbytes].view(dtype)
        views = slot.views[part] = (tensor, None if array is None else array.reshape(part.shape))
    return views


_get_current_stream = getattr(torch._C, "_cuda_getCurrentStream", None)  # (stream id, device index, device type)
# torch.cuda.set_stream and current_device without their Python wrappers (argument handling, lazy init:
# CUDA is initialised once a ring exists); None where torch lacks them.
_set_stream_ids = getattr(torch._C, "_cuda_setStream", None)
_get_device = getattr(torch._C, "_cuda_getDevice", None)
_STREAMS: dict[tuple[int, int, int], torch.cuda.Stream] = {}
_LAYOUTS: dict[tuple[object, object], tuple[list[_Part], int]] = {}


def _stream_ids(stream: torch.cuda.Stream) -> tuple[int, int, int]:
    """``(stream id, device index, device type)``: what names a stream to torch's C entry points."""
    return stream.stream_id, stream.device_index, stream.device_type


def _current_stream_ids(device: torch.device) -> tuple[tuple[int, int, int], torch.cuda.Stream]:
    """The current stream of ``device`` and its ids, without building a new Stream object on every call."""
    if _get_current_stream is None or device.type != "cuda":
        stream = torch.cuda.current_stream(device)
        return _stream_ids(stream), stream
    key = _get_current_stream(device.index)
    stream = _STREAMS.get(key)
    if stream is None:
        if len(_STREAMS) >= 64:
            _STREAMS.clear()
        stream = _STREAMS[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return key, stream


def _current_stream(device: torch.device) -> torch.cuda.Stream:
    """``torch.cuda.current_stream(device)``, without building a new Stream object on every call."""
    return _current_stream_ids(device)[1]


def _set_stream(ids: tuple[int, int, int], stream: torch.cuda.Stream) -> None:
    """Make ``stream`` (named by ``ids``) current; like ``torch.cuda.set_stream``, this makes its device current."""
    if _set_stream_ids is None:
        torch.cuda.set_stream(stream)
    else:
        _set_stream_ids(*ids)


def _current_device() -> int:
    return torch.cuda.current_device() if _get_device is None else _get_device()


def _slot_event(slot: Slot, device: torch.device) -> Any:
    """The slot's reusable event for ``device`` (an event records on one device only)."""
    if slot.event is None or slot.event_device != device:
        slot.event = torch.cuda.Event()
        slot.event_device = device
    return slot.event


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _plain_shape(shape: object) -> bool:
    """Whether ``shape`` is an ``int`` or a tuple of ``int`` (not ``bool``, not numpy integers): safe as a cache key."""
    return type(shape) is int or (type(shape) is tuple and all(type(n) is int for n in shape))


def _single_layout(shape: object, dtype: object) -> tuple[list[_Part], int]:
    """:func:`_layout` of one array, remembered per ``(shape, dtype)``.

    Validating and laying out a spec costs more host time than the copy of a
    small payload (~15 us of Python), and a streaming loop stages the same few
    shapes step after step. Only plain-``int`` shapes are looked up: ``True``
    equals ``1`` as a key, and must still be refused.
    """
    if not _plain_shape(shape):
        return _layout([(shape, dtype)])
    key = (shape, dtype)
    try:
        layout = _LAYOUTS.get(key)
    except TypeError:  # an unhashable dtype argument
        return _layout([(shape, dtype)])
    if layout is None:
        layout = _layout([(shape, dtype)])
        if len(_LAYOUTS) >= _LAYOUT_CACHE_SIZE:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    return layout


def _layout(specs: Iterable[tuple[object, object]]) -> tuple[list[_Part], int]:
    """Place arrays one after another at aligned offsets; return them and the span in bytes."""
    parts: list[_Part] = []
    end = 0
    for i, (shape, dtype) in enumerate(specs):
        shape = check_shape(f"shape of array {i}", shape)
        dtype = as_torch_dtype(f"dtype of array {i}", dtype)
        offset = _round_up(end, VIEW_ALIGN_BYTES)
        nbytes = math.prod(shape) * dtype.itemsize
        parts.append(_Part(offset, shape, dtype, nbytes))
        end = offset + nbytes
    if not parts:
        raise ValueError("specs must name at least one (shape, dtype) array, got none")
    return parts, end


class PinnedRing:
    """Persistent pinned host slots, each reused only after its last copy has completed.

    Args:
        slot_bytes: capacity of each initial slot, in bytes.
        num_slots: slots pinned up front.
        max_pinned_bytes: bound on the bytes of all slots held, in bytes.
        consumer_copy_bytes: copies of up to this many bytes run on the
            consumer's (current) stream, larger ones on the ring's copy stream
            while the consumer is busy (see the module docstring); 0: every
            copy may take the copy stream.

    Growth policy: a request goes to the smallest idle slot that fits (a copy
    of up to ``consumer_copy_bytes`` first asks whether one of its own size has
    completed, rather than hold a large slot while it waits in the consumer's
    queue). When no idle slot fits, the ring pins a new slot of
    ``max(slot_bytes, next power of two >= request)`` bytes
    (``max(min(slot_bytes, SMALL_SLOT_BYTES), ...)`` for a copy of up to
    ``consumer_copy_bytes``, pinned in segments that double the count of their
    size, up to ``SEGMENT_BYTES`` at once: such copies hold their slots until
    the consumer's queue reaches them) and keeps it, dropping idle smaller slots
    if that is needed to stay within ``max_pinned_bytes``; a slot is pinned on the hot
    path only until the ring has reached the size its workload needs (see
    ``stats().grows``). Only at the bound does the host wait for the oldest
    in-flight slot (``stats().slot_waits``). A request larger than
    ``max_pinned_bytes`` raises :class:`ValueError`.

    The copy stream of the current CUDA device is made with the ring: a
    process's first ``torch.cuda.Stream()`` sets up torch's stream pool and
    waits for the device (52 ms behind a 50 ms queue on the H200,
    bench/probes/first_use.py), which must not happen on the first copy.

    Thread safety: slot acquisition and release hold a lock; a staged slot
    belongs to one thread until it is submitted or released. Dropped slots go
    back to torch's pinned-memory cache, not to the OS.

    >>> ring = PinnedRing(slot_bytes=4 * KiB, num_slots=2, max_pinned_bytes=64 * KiB)
    >>> with ring.stage((2, 3), np.int64) as staged:
    ...     staged.array[:] = [[1, 2, 3], [4, 5, 6]]
    ...     result = staged.to("cpu")
    >>> result
    tensor([[1, 2, 3],
            [4, 5, 6]])
    >>> stats = ring.stats()
    >>> stats.copies, stats.bytes_copied, stats.slots, stats.pinned_bytes
    (1, 48, 2, 8192)
    """

    def __init__(
        self,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        num_slots: int = DEFAULT_NUM_SLOTS,
        max_pinned_bytes: int = DEFAULT_MAX_PINNED_BYTES,
        consumer_copy_bytes: int = DEFAULT_CONSUMER_COPY_BYTES,
    ) -> None:
        self.slot_bytes = check_int("slot_bytes", slot_bytes, minimum=1)
        num_slots = check_int("num_slots", num_slots, minimum=1)
        self.max_pinned_bytes = check_int("max_pinned_bytes", max_pinned_bytes, minimum=1)
        self.consumer_copy_bytes = check_int("consumer_copy_bytes", consumer_copy_bytes, minimum=0)
        if self.slot_bytes * num_slots > self.max_pinned_bytes:
            raise ValueError(
                f"max_pinned_bytes must be >= num_slots * slot_bytes = {self.slot_bytes * num_slots}, "
                f"got {self.max_pinned_bytes}"
            )
        self.pinned = torch.cuda.is_available()
        self._pool = SlotPool(
            self._new_slots,
            [self._new_slots(self.slot_bytes)[0] for _ in range(num_slots)],
            slot_bytes=self.slot_bytes,
            max_pinned_bytes=self.max_pinned_bytes,
            consumer_copy_bytes=self.consumer_copy_bytes,
        )
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._copy_stream_ids: dict[torch.device, tuple[int, int, int]] = {}
        if self.pinned:
            self.copy_stream(torch.device("cuda", torch.cuda.current_device()))

    def stage(self, shape: int | Sequence[int], dtype: object) -> Staged:
        """Lease a slot holding one array of ``shape`` and ``dtype`` (torch or numpy dtype).

        Use the result as a context manager; see :class:`Staged`.
        """
        parts, nbytes = _single_layout(shape, dtype)
        return Staged(self, self._pool.acquire(nbytes), parts, nbytes)

    def stage_many(self, specs: Iterable[tuple[int | Sequence[int], object]]) -> Staged:
        """Lease one slot holding several arrays, packed at ``VIEW_ALIGN_BYTES`` offsets.

        ``specs`` lists ``(shape, dtype)`` pairs. One copy then moves them all
        (:meth:`Staged.to_many`): pack a step's payloads into one slot rather
        than issuing thousands of small copies.

        >>> ring = PinnedRing(slot_bytes=4 * KiB, num_slots=1, max_pinned_bytes=4 * KiB)
        >>> with ring.stage_many([((2,), np.float32), ((3,), np.bool_)]) as staged:
        ...     values, flags = staged.arrays
        ...     values[:] = 0.5
        ...     flags[:] = [True, False, True]
        ...     staged.to_many("cpu")
        (tensor([0.5000, 0.5000]), tensor([ True, False,  True]))
        """
        parts, nbytes = _layout(specs)
        return Staged(self, self._pool.acquire(nbytes), parts, nbytes)

    def _stage_checked(self, shape: tuple[int, ...], dtype: torch.dtype) -> Staged:
        """:meth:`stage` for a shape and dtype already checked (a tensor's): no per-call validation."""
        nbytes = math.prod(shape) * dtype.itemsize
        return Staged(self, self._pool.acquire(nbytes), [_Part(0, shape, dtype, nbytes)], nbytes)

    def _copy_array(self, source: np.ndarray, dtype: torch.dtype, target: torch.device) -> torch.Tensor:
        """Stage ``source`` as ``dtype`` and copy it on ``target``'s current stream: ``to_device``'s common case.

        For a payload of up to ``consumer_copy_bytes`` with a numpy dtype, without
        the checks and objects of the general path (microseconds of Python each).
        """
        nbytes = source.size * dtype.itemsize
        part = _Part(0, source.shape, dtype, nbytes)
        slot = self._pool.acquire(nbytes)
        try:
            tensor, array = _slot_views(slot, part)
            np.copyto(array, source, casting="unsafe")  # type: ignore[arg-type]
            return self._copy_on_consumer(slot, part, tensor, target)
        except BaseException:
            if slot.leased:
                self._pool.release(slot, None, None)
            raise

    def _copy_on_consumer(self, slot: Slot, part: _Part, tensor: torch.Tensor, target: torch.device) -> torch.Tensor:
        """Copy ``part`` of the leased ``slot`` (``tensor``: its view) on ``target``'s current stream; release the slot.

        The whole submit of a small payload: an allocation, the copy and the
        slot's event, in the consumer's stream order (to_device of 16 KiB this way:
        0.021 ms p50 on the H200, against 0.013 for ``pin_memory()`` per copy and
        0.0115 for the bare calls; bench/probes/pinned_kinds_h200.json). One
        ``Tensor.to`` allocates and copies in a single call: 3-5 us under
        ``torch.empty`` + ``copy_`` (bench/probes/small_submit_forms_h200.txt).
        ``copy=True``: the result never aliases the slot, whatever ``target`` is.
        """
        consumer_ids, consumer = _current_stream_ids(target)
        destination = tensor.to(target, non_blocking=True, copy=True)
        self._pool.release(slot, _slot_event(slot, target), part.nbytes, consumer_ids, record_on=consumer)
        return destination

    def _staging_views(self, staged: Staged) -> tuple[torch.Tensor, np.ndarray | None]:
        """The internal torch and numpy views of ``staged``'s only array, for the staging memcpy of to_device."""
        return _slot_views(staged._live(), staged._parts[0])

    def stats(self) -> RingStats:
        """A snapshot of the counters."""
        return RingStats(**self._pool.snapshot())  # type: ignore[arg-type]

    def copy_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The ring's copy stream for the CUDA ``device``, created on first use."""
        stream = self._streams.get(device)
        if stream is None:
            with self._pool.lock:
                if device not in self._streams:
                    made = torch.cuda.Stream(device=device)
                    self._copy_stream_ids[device] = _stream_ids(made)  # first: a submit reads it once the stream is in
                    self._streams[device] = made
                stream = self._streams[device]
        return stream

    def _new_slots(self, nbytes: int, count: int = 1) -> list[Slot]:
        """``count`` slots of ``nbytes`` bytes carved from one new block, pinned where CUDA is available."""
        try:
            buffer = torch.empty(nbytes * count, dtype=torch.uint8, pin_memory=self.pinned)
            pinned = self.pinned
        except RuntimeError as error:
            if not self.pinned:
                raise
            # Locked memory is a limited resource (ulimit -l, containers): a pageable slot keeps
            # copies correct (the event guard is unchanged), only no longer stall-free.
            warnings.warn(
                f"could not pin a {nbytes * count}-byte ring block ({str(error).strip().splitlines()[0]}); "
                "using pageable memory: copies from it make the host wait for the GPU queue",
                PinnedMemoryWarning,
                stacklevel=4,
            )
            buffer, pinned = torch.empty(nbytes * count, dtype=torch.uint8), False
        if count == 1:
            slot = Slot(buffer, buffer.numpy(), nbytes, pinned=pinned)
            if pinned and nbytes >= GATED_COPY_BYTES:
                slot.gate_word, slot.gate = _gate.new_word()
            return [slot]
        array, segment = buffer.numpy(), Segment(nbytes * count)
        return [
            Slot(
                buffer[i * nbytes : (i + 1) * nbytes],
                array[i * nbytes : (i + 1) * nbytes],
                nbytes,
                pinned,
                segment=segment,
            )
            for i in range(count)
        ]


class Staged:
    """A leased ring slot holding one or more host arrays, until it is submitted or released.

    Write the payload through :attr:`array` / :attr:`arrays` (numpy views) or
    :attr:`tensor` / :attr:`tensors` (CPU torch views of the same bytes), then
    submit it once with :meth:`to` / :meth:`to_many`. Submitting hands the slot
    back to the ring, guarded by the copy's event: do not write through views
    taken before the submit afterwards. Leaving the ``with`` block without a
    submit releases the slot unused.
    """

    def __init__(self, ring: PinnedRing, slot: Slot, parts: list[_Part], nbytes: int) -> None:
        self._ring = ring
        self._slot: Slot | None = slot
        self._parts = parts
        self.nbytes = nbytes  # span of the packed arrays in the slot, in bytes
        self._arrays: tuple[np.ndarray, ...] | None = None
        self._tensors: tuple[torch.Tensor, ...] | None = None

    def __enter__(self) -> Staged:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._slot is not None:
            self.release()

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """Numpy views of the staged arrays, C-contiguous, writeable, in ``specs`` order."""
        slot = self._live()
        if self._arrays is None:
            self._arrays = tuple(self._numpy_view(slot, part) for part in self._parts)
        return self._arrays

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """CPU torch views of the staged arrays (pinned where CUDA is available)."""
        slot = self._live()
        if self._tensors is None:
            self._tensors = tuple(
                slot.buffer[p.offset : p.offset + p.nbytes].view(p.dtype).view(p.shape) for p in self._parts
            )
        return self._tensors

    @property
    def array(self) -> np.ndarray:
        """The numpy view of the only staged array."""
        return self.arrays[self._single()]

    @property
    def tensor(self) -> torch.Tensor:
        """The CPU torch view of the only staged array."""
        return self.tensors[self._single()]

    def to(
        self, device: object, *, out: torch.Tensor | None = None, stream: torch.cuda.Stream | None = None
    ) -> torch.Tensor:
        """Copy the only staged array to ``device`` and hand the slot back; see :meth:`to_many`.

        ``out``: a dense tensor on ``device`` with the staged shape and dtype to
        copy into. The copy then runs on the current stream (unless ``stream``
        is given), after all work already queued there (which may still read
        ``out``), so the slot stays busy until that work is done.
        """
        target = resolve_device(device)
        check_stream(stream, target)
        if out is not None:
            part = self._parts[self._single()]
            check_out_tensor(out, part.shape, part.dtype, target)
        return self._to(target, out, stream)

    def to_many(self, device: object, *, stream: torch.cuda.Stream | None = None) -> tuple[torch.Tensor, ...]:
        """Copy all staged arrays to ``device`` in one copy; return a view per array.

        On CUDA the copy is ``non_blocking`` on ``stream`` (default: the current
        stream for up to the ring's ``consumer_copy_bytes`` or when nothing is
        queued on it, else the ring's copy stream for the device); the host
        never waits for the work queued on the current stream, and
        the current stream is made to wait for a copy on another, so
        the results are ready for work queued on it afterwards (other streams
        must wait for it themselves). The results share one device allocation,
        known to the caching allocator as used by the current stream, so it is
        not reused while that stream's queued work may still read it.

        Without CUDA (or for ``device="cpu"``) the results are CPU copies. The
        host time of a submit does not depend on the GPU queue.
        """
        target = resolve_device(device)
        check_stream(stream, target)
        return self._submit(target, None, stream)

    def release(self, event: Completion | None = None) -> None:
        """Hand the slot back without copying it through :meth:`to`.

        ``event``: for a copy from the slot issued by other means, the event
        recorded after it; the slot is not reused before it completes.
        """
        self._ring._pool.release(self._live(), event, None)
        self._slot = None

    def _to(
        self,
        target: torch.device,
        out: torch.Tensor | None,
        stream: torch.cuda.Stream | None,
        fill: Callable[[], None] | None = None,
    ) -> torch.Tensor:
        """:meth:`to` with ``target``, ``out`` and ``stream`` already checked; see :meth:`_submit` for ``fill``."""
        index = self._single()
        ring = self._ring
        small = self.nbytes <= ring.consumer_copy_bytes
        if small and fill is None and out is None and stream is None and target.type != "cpu":
            slot, part = self._live(), self._parts[0]
            result = ring._copy_on_consumer(slot, part, _slot_views(slot, part)[0], target)
            self._slot = None
            return result
        return self._submit(target, out, stream, fill)[index]

    def _submit(
        self,
        target: torch.device,
        out: torch.Tensor | None,
        stream: torch.cuda.Stream | None,
        fill: Callable[[], None] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Copy the slot to ``target`` and release it; ``fill()`` writes the slot, once the result is allocated.

        Allocating before the staging memcpy keeps the submit's own work off
        the caches that a large memcpy has just flushed. From
        ``GATED_COPY_BYTES`` the whole submit goes first: the copy is queued
        behind a gate (:mod:`audiomask.transfer._gate`), the slot released
        guarded by the copy's event (which cannot complete before the gate
        opens) and the consumer's wait queued; then ``fill()`` runs and the
        gate opens (whatever ``fill()`` raised: the stream must not wait
        forever), so after the memcpy the host does one store.
        """
        slot = self._live()
        if target.type == "cpu":
            destination, _ = self._write(slot, target, out, fill)
            self._ring._pool.release(slot, None, self.nbytes)
            self._slot = None
            return self._results(destination)
        ring = self._ring
        consumer_ids, consumer = _current_stream_ids(target)
        if stream is not None:
            copy_ids = _stream_ids(stream)
            copy_stream = stream
        elif out is not None or self.nbytes <= ring.consumer_copy_bytes:
            copy_ids, copy_stream = consumer_ids, consumer
        else:
            seen = ring._pool.released  # read before the query: every slot released up to it was recorded before it
            if consumer.query():
                ring._pool.stream_idle(consumer_ids, seen)
                copy_ids, copy_stream = consumer_ids, consumer
            else:
                copy_stream = ring.copy_stream(target)  # not queued behind the consumer's work
                copy_ids = ring._copy_stream_ids[target]
        # A copy into out must follow the consumer's queued work (which may still read out), a small
        # copy is read only by work queued after it anyway, and with nothing queued ahead a copy on
        # the consumer starts at once: the consumer itself is then the right stream, with no
        # cross-stream event, wait, stream switch or record_stream (the low-latency single-stream
        # case, a step's masks and features, and CUDA graphs' static inputs).
        done = _slot_event(slot, target)
        gate = fill is not None and slot.gate is not None and slot.pinned and self.nbytes >= GATED_COPY_BYTES
        if copy_ids == consumer_ids:
            destination, gated = self._write(slot, target, out, fill, gate=copy_stream if gate else None)
        else:
            if out is not None:
                copy_stream.wait_stream(consumer)  # a caller's stream: work queued before may still read out
            # Allocating under the copy stream puts the result in that stream's pool, so it is
            # never a block that work queued on the consumer still uses. Setting a stream also makes
            # its device current: put back the caller's device if it was another.
            device = _current_device()
            _set_stream(copy_ids, copy_stream)
            try:
                destination, gated = self._write(slot, target, out, fill, gate=copy_stream if gate else None)
            finally:
                _set_stream(consumer_ids, consumer)
                if device != target.index:
                    torch.cuda.set_device(device)
        try:  # the copy is queued: the slot stays busy until it has run, whatever fill() raises
            ring._pool.release(slot, done, self.nbytes, copy_ids, record_on=copy_stream)
            self._slot = None
            if copy_ids != consumer_ids:
                done.wait(consumer)
                if out is None:
                    destination.record_stream(consumer)  # not reused before the consumer's queued work has run
            if gated:  # the copy waits on the GPU for the staged payload: stage it last, then let the copy run
                fill()  # type: ignore[misc]
        finally:
            if gated:
                _gate.open_(slot.gate, slot.gate_value)  # type: ignore[arg-type]
        return self._results(destination)

    def _write(
        self,
        slot: Slot,
        target: torch.device,
        out: torch.Tensor | None,
        fill: Callable[[], None] | None,
        *,
        gate: torch.cuda.Stream | None = None,
    ) -> tuple[torch.Tensor, bool]:
        """Allocate the destination, queue the copy; return it and whether the copy waits behind a gate.

        Without CUDA the copy is a plain one. With ``gate`` (the stream the
        copy runs on) the copy is queued gated and ``fill()`` is left to the
        caller, who must open the gate; else (or where the driver cannot gate)
        ``fill()`` runs first. The gate closes after the allocation: an
        allocation may free cached device memory, which waits for every stream.
        """
        destination = self._allocate(target, out)
        gated = False
        if gate is not None:
            slot.gate_value += 1
            gated = _gate.close(gate, slot.gate, slot.gate_value)  # type: ignore[arg-type]
        if fill is not None and not gated:
            fill()
        self._copy(slot, destination, non_blocking=target.type != "cpu")
        return destination, gated

    def _allocate(self, target: torch.device, out: torch.Tensor | None) -> torch.Tensor:
        """The tensor the copy writes: ``out``, the only array's result, or one byte block for packed arrays."""
        if out is not None:
            return out
        if len(self._parts) == 1:  # straight into a tensor of the right type: no byte views
            part = self._parts[0]
            return torch.empty(part.shape, dtype=part.dtype, device=target)
        return torch.empty(self.nbytes, dtype=torch.uint8, device=target)

    def _copy(self, slot: Slot, destination: torch.Tensor, *, non_blocking: bool) -> None:
        part = self._parts[0] if len(self._parts) == 1 else _Part(0, (self.nbytes,), torch.uint8, self.nbytes)
        destination.copy_(_slot_views(slot, part)[0], non_blocking=non_blocking)

    def _results(self, destination: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(self._parts) == 1:
            return (destination,)
        return tuple(destination[p.offset : p.offset + p.nbytes].view(p.dtype).view(p.shape) for p in self._parts)

    def _live(self) -> Slot:
        if self._slot is None:
            raise RuntimeError("this staged slot was already submitted or released; stage a new one")
        return self._slot

    def _single(self) -> int:
        if len(self._parts) != 1:
            raise ValueError(f"this slot holds {len(self._parts)} arrays; use .arrays, .tensors or to_many()")
        return 0

    @staticmethod
    def _numpy_view(slot: Slot, part: _Part) -> np.ndarray:
        array = _slot_views(slot, part)[1]
        if array is None:
            raise ValueError(f"dtype {part.dtype} has no numpy equivalent; write through .tensors instead")
        return array.view()  # a view object of its own: the ring's copy stays as it was made
