"""A copy queued before its payload is staged, held on the GPU until the host writes a word.

Why: the submit of a large copy costs the host far more right after the staging
memcpy than before it, because that memcpy has flushed the CPU's caches (64 MiB:
0.07-0.08 ms after staging against ~0.008 ms warm; bench/probes/gated_copy_h200.json,
pinned_kinds_h200.json). So the ring queues the copy first, behind a
``cuStreamWaitValue32`` on a pinned word, then stages the payload and writes the
word: the stream copies once the word reaches the value, and the host pays the
memcpy and one store (the probe: within 0.02 ms of the memcpy at 16 and 64 MiB;
the transfer benchmark's blocks still found ``to_device`` 0.12 / 0.34 ms over its
separately timed memcpy there, bench/results/transfer_h200.json: the submit's own
steps run slower on the caches a large payload has just passed through).

torch does not expose stream memory operations, so the driver's entry point is
called through ctypes (as vLLM's ``cuda_wrapper`` does for the runtime). Where
libcuda or the entry point is missing, :func:`close` returns ``False`` and the
ring stages first, as without gates. The word lives in pinned memory from
``cudaHostAlloc`` (torch's pinned allocator), whose device address equals its
host address under unified addressing (every 64-bit CUDA platform).

While a gate is closed (the staging memcpy: ~1 ms for 64 MiB) a ``cudaMalloc``
anywhere in the process may wait for the gated stream, so nothing between
:func:`close` and :func:`open_` may allocate device memory or wait for the
device: the ring allocates the result before it closes the gate, and the
staging memcpy touches host memory only.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["close", "new_word", "open_"]

# CU_STREAM_WAIT_VALUE_GEQ: wait until (int32_t)(*word - value) >= 0, so values may wrap around.
_WAIT_GEQ = 0x0
_VALUE_MASK = 0xFFFFFFFF


@functools.cache
def _wait_value_32() -> Callable[..., int] | None:
    """libcuda's ``cuStreamWaitValue32`` (``_v2`` where the driver has it), or ``None``.

    ``None`` off x86-64 too: :func:`open_` relies on x86's store order (no fence from Python).
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    for name in ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"):
        function = getattr(driver, name, None)
        if function is not None:
            function.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            function.restype = ctypes.c_int
            return function
    return None


def new_word() -> tuple[torch.Tensor, np.ndarray]:
    """A pinned ``uint32`` word set to 0: the tensor that owns it and its numpy view."""
    word = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    return word, word.numpy().view(np.uint32)


def close(stream: Any, word: np.ndarray, value: int) -> bool:
    """Queue on ``stream`` a wait until ``word`` reaches ``value``; ``False`` if the driver cannot.

    Every copy queued on ``stream`` afterwards waits for :func:`open_` with
    ``value`` (or a later one). The host must open the gate before it waits
    for ``stream``, or it waits forever.
    """
    wait = _wait_value_32()
    if wait is None:
        return False
    return wait(stream.cuda_stream, word.ctypes.data, value & _VALUE_MASK, _WAIT_GEQ) == 0


def open_(word: np.ndarray, value: int) -> None:
    """Let the copies waiting for ``value`` run (a plain store: x86 orders it after the staged bytes)."""
    word[0] = value & _VALUE_MASK
