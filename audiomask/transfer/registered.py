"""Host memory page-locked where it lies, and copies from it to the device that need no staging.

:func:`to_device` stages: it copies the payload into a pinned ring slot, then
the slot crosses the bus, so the caller may reuse its array at once. For a
payload that some other party writes into memory of its own every cycle (a
front end's processes writing a whole chunk batch into shared memory), that
staging memcpy reads and writes the whole batch again, on the thread that
launches the device's work.
:class:`PinnedRegion` page-locks such memory once (``cudaHostRegister``), and
:func:`copy_pinned` copies from it straight to the device, ``non_blocking``,
returning the event after which the memory may be written again.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from audiomask.errors import PinnedMemoryWarning
from audiomask.transfer._resolve import as_torch_dtype, resolve_device
from audiomask.transfer.staging import default_ring, to_device

__all__ = ["PinnedRegion", "copy_pinned"]

_REGISTER_DEFAULT = 0  # cudaHostRegisterDefault: page-locked, usable by every CUDA context of the process


def _unregister(pointer: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(pointer)


class PinnedRegion:
    """The memory of a contiguous host tensor, page-locked in place until :meth:`close`.

    While registered, ``memory`` and every view of it report ``is_pinned()``,
    and ``non_blocking`` copies from it to a CUDA device are asynchronous DMA
    (:func:`copy_pinned`). Without CUDA, or where the driver refuses (the
    locked-memory limit), nothing is registered: :attr:`pinned` is ``False``
    (with a :class:`~audiomask.errors.PinnedMemoryWarning` when CUDA is there)
    and the memory stays pageable. The region keeps ``memory`` alive while
    registered; :meth:`close` unregisters it (idempotent; also when the region
    is collected), after which copies from it must have completed.

    Args:
        memory: a contiguous CPU tensor, e.g. one shared with other processes
            (``Tensor.share_memory_()``).

    >>> region = PinnedRegion(torch.zeros(4))
    >>> region.pinned == torch.cuda.is_available()
    True
    >>> region.close()
    """

    def __init__(self, memory: torch.Tensor) -> None:
        if not isinstance(memory, torch.Tensor) or memory.device.type != "cpu" or not memory.is_contiguous():
            described = (
                f"a {memory.device.type} tensor, contiguous={memory.is_contiguous()}"
                if isinstance(memory, torch.Tensor)
                else type(memory).__name__
            )
            raise ValueError(f"memory must be a contiguous CPU tensor, got {described}")
        self.memory = memory
        self.nbytes = memory.numel() * memory.element_size()
        self.pinned = False
        self._finalizer: weakref.finalize | None = None
        if not torch.cuda.is_available() or self.nbytes == 0:
            return
        if memory.is_pinned():  # page-locked already (pinned_empty): nothing to register, nor to undo
            self.pinned = True
            return
        pointer = memory.data_ptr()
        error = torch.cuda.cudart().cudaHostRegister(pointer, self.nbytes, _REGISTER_DEFAULT)
        if int(error) != 0:
            warnings.warn(
                f"could not page-lock {self.nbytes} bytes of host memory in place (cudaHostRegister error "
                f"{int(error)}); copies from it are staged instead",
                PinnedMemoryWarning,
                stacklevel=2,
            )
            return
        self.pinned = True
        self._finalizer = weakref.finalize(self, _unregister, pointer)

    def close(self) -> None:
        """Unregister the memory (it stays readable as pageable memory)."""
        if self._finalizer is not None:
            self._finalizer()
        self.pinned = False

    def __enter__(self) -> PinnedRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy_pinned(
    source: torch.Tensor, device: object, *, dtype: object = None
) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Copy a page-locked host tensor to ``device`` without staging it; returns ``(result, done)``.

    The copy runs on the default ring's copy stream (so it overlaps the work
    queued on the current stream), followed there by the cast to ``dtype``
    (default: ``source``'s) on the device; the current stream waits for both,
    so work queued on it afterwards sees the result. ``done``: a CUDA event
    recorded after the copy: ``source`` must not be written before it has
    completed. A ``source`` that is not pinned, or a device that is not CUDA,
    is copied by :func:`to_device` (staged), and ``done`` is ``None``: the
    memory may be written at once. A cast on the device rounds as the host's
    does (float32 to bfloat16 or float16: to nearest, ties to even).

    Args:
        source: ``(...)`` CPU tensor, contiguous, inside a :class:`PinnedRegion` (or pinned otherwise).
        device: the target device (as for :func:`to_device`).
        dtype: the result's dtype.

    >>> result, done = copy_pinned(torch.arange(3.0), "cpu", dtype=torch.bfloat16)
    >>> result, done
    (tensor([0., 1., 2.], dtype=torch.bfloat16), None)
    """
    target = resolve_device(device)
    dtype = source.dtype if dtype is None else as_torch_dtype("dtype", dtype)
    if target.type != "cuda" or not source.is_contiguous() or not source.is_pinned():
        return to_device(source, target, dtype=dtype), None
    consumer = torch.cuda.current_stream(target)
    copier = default_ring(target).copy_stream(target)
    with torch.cuda.stream(copier):
        landed = torch.empty(source.shape, dtype=source.dtype, device=target)
        landed.copy_(source, non_blocking=True)
        done = torch.cuda.Event()
        done.record(copier)
        result = landed if dtype == source.dtype else landed.to(dtype)
    consumer.wait_stream(copier)
    result.record_stream(consumer)  # allocated on the copy stream, used on the consumer
    return result, done
