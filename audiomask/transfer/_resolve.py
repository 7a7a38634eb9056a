"""Argument resolution shared by the transfer modules: devices, dtypes, CUDA streams, ``out`` tensors.

Every helper returns the canonical value or raises :class:`ValueError` whose
message names the argument and the value, like :mod:`audiomask.checks`.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.transfer.dense import is_dense

__all__ = [
    "as_torch_dtype",
    "check_out_tensor",
    "check_shape",
    "check_stream",
    "numpy_dtype",
    "require_device",
    "resolve_device",
    "torch_dtype_of",
]

_CPU = torch.device("cpu")
_DEVICE_FORMS = "'cpu', 'cuda', 'cuda:N' or a CUDA index"


@functools.cache  # asked on every copy: whether CUDA works does not change while a process runs
def _cuda_device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(device: object) -> torch.device:
    """Return ``device`` as ``cpu`` or ``cuda:N``; any CUDA device is ``cpu`` where CUDA is unavailable.

    Accepts ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a :class:`torch.device` or a
    CUDA index (an ``int`` >= 0). ``"cuda"`` means the current CUDA device.
    Falling back to the CPU (rather than failing) lets the same code run on
    machines without a GPU, a CPU-only torch build included.

    >>> resolve_device("cpu"), resolve_device("cuda:0").type in ("cpu", "cuda")
    (device(type='cpu'), True)
    >>> resolve_device("gpu")
    Traceback (most recent call last):
    ...
    ValueError: device must be 'cpu', 'cuda', 'cuda:N' or a CUDA index, got 'gpu'
    """
    if isinstance(device, (bool, np.bool_)):  # equal to 0 and 1, so refused before the cache sees them
        raise ValueError(f"device must be {_DEVICE_FORMS}, got {device!r}")
    try:
        resolved = _resolve_cached(device)
    except TypeError:  # unhashable: resolved (and refused) uncached
        resolved = _resolve(device)
    if resolved is not None:
        return resolved
    return _cuda_device(torch.cuda.current_device())


@functools.cache
def _cuda_device(index: int) -> torch.device:
    return torch.device("cuda", index)


def _resolve(device: object) -> torch.device | None:
    """:func:`resolve_device` without the cache: ``None`` for the current CUDA device.

    An index is read as a CUDA index here, never by ``torch.device(int)``,
    which raises on a torch build without CUDA.
    """
    try:
        is_index = isinstance(device, (int, np.integer))
        parsed = torch.device("cuda", operator.index(device)) if is_index else torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be {_DEVICE_FORMS}, got {device!r}") from None
    if parsed.type == "cpu":
        return _CPU
    if parsed.type != "cuda":
        raise ValueError(f"device must be a CPU or CUDA device, got {device!r}")
    count = _cuda_device_count()
    if not count:
        return _CPU
    if parsed.index is None:
        return None
    if parsed.index >= count:
        raise ValueError(f"device {device!r} does not exist: this machine has {count} CUDA device(s)")
    return parsed


# Every copy resolves a device, and parsing one costs microseconds. typed: 1 and 1.0 stay apart.
_resolve_cached = functools.lru_cache(maxsize=64, typed=True)(_resolve)


def check_stream(stream: object, device: torch.device) -> None:
    """Check that ``stream`` is ``None`` or a :class:`torch.cuda.Stream` of the CUDA ``device``."""
    if stream is None:
        return
    if device.type != "cuda":
        raise ValueError(f"stream must be None for device {device}, got {stream!r}")
    if not isinstance(stream, torch.cuda.Stream):
        raise ValueError(f"stream must be a torch.cuda.Stream, got {type(stream).__name__}")
    if stream.device != device:
        raise ValueError(f"stream is on {stream.device}, but device is {device}")


@functools.cache
def torch_dtype_of(np_dtype: np.dtype) -> torch.dtype | None:
    """The torch dtype of a numpy array of ``np_dtype`` (any byte order), or ``None`` (strings, objects).

    >>> torch_dtype_of(np.dtype(">f4")), torch_dtype_of(np.dtype("U1"))
    (torch.float32, None)
    """
    try:
        return torch.from_numpy(np.empty(0, dtype=np_dtype.newbyteorder("="))).dtype
    except (TypeError, ValueError):
        return None


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype that shares ``dtype``'s bytes, or ``None`` (``bfloat16``, float8 types).

    >>> numpy_dtype(torch.bool), numpy_dtype(torch.bfloat16)
    (dtype('bool'), None)
    """
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return None


def as_torch_dtype(name: str, value: object) -> torch.dtype:
    """Return ``value`` (a torch dtype, or anything ``numpy.dtype`` accepts) as a torch dtype.

    >>> as_torch_dtype("dtype", "float16"), as_torch_dtype("dtype", torch.bfloat16)
    (torch.float16, torch.bfloat16)
    >>> as_torch_dtype("dtype", object)
    Traceback (most recent call last):
    ...
    ValueError: dtype must be a torch.dtype or a numpy dtype torch supports, got <class 'object'>
    """
    if isinstance(value, torch.dtype):
        return value
    result = None
    if value is not None:  # numpy reads None as float64: refuse it rather than guess
        try:
            result = torch_dtype_of(value if isinstance(value, np.dtype) else np.dtype(value))  # type: ignore[call-overload]
        except TypeError:
            pass
    if result is None:
        raise ValueError(f"{name} must be a torch.dtype or a numpy dtype torch supports, got {value!r}")
    return result


def check_shape(name: str, shape: object) -> tuple[int, ...]:
    """Return ``shape`` (an int or a sequence of ints >= 0) as a tuple.

    >>> check_shape("shape", 3), check_shape("shape", (2, 0))
    ((3,), (2, 0))
    """
    if isinstance(shape, Sequence) and not isinstance(shape, str):
        return tuple(check_int(f"{name}[{i}]", n, minimum=0) for i, n in enumerate(shape))
    return (check_int(name, shape, minimum=0),)


def check_out_tensor(out: object, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Check that ``out`` is a dense tensor on ``device`` of exactly ``shape`` and ``dtype``."""
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, but device is {device}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, but the data has shape {tuple(shape)}")
    if out.dtype != dtype:
        raise ValueError(f"out has dtype {out.dtype}, expected {dtype}")
    if not is_dense(out):
        raise ValueError(f"out must be dense (no expanded or strided view), got strides {out.stride()}")
    return out


def require_device(device: object) -> torch.device:
    """:func:`resolve_device`, except that a CUDA device on a machine without CUDA is a ``ValueError``.

    For callers sized for a GPU, where a silent fallback to the CPU would not keep up.

    >>> require_device("cpu")
    device(type='cpu')
    """
    target = resolve_device(device)  # names a malformed device or a missing CUDA index; CPU without CUDA
    # Every form resolve_device accepts but "cpu" names CUDA; torch.device(int) itself raises on a CPU-only build.
    if target.type == "cpu" and str(device).split(":")[0] != "cpu":
        raise ValueError(
            f"device={device!r}, but CUDA is not available on this machine (torch.cuda.is_available() is False); "
            "pass device='cpu'"
        )
    return target
