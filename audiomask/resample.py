"""Resampling as the audio arrives, piece by piece, equal to torchaudio's resampling of the whole. Numpy only.

:class:`Resampler` applies torchaudio's own windowed-sinc filter
(``torchaudio.functional.resample`` with its defaults: ``sinc_interp_hann``,
``lowpass_filter_width=6``, ``rolloff=0.99``) as a polyphase convolution in
float64: each :meth:`~Resampler.push` computes every output whose input window
lies inside the samples seen so far and keeps the rest (under
``2 * width + orig / g`` input samples, ``width`` the filter's half span, ``g``
the rates' gcd); :meth:`~Resampler.flush` ends the signal as torchaudio ends it
(zeros after the last sample, the output ``ceil(n * new / orig)`` samples
long). The pieces' outputs joined equal the whole signal's resampling to
float32 rounding. Latency: ``width + orig / g`` input samples. Numpy only,
so that :func:`audiomask.audio.iter_blocks` and a WebSocket worker (which
loads no torch) share it.

>>> resampler = Resampler(24_000, 16_000)
>>> pieces = [resampler.push(np.ones(n, np.float32)) for n in (100, 7, 2_293)] + [resampler.flush()]
>>> [len(piece) for piece in pieces], sum(len(piece) for piece in pieces)   # 2,400 samples at 24 kHz: 0.1 s
([60, 4, 1528, 8], 1600)
"""

from __future__ import annotations

import math

import numpy as np

from audiomask.checks import check_int

__all__ = [
    "LOWPASS_FILTER_WIDTH",
    "MAX_RESAMPLE_FILTER_BYTES",
    "ROLLOFF",
    "Resampler",
    "resample_refusal",
    "sinc_kernel",
]

LOWPASS_FILTER_WIDTH = 6  # zero crossings of the sinc on each side (torchaudio's default)
ROLLOFF = 0.99  # the low-pass cut-off, as a fraction of the lower rate's Nyquist frequency (torchaudio's default)
# The filter holds (new / g) phases of (orig / g + 2 * width) float64 taps, g = gcd of the rates, and
# torchaudio takes several times that memory, and seconds for the largest, to build it. Every standard rate
# from 8 to 768 kHz needs at most 2.2 MiB (11.025 kHz); exotic 44.056 kHz needs 85 MiB and coprime rates such
# as 16001 Hz 2 GB. Figures: docs/defaults.md.
MAX_RESAMPLE_FILTER_BYTES = 16 * 2**20
FLOAT64_BYTES = 8


def _reduced(orig: int, new: int) -> tuple[int, int, int]:
    """``(orig / g, new / g, width)``: the rates over their gcd, and the filter's half span in input samples."""
    gcd = math.gcd(orig, new)
    orig, new = orig // gcd, new // gcd
    return orig, new, math.ceil(LOWPASS_FILTER_WIDTH * orig / (min(orig, new) * ROLLOFF))


def resample_refusal(orig_sr: int, new_sr: int) -> str | None:
    """Why ``orig_sr`` -> ``new_sr`` Hz is refused (its filter is over :data:`MAX_RESAMPLE_FILTER_BYTES`), or
    ``None``."""
    if orig_sr == new_sr:
        return None
    orig, new, width = _reduced(orig_sr, new_sr)
    nbytes = new * (orig + 2 * width) * FLOAT64_BYTES
    if nbytes <= MAX_RESAMPLE_FILTER_BYTES:
        return None
    return (
        f"cannot resample {orig_sr} Hz to {new_sr} Hz: their ratio needs a {nbytes / 2**20:,.0f} MiB filter "
        f"(limit {MAX_RESAMPLE_FILTER_BYTES // 2**20} MiB); convert the audio to a common rate first"
    )


