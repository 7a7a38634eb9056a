"""Argument checks shared by every stage; numpy only (``audiomask.masks`` uses them).

Each check either returns the value in its canonical type or raises
:class:`ValueError` whose message names the argument and its value, e.g.
``chunk_size must be an integer, got 2.5``.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Sequence

import numpy as np

__all__ = ["INT64_MAX", "INT64_MIN", "check_int", "check_lengths", "check_out", "check_seconds", "pick_device"]

_MAX_SHOWN = 8  # elements of an array quoted in an error message
INT64_MAX = int(np.iinfo(np.int64).max)
INT64_MIN = int(np.iinfo(np.int64).min)
_DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")


def _show(value: object) -> str:
    """A short repr for error messages: long arrays are cut, never dumped whole."""
    if isinstance(value, np.ndarray) and value.size > _MAX_SHOWN:
        head = ", ".join(str(v) for v in value.ravel()[:_MAX_SHOWN])
        return f"array([{head}, ...], shape={value.shape}, dtype={value.dtype})"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
    """Return ``value`` as a Python ``int``; reject bools, floats and values outside ``[minimum, maximum]``.

    ``maximum`` defaults to the int64 maximum, and values below the int64
    minimum are refused too: every integer argument ends up in numpy or torch
    arithmetic, where a larger one would overflow.

    >>> check_int("chunk_size", np.int64(4), minimum=1)
    4
    >>> check_int("chunk_size", 2.5)
    Traceback (most recent call last):
    ...
    ValueError: chunk_size must be an integer, got 2.5
    >>> check_int("size", 2**64)
    Traceback (most recent call last):
    ...
    ValueError: size must be <= 9223372036854775807, got 18446744073709551616
    """
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = operator.index(value)  # accepts int and numpy integers, refuses floats
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {_show(value)}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if number < INT64_MIN:
        raise ValueError(f"{name} must be >= {INT64_MIN}, got {number}")
    if number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def check_lengths(
    name: str,
    values: object,
    *,
    maximum: int | None = None,
    maximum_name: str | None = None,
) -> np.ndarray:
    """Return ``values`` as a C-contiguous ``int64`` array of shape ``(B,)``.

    Accepts a sequence or 1-D array of non-negative integers (an integer
    scalar is one length). Floats, bools, negative values and values above
    ``maximum`` raise ``ValueError`` naming ``name``.

    >>> check_lengths("feature_lengths", [40, 17])
    array([40, 17])
    >>> check_lengths("feature_lengths", [40, 17], maximum=32, maximum_name="max_frames")
    Traceback (most recent call last):
    ...
    ValueError: feature_lengths must be <= max_frames (32), got 40 at index 0
    """
    if isinstance(values, (bool, np.bool_)):
        raise ValueError(f"{name} must hold integers, got {values!r}")
    try:
        array = np.asarray(values)
    except ValueError:  # ragged nesting, e.g. [[1, 2], [3]]: numpy's message names no argument
        raise ValueError(f"{name} must be a 1-D sequence of integers, got {_show(values)}") from None
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got {_show(array)}")
    if array.size and array.dtype.kind == "u" and array.max() > INT64_MAX:  # would wrap to negative int64
        index = int(np.argmax(array))
        raise ValueError(f"{name} must be <= {INT64_MAX}, got {array[index]} at index {index}")
    lengths = np.ascontiguousarray(array, dtype=np.int64)
    if lengths.size and lengths.min() < 0:
        index = int(np.argmin(lengths))
        raise ValueError(f"{name} must be >= 0, got {lengths[index]} at index {index}")
    if maximum is not None and lengths.size and lengths.max() > maximum:
        index = int(np.argmax(lengths))
        bound = f"{maximum_name} ({maximum})" if maximum_name else str(maximum)
        raise ValueError(f"{name} must be <= {bound}, got {lengths[index]} at index {index}")
    return lengths


def check_out(out: object, shape: Sequence[int], dtype: np.dtype | type = np.bool_) -> np.ndarray:
    """Check that ``out`` can take a result of ``shape`` and ``dtype`` in place.

    ``out`` must be a writeable, C-contiguous numpy array of exactly that shape
    and dtype (for instance a numpy view of a pinned ring slot).
    """
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    if not isinstance(out, np.ndarray):
        raise ValueError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(f"out must have shape {shape} and dtype {dtype}, got shape {out.shape} and dtype {out.dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")
    return out


def pick_device(value: str, name: str = "device") -> str:
    """A device option as given by a user: ``auto`` -> ``cuda`` where CUDA is available, else ``cpu``.

    ``cpu``, ``cuda`` and ``cuda:N`` are returned as they are; ``cuda`` on a
    machine without CUDA is an error (a command sized for a GPU would not
    keep up on the CPU), as is any other value; ``name`` is the option's name
    in the message. torch is imported only here, so the module stays numpy only.

    >>> pick_device("cpu"), pick_device("auto") in ("cpu", "cuda")
    ('cpu', True)
    >>> pick_device("gpu", "--device")
    Traceback (most recent call last):
    ...
    ValueError: --device must be auto, cpu, cuda or cuda:N, got 'gpu'
    """
    if not isinstance(value, str) or not _DEVICE_NAME.fullmatch(value):
        raise ValueError(f"{name} must be auto, cpu, cuda or cuda:N, got {value!r}")
    import torch

    if value == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if value.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"{name} {value}: CUDA is not available on this machine (use {name} cpu or auto)")
    return value


def check_seconds(name: str, value: object, *, minimum: float, maximum: float, positive: bool = False) -> float | None:
    """``value`` as seconds: ``None``, or a real number in ``[minimum, maximum]`` (above ``minimum`` if ``positive``).

    >>> check_seconds("timeout", 2, minimum=0.0, maximum=60.0)
    2.0
    >>> check_seconds("timeout", float("nan"), minimum=0.0, maximum=60.0)
    Traceback (most recent call last):
    ...
    ValueError: timeout must be None or a number of seconds in [0.0, 60.0], got nan
    """
    if value is None:
        return None
    low = f"({minimum}" if positive else f"[{minimum}"
    message = f"{name} must be None or a number of seconds in {low}, {maximum}], got {value!r}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(message)
    seconds = float(value)
    if not (minimum <= seconds <= maximum) or (positive and seconds == minimum) or math.isnan(seconds):
        raise ValueError(message)
    return seconds
