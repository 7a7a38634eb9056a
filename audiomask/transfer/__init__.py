"""Host->device transfer: the only module that moves host data to a device.

- :func:`to_device`: copy numpy arrays, lists and tensors to a device through
  a persistent pinned ring, ``non_blocking``, without stalling the host
  whatever the GPU queue holds (on the consumer's CUDA stream up to 64 KiB, else
  on a copy stream while the consumer is busy); :func:`to_host` the way back.
- :class:`PinnedRing`: pinned host slots that builders write into in place,
  each reused only after its last copy has completed; :func:`default_ring`:
  the ring ``to_device`` stages through (read its ``stats()``).
- :func:`pinned_empty`: a page-locked host tensor, for results copied back
  again and again.
- :class:`PinnedRegion`: existing host memory (a batch other processes write)
  page-locked in place; :func:`copy_pinned` copies from it with no staging.
- :class:`sync_check`: makes tests fail on any ``non_blocking`` host->device
  copy from pageable or non-dense memory (:func:`classify_copy` decides).
- :func:`is_dense`: whether a tensor can be copied as one block;
  :func:`torch_dtype_of`: the torch dtype a numpy array arrives as;
  :func:`resolve_device`: the device an argument names, the CPU without CUDA;
  :func:`stage_copy`: the staging memcpy into a slot.

Without CUDA everything works and returns CPU tensors.
"""

from __future__ import annotations

from audiomask.transfer._resolve import require_device, resolve_device, torch_dtype_of
from audiomask.transfer.dense import is_dense
from audiomask.transfer.registered import PinnedRegion, copy_pinned
from audiomask.transfer.ring import (
    DEFAULT_CONSUMER_COPY_BYTES,
    DEFAULT_MAX_PINNED_BYTES,
    DEFAULT_NUM_SLOTS,
    DEFAULT_SLOT_BYTES,
    VIEW_ALIGN_BYTES,
    KiB,
    MiB,
    PinnedRing,
    RingStats,
    Staged,
)
from audiomask.transfer.staging import (
    PARALLEL_COPY_BYTES,
    default_ring,
    parallel_copy_bytes,
    pinned_empty,
    stage_copy,
    to_device,
    to_host,
)
from audiomask.transfer.sync import (
    CopyVerdict,
    FlaggedCopy,
    UnsafeCopyError,
    UnsafeCopyWarning,
    classify_copy,
    sync_check,
)

__all__ = [
    "DEFAULT_CONSUMER_COPY_BYTES",
    "DEFAULT_MAX_PINNED_BYTES",
    "DEFAULT_NUM_SLOTS",
    "DEFAULT_SLOT_BYTES",
    "PARALLEL_COPY_BYTES",
    "VIEW_ALIGN_BYTES",
    "CopyVerdict",
    "FlaggedCopy",
    "KiB",
    "MiB",
    "PinnedRegion",
    "PinnedRing",
    "RingStats",
    "Staged",
    "UnsafeCopyError",
    "UnsafeCopyWarning",
    "classify_copy",
    "copy_pinned",
    "default_ring",
    "is_dense",
    "parallel_copy_bytes",
    "pinned_empty",
    "require_device",
    "resolve_device",
    "stage_copy",
    "sync_check",
    "to_device",
    "to_host",
    "torch_dtype_of",
]
