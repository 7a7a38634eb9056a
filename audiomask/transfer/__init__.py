"""Host->device transfer: the only module that moves host data to a device.

- :func:`to_device`: copy numpy arrays, lists and CPU tensors to a device
  through a persistent pinned ring, ``non_blocking`` (on the consumer's
  stream up to 64 KiB, else on a copy stream while the consumer is busy),
  without stalling the host whatever the GPU queue holds; from 16 MiB the copy
  is queued before the staging memcpy and held on the GPU by a gate the host
  opens once the payload is staged (:mod:`audiomask.transfer._gate`).
- :class:`PinnedRing`: pinned host slots that builders write into in place,
  each reused only after its last copy has completed.
- :func:`is_dense`: whether a tensor can be copied as one block.
- :class:`sync_check`: makes tests fail on any ``non_blocking`` host->device
  copy from pageable or non-dense memory.
- :func:`torch_dtype_of`: the torch dtype a numpy array arrives as.
- :func:`stage_copy`: the staging memcpy into a slot; :func:`default_ring`:
  the ring ``to_device`` stages through (read its ``stats()``).

Without CUDA everything works and returns CPU tensors. The copies that stall
(kept as baselines and negative controls) live in :mod:`audiomask.transfer.harness`.
"""

from __future__ import annotations

from audiomask.transfer._resolve import torch_dtype_of
from audiomask.transfer.dense import is_dense
from audiomask.transfer.ring import (
    DEFAULT_MAX_PINNED_BYTES,
    DEFAULT_NUM_SLOTS,
    DEFAULT_SLOT_BYTES,
    GATED_COPY_BYTES,
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
    "DEFAULT_MAX_PINNED_BYTES",
    "DEFAULT_NUM_SLOTS",
    "DEFAULT_SLOT_BYTES",
    "GATED_COPY_BYTES",
    "VIEW_ALIGN_BYTES",
    "CopyVerdict",
    "FlaggedCopy",
    "KiB",
    "MiB",
    "PARALLEL_COPY_BYTES",
    "PinnedRing",
    "RingStats",
    "Staged",
    "UnsafeCopyError",
    "UnsafeCopyWarning",
    "classify_copy",
    "default_ring",
    "is_dense",
    "parallel_copy_bytes",
    "pinned_empty",
    "stage_copy",
    "sync_check",
    "to_device",
    "to_host",
    "torch_dtype_of",
]
