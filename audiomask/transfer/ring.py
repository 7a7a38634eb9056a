"""A persistent ring of pinned host slots for stall-free, race-free host->device copies.

A ``non_blocking`` copy from pageable memory stalls the host behind a busy
stream, and ``pin_memory()`` per copy costs the host up to milliseconds at
times. A slot pinned once and reused costs neither, but reusing it while its
last copy is still in flight corrupts that copy. So every copy from a slot
records the slot's own CUDA event (made once, recorded again by each copy),
and the slot is handed out again only once that event has completed. Which
slots are free is :mod:`audiomask.transfer._pool`'s business.

Which CUDA stream copies: a payload of up to ``consumer_copy_bytes`` (64 KiB: a
step's masks and lengths) is copied on the consumer's (current) CUDA stream, queued
behind its work like the kernels that will read it: no stream switch, no
cross-stream wait; its slot is busy until the queue reaches the copy, which
small slots afford. A larger payload is copied on the ring's copy stream when
the consumer is busy, so that it crosses the bus while the queue runs and its
slot is free again at once; the consumer waits for the copy's event. On an
idle consumer, or into ``out``, it is copied on the consumer.

Builders write straight into a slot::

    with ring.stage((B, L, L), np.bool_) as staged:
        hs_mask(lengths, max_frames, chunk, left, out=staged.array)
        mask = staged.to("cuda")

Where CUDA is unavailable the slots are plain memory and copies go to the CPU,
with the same bookkeeping, so everything but the events runs anywhere.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import NamedTuple

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.errors import PinnedMemoryWarning
from audiomask.transfer._pool import SMALL_SLOT_BYTES, Completion, Segment, Slot, SlotPool, StreamKey
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
# Up to this many bytes a copy rides the consumer's stream: below it the consumer's queue is the cheaper
# submit behind a busy queue, above it the copy stream is (the slots a busy queue holds are touched cold).
# Figures: docs/defaults.md.
DEFAULT_CONSUMER_COPY_BYTES = 64 * KiB
# Offsets of arrays packed into one slot: cudaMalloc's alignment, so that the
# device views of a packed copy are as aligned as fresh allocations.
VIEW_ALIGN_BYTES = 256
_VIEW_CACHE_SIZE = 16  # internal torch views kept per slot, by (offset, shape, dtype)


@dataclass(frozen=True)
class RingStats:
    """A snapshot of a ring's counters.

    ``pinned_bytes`` is the capacity of the blocks held now (plain memory,
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


def _stream_key(stream: torch.cuda.Stream) -> StreamKey:
    return stream.stream_id, stream.device_index, stream.device_type


def _slot_event(slot: Slot, device: torch.device) -> torch.cuda.Event:
    """The slot's reusable event for ``device`` (an event records on one device only)."""
    if slot.event is None or slot.event_device != device:
        slot.event = torch.cuda.Event()
        slot.event_device = device
    return slot.event


def _layout(specs: Iterable[tuple[object, object]]) -> tuple[tuple[_Part, ...], int]:
    """Place arrays one after another at aligned offsets; return them and the span in bytes."""
    parts: list[_Part] = []
    end = 0
    for i, (shape, dtype) in enumerate(specs):
        shape = check_shape(f"shape of array {i}", shape)
        dtype = as_torch_dtype(f"dtype of array {i}", dtype)
        offset = -(-end // VIEW_ALIGN_BYTES) * VIEW_ALIGN_BYTES
        nbytes = math.prod(shape) * dtype.itemsize
        parts.append(_Part(offset, shape, dtype, nbytes))
        end = offset + nbytes
    if not parts:
        raise ValueError("specs must name at least one (shape, dtype) array, got none")
    return tuple(parts), end


@functools.lru_cache(maxsize=256)
def _remembered_layout(shape: int | tuple[int, ...], dtype: object) -> tuple[tuple[_Part, ...], int]:
    return _layout([(shape, dtype)])


def _single_layout(shape: object, dtype: object) -> tuple[tuple[_Part, ...], int]:
    """:func:`_layout` of one array, remembered per ``(shape, dtype)``.

    Validating a spec costs more host time than the copy of a small payload,
    and a streaming loop stages the same few shapes step after step. Only
    shapes of plain ``int`` are remembered: ``True`` equals ``1`` as a key,
    and must still be refused.
    """
    plain = type(shape) is int or (type(shape) is tuple and all(type(n) is int for n in shape))
    if plain:
        try:
            return _remembered_layout(shape, dtype)  # type: ignore[arg-type]
        except TypeError:  # an unhashable dtype argument
            pass
    return _layout([(shape, dtype)])


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

    Growth: a request goes to the smallest idle slot that fits. When none
    fits, the ring pins a new slot of ``max(slot_bytes, next power of two >=
    request)`` bytes (``min(slot_bytes, SMALL_SLOT_BYTES)`` at least for a copy
    of up to ``consumer_copy_bytes``, pinned in segments of several slots) and
    keeps it, dropping idle smaller slots to stay within ``max_pinned_bytes``:
    slots are pinned on the hot path only until the ring has reached the size
    its workload needs (``stats().grows``). Only at the bound does the host
    wait for the oldest copy in flight (``stats().slot_waits``). A request
    larger than ``max_pinned_bytes`` raises :class:`ValueError`.

    The copy stream of the current CUDA device is made with the ring: a
    process's first ``torch.cuda.Stream()`` sets up torch's stream pool and
    waits for the device, which must not happen on the first copy.

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
        than issuing many small copies.

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

    def stats(self) -> RingStats:
        """A snapshot of the counters."""
        return RingStats(**self._pool.snapshot())  # type: ignore[arg-type]

    def copy_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The ring's copy stream for the CUDA ``device``, created on first use."""
        stream = self._streams.get(device)
        if stream is None:
            with self._pool.lock:
                if device not in self._streams:
                    self._streams[device] = torch.cuda.Stream(device=device)
                stream = self._streams[device]
        return stream

    def _stage_checked(self, shape: tuple[int, ...], dtype: torch.dtype) -> Staged:
        """:meth:`stage` for a shape and dtype already checked (a tensor's): no per-call validation."""
        nbytes = math.prod(shape) * dtype.itemsize
        return Staged(self, self._pool.acquire(nbytes), (_Part(0, shape, dtype, nbytes),), nbytes)

    def _copy_array(self, source: np.ndarray, dtype: torch.dtype, target: torch.device) -> torch.Tensor:
        """Stage ``source`` as ``dtype`` and copy it on ``target``'s current stream: ``to_device``'s common case.

        For a payload of up to ``consumer_copy_bytes`` with a numpy dtype,
        without the checks and objects of the general path.
        """
        nbytes = source.size * dtype.itemsize
        part = _Part(0, source.shape, dtype, nbytes)
        slot = self._pool.acquire(nbytes)
        try:
            tensor, array = _slot_views(slot, part)
            np.copyto(array, source, casting="unsafe")  # type: ignore[arg-type]
            return self._copy_on_consumer(slot, part, tensor, target)
        except BaseException:
            if slot.leased:  # not submitted: hand the slot back unused
                self._pool.release(slot, None, None)
            raise

    def _copy_on_consumer(self, slot: Slot, part: _Part, tensor: torch.Tensor, target: torch.device) -> torch.Tensor:
        """Copy ``part`` of the leased ``slot`` (``tensor``: its view) on ``target``'s current CUDA stream; release the slot.

        The whole submit of a small payload: one ``Tensor.to`` (an allocation
        and the copy in a single call) and the slot's event, in the consumer's
        stream order. ``copy=True``: the result never aliases the slot.
        """
        consumer = torch.cuda.current_stream(target)
        destination = tensor.to(target, non_blocking=True, copy=True)
        self._pool.release(slot, _slot_event(slot, target), part.nbytes, _stream_key(consumer), record_on=consumer)
        return destination

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
        array, segment = buffer.numpy(), Segment(nbytes * count) if count > 1 else None
        blocks = [slice(i * nbytes, (i + 1) * nbytes) for i in range(count)]
        return [Slot(buffer[block], array[block], nbytes, pinned, segment=segment) for block in blocks]


class Staged:
    """A leased ring slot holding one or more host arrays, until it is submitted or released.

    Write the payload through :attr:`array` / :attr:`arrays` (numpy views) or
    :attr:`tensor` / :attr:`tensors` (CPU torch views of the same bytes), then
    submit it once with :meth:`to` / :meth:`to_many`. Submitting hands the slot
    back to the ring, guarded by the copy's event: do not write through views
    taken before the submit afterwards. Leaving the ``with`` block without a
    submit releases the slot unused.
    """

    def __init__(self, ring: PinnedRing, slot: Slot, parts: tuple[_Part, ...], nbytes: int) -> None:
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
        copy into. The copy then runs on the current CUDA stream (unless ``stream``
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
        CUDA stream for up to the ring's ``consumer_copy_bytes`` or when nothing is
        queued on it, else the ring's copy stream for the device); the host
        never waits for the work queued on the current stream, and the current
        stream is made to wait for a copy on another, so the results are ready
        for work queued on it afterwards (other streams must wait for it
        themselves). The results share one device allocation, known to the
        caching allocator as used by the current stream, so it is not reused
        while that stream's queued work may still read it.

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

    def _to(self, target: torch.device, out: torch.Tensor | None, stream: torch.cuda.Stream | None) -> torch.Tensor:
        """:meth:`to` with ``target``, ``out`` and ``stream`` already checked."""
        index = self._single()
        ring = self._ring
        if out is None and stream is None and target.type != "cpu" and self.nbytes <= ring.consumer_copy_bytes:
            slot, part = self._live(), self._parts[0]
            result = ring._copy_on_consumer(slot, part, _slot_views(slot, part)[0], target)
            self._slot = None
            return result
        return self._submit(target, out, stream)[index]

    def _submit(
        self, target: torch.device, out: torch.Tensor | None, stream: torch.cuda.Stream | None
    ) -> tuple[torch.Tensor, ...]:
        """Copy the slot to ``target`` on the CUDA stream :meth:`to_many` names, and release it."""
        slot = self._live()
        ring = self._ring
        if target.type == "cpu":
            destination = self._copy(slot, target, out)
            ring._pool.release(slot, None, self.nbytes)
            self._slot = None
            return self._results(destination)
        consumer = torch.cuda.current_stream(target)
        if stream is not None:
            copy_stream = stream
        elif out is not None or self.nbytes <= ring.consumer_copy_bytes:
            copy_stream = consumer
        else:
            seen = ring._pool.released  # read before the query: every slot released up to it was recorded before it
            if consumer.query():
                ring._pool.stream_idle(_stream_key(consumer), seen)
                copy_stream = consumer
            else:
                copy_stream = ring.copy_stream(target)  # not queued behind the consumer's work
        # A copy into out must follow the consumer's queued work (which may still read out), a small
        # copy is read only by work queued after it anyway, and with nothing queued ahead a copy on
        # the consumer starts at once: then the consumer itself copies, with no cross-stream event,
        # wait, stream switch or record_stream.
        copy_key, consumer_key = _stream_key(copy_stream), _stream_key(consumer)
        if copy_key == consumer_key:
            destination = self._copy(slot, target, out)
        else:
            if out is not None:
                copy_stream.wait_stream(consumer)  # a caller's stream: work queued before may still read out
            # Allocating under the copy stream puts the result in that stream's pool, so it is never a
            # block that work queued on the consumer still uses. Setting a stream also makes its device
            # current: put back the caller's device if it was another.
            device = torch.cuda.current_device()
            torch.cuda.set_stream(copy_stream)
            try:
                destination = self._copy(slot, target, out)
            finally:
                torch.cuda.set_stream(consumer)
                if device != target.index:
                    torch.cuda.set_device(device)
        done = _slot_event(slot, target)
        ring._pool.release(slot, done, self.nbytes, copy_key, record_on=copy_stream)
        self._slot = None
        if copy_key != consumer_key:
            done.wait(consumer)
            if out is None:
                destination.record_stream(consumer)  # not reused before the consumer's queued work has run
        return self._results(destination)

    def _copy(self, slot: Slot, target: torch.device, out: torch.Tensor | None) -> torch.Tensor:
        """Copy the slot into ``out``, else into a new tensor of the only array or one byte block; return it."""
        if out is not None:
            destination = out
        elif len(self._parts) == 1:  # straight into a tensor of the right type: no byte views
            destination = torch.empty(self._parts[0].shape, dtype=self._parts[0].dtype, device=target)
        else:
            destination = torch.empty(self.nbytes, dtype=torch.uint8, device=target)
        part = self._parts[0] if len(self._parts) == 1 else _Part(0, (self.nbytes,), torch.uint8, self.nbytes)
        return destination.copy_(_slot_views(slot, part)[0], non_blocking=target.type != "cpu")

    def _results(self, destination: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(self._parts) == 1:
            return (destination,)
        return tuple(destination[p.offset : p.offset + p.nbytes].view(p.dtype).view(p.shape) for p in self._parts)

    def _staging_views(self) -> tuple[torch.Tensor, np.ndarray | None]:
        """The internal torch and numpy views of the only array, for ``to_device``'s staging memcpy."""
        return _slot_views(self._live(), self._parts[0])

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
