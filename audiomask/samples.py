"""Audio samples checked where they enter: finite, within range, 1-D float32. Numpy only (no torch).

Servers check every client message with these in processes that load no model,
and the front ends and the recognizer with the same functions.
"""

from __future__ import annotations

import sys

import numpy as np

from audiomask.constants import SAMPLE_RATE
from audiomask.errors import AudioError

__all__ = ["MAX_SAMPLE_MAGNITUDE", "as_samples", "check_samples", "first_unusable"]

# Full scale is +-1.0; float files may exceed it, and integer PCM written as float without
# scaling reaches 2^31 (32-bit). Beyond that a value is garbage, and near 1e12 the front ends'
# float32 power overflows to inf: refused like NaN.
MAX_SAMPLE_MAGNITUDE = 2.0**31
# A float array whose sum of squares is at most this holds no sample beyond the magnitude: the sum of
# non-negative rounded squares is at least each of them (in any order, with or without FMA), and a float
# beyond 2^31 is at least one unit in the last place beyond it, so its rounded square exceeds 2^62.
# NaN, Inf and overflow make the sum NaN or Inf, which is not at most this.
_SQUARES_BOUND = MAX_SAMPLE_MAGNITUDE**2


def first_unusable(samples: np.ndarray) -> int | None:
    """Index of the first NaN, Inf or sample beyond ``+-MAX_SAMPLE_MAGNITUDE``; ``None`` when all are usable.

    ``samples``: ``(n,)`` float (any strides). Usable audio costs one BLAS dot product (one read of the
    samples, no temporary array); only an array that fails it is searched sample by sample.
    """
    if samples.dtype.kind == "f" and np.dot(samples, samples) <= _SQUARES_BOUND:
        return None
    # One comparison finds all three: NaN compares False, so "not <=" flags it with Inf and huge values.
    usable = np.abs(samples) <= MAX_SAMPLE_MAGNITUDE
    return None if usable.all() else int(np.argmin(usable))


def check_samples(samples: np.ndarray, source: object, offset: int = 0, sample_rate: int = SAMPLE_RATE) -> None:
    """Refuse NaN, Inf and samples beyond ``+-MAX_SAMPLE_MAGNITUDE``, naming ``source`` and where.

    Args:
        samples: ``(n,)`` float samples, full scale ``+-1.0``.
        source: the file or stream they come from, quoted first in the message.
        offset: frames of ``source`` before ``samples`` (for the reported position).
        sample_rate: Hz, for the reported time.

    Raises:
        AudioError: ``"<source>: non-finite sample (nan) at frame F (T s)"`` or
            ``"<source>: sample V at frame F (T s) is beyond +-2^31 ..."``.

    >>> check_samples(np.array([0.5, np.inf], np.float32), "live-3", offset=16000)
    Traceback (most recent call last):
    ...
    audiomask.errors.AudioError: live-3: non-finite sample (inf) at frame 16001 (1.000 s)
    """
    first = first_unusable(samples)
    if first is None:
        return
    value = samples[first]
    index = offset + first
    where = f"at frame {index} ({index / sample_rate:.3f} s)"
    if not np.isfinite(value):
        raise AudioError(f"{source}: non-finite sample ({value}) {where}")
    raise AudioError(
        f"{source}: sample {value:.6g} {where} is beyond +-2^31 (full scale is +-1.0; not audio in any known scale)"
    )


def as_samples(name: str, samples: object, *, source: object = None, offset: int = 0) -> np.ndarray:
    """``samples`` as a 1-D float32 numpy array (no copy when it already is one).

    Integer PCM is refused rather than guessed at, and so are bytes and text
    (raw PCM is decoded by the caller, e.g. with ``np.frombuffer``): front
    ends take samples in [-1, 1] (what :func:`audiomask.audio.load`
    returns). NaN, Inf and absurd values raise
    :class:`~audiomask.errors.AudioError` (:func:`check_samples`, naming
    ``source``, default ``name``, and the frame counted from ``offset``), so
    no front end turns them into NaN features silently. Read-only arrays are copied: torch cannot wrap them.

    >>> as_samples("samples", [0.0, float("nan")])
    Traceback (most recent call last):
    ...
    audiomask.errors.AudioError: samples: non-finite sample (nan) at frame 1 (0.000 s)
    """
    if isinstance(samples, (bytes, bytearray, str)):
        raise ValueError(
            f"{name} must be a 1-D float array of {SAMPLE_RATE} Hz samples in [-1, 1], got {type(samples).__name__}: "
            "bytes and text are not samples (decode raw 16-bit PCM with "
            "np.frombuffer(data, np.int16).astype(np.float32) / 32768)"
        )
    torch = sys.modules.get("torch")  # a tensor means torch is loaded: this module never imports it
    is_tensor = torch is not None and isinstance(samples, torch.Tensor)
    array = samples.detach().cpu().numpy() if is_tensor else np.asarray(samples)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (mono samples), got shape {array.shape}")
    if array.dtype.kind != "f":  # numpy's floating types (float16 .. longdouble); not complex
        raise ValueError(f"{name} must hold floating-point samples in [-1, 1], got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    check_samples(array, name if source is None else source, offset)
    return array if array.flags.writeable else array.copy()