def sinc_kernel(orig_sr: int, new_sr: int) -> tuple[np.ndarray, int]:
    """torchaudio's resampling filter for ``orig_sr`` -> ``new_sr`` Hz: ``(kernel, width)``, ``kernel``
    ``(new / g, 2 * width + orig / g)`` float64, one row per output phase; an output of a block of ``orig / g``
    inputs reads ``width`` inputs before the block to ``width`` after it."""
    orig, new, width = _reduced(orig_sr, new_sr)
    base = min(orig, new) * ROLLOFF
    index = np.arange(-width, width + orig, dtype=np.float64)[None, :] / orig
    t = (np.arange(0, -new, -1, dtype=np.float64)[:, None] / new + index) * base
    t = np.clip(t, -LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = np.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t *= math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        kernel = np.where(t == 0, 1.0, np.sin(t) / t)
    return kernel * window * (base / orig), width


class Resampler:
    """One stream's samples from ``orig_sr`` to ``new_sr`` Hz, piece by piece (see the module docstring).

    Args:
        orig_sr, new_sr: Hz, integers ``>= 1`` (``ValueError`` naming the argument otherwise, or when their
            filter is too large: :func:`resample_refusal`). Equal rates pass the samples through unchanged,
            as ``torchaudio.functional.resample`` does.
    """

    def __init__(self, orig_sr: int, new_sr: int) -> None:
        orig_sr = check_int("orig_sr", orig_sr, minimum=1)
        new_sr = check_int("new_sr", new_sr, minimum=1)
        refusal = resample_refusal(orig_sr, new_sr)
        if refusal:
            raise ValueError(f"orig_sr and new_sr: {refusal}")
        self._orig, self._new, _ = _reduced(orig_sr, new_sr)
        self._identity = orig_sr == new_sr
        kernel, self._width = sinc_kernel(orig_sr, new_sr) if not self._identity else (np.zeros((1, 1)), 0)
        self._taps = np.ascontiguousarray(kernel.T)  # (span, phases): each window's outputs in one row product
        # Input samples from global index _start on (before the first, zeros: torchaudio pads so).
        self._held = np.zeros(self._width, np.float64)
        self._start = -self._width
        self._block = 0  # the next block of orig / g inputs (and new / g outputs) to compute
        self._pushed = 0  # input samples pushed
        self._emitted = 0  # output samples returned
        self._flushed = False

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Resample the next piece: ``(n,)`` float -> ``(m,)`` float32, the outputs now known."""
        if self._flushed:
            raise ValueError("push after flush: this Resampler's stream has ended")
        samples = np.asarray(samples)
        if samples.ndim != 1:
            raise ValueError(f"samples must be 1-D, got shape {samples.shape}")
        if self._identity:
            return samples.astype(np.float32, copy=False)
        self._held = np.concatenate((self._held, samples.astype(np.float64)))
        self._pushed += len(samples)
        # Block b reads inputs [b * orig - width, b * orig + width + orig): the complete ones only.
        return self._blocks((self._pushed - self._width - self._orig) // self._orig + 1)

    def flush(self) -> np.ndarray:
        """End the stream: the last ``(m,)`` float32 outputs, after which ``ceil(n * new / orig)`` came in all."""
        if self._flushed:
            raise ValueError("flush called twice: this Resampler's stream has already ended")
        self._flushed = True
        if self._identity:
            return np.zeros(0, np.float32)
        total = -(-self._pushed * self._new // self._orig)  # ceil, in exact integers
        wanted = total - self._emitted
        self._held = np.concatenate((self._held, np.zeros(self._width + self._orig)))
        return self._blocks(-(-total // self._new))[:wanted]

    def _blocks(self, end: int) -> np.ndarray:
        """The outputs of blocks ``_block .. end - 1`` (none unless ``end`` is past it); drops the inputs no later
        block reads."""
        count = end - self._block
        if count <= 0:
            return np.zeros(0, np.float32)
        span = self._taps.shape[0]
        offset = self._block * self._orig - self._width - self._start
        inputs = self._held[offset : offset + (count - 1) * self._orig + span]
        # Block b's window: span inputs from b * orig (a strided view; the held samples are contiguous float64).
        windows = np.ndarray((count, span), inputs.dtype, inputs, 0, (self._orig * inputs.itemsize, inputs.itemsize))
        outputs = np.dot(windows, self._taps).ravel().astype(np.float32)
        self._block = end
        keep_from = end * self._orig - self._width  # the first input the next block reads
        self._held = self._held[keep_from - self._start :]
        self._start = keep_from
        self._emitted += len(outputs)
        return outputs
