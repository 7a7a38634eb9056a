"""Resampling a stream as it arrives, piece by piece, as torchaudio resamples a whole signal. Numpy only.

A realtime client sends 24 kHz PCM in messages of any length, and a WebSocket
worker loads no torch. :class:`StreamResampler` applies torchaudio's own
windowed-sinc filter (``torchaudio.functional.resample`` with its defaults:
``sinc_interp_hann``, ``lowpass_filter_width=6``, ``rolloff=0.99``) to each
piece with the samples it needs from the pieces before, and holds back the few
whose filter reaches into samples not yet heard; :meth:`~StreamResampler.flush`
ends the signal as torchaudio ends it (zeros after the last sample, the output
``ceil(n * new / orig)`` samples long). The pieces' outputs joined equal the
whole signal's resampling up to float32 rounding.

>>> resampler = StreamResampler(24_000, 16_000)
>>> pieces = [resampler.push(np.ones(n, np.float32)) for n in (100, 7, 2_293)] + [resampler.flush()]
>>> [len(piece) for piece in pieces], sum(len(piece) for piece in pieces)   # 2,400 samples at 24 kHz: 0.1 s
([60, 4, 1528, 8], 1600)
"""

from __future__ import annotations

import math

import numpy as np

from audiomask.checks import check_int

__all__ = ["LOWPASS_FILTER_WIDTH", "ROLLOFF", "StreamResampler", "sinc_kernel"]

LOWPASS_FILTER_WIDTH = 6  # zero crossings of the sinc on each side (torchaudio's default)
ROLLOFF = 0.99  # the low-pass cut-off, as a fraction of the lower rate's Nyquist frequency (torchaudio's default)


def sinc_kernel(orig: int, new: int) -> tuple[np.ndarray, int]:
    """torchaudio's resampling filter for ``orig`` -> ``new`` (both reduced by their gcd): ``(kernel, width)``,
    ``kernel`` ``(new, 2 * width + orig)`` float32, one row per output phase; output ``j`` of a block of
    ``orig`` inputs reads ``width`` inputs before the block to ``width`` after it."""
    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / base)
    index = np.arange(-width, width + orig, dtype=np.float64)[None, :] / orig
    t = (np.arange(0, -new, -1, dtype=np.float64)[:, None] / new + index) * base
    t = np.clip(t, -LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = np.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t *= math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        kernel = np.where(t == 0, 1.0, np.sin(t) / t)
    return (kernel * window * base / orig).astype(np.float32), width


class StreamResampler:
    """One stream's samples from ``orig_rate`` to ``new_rate`` Hz, piece by piece (see the module docstring).

    Args:
        orig_rate, new_rate: Hz, positive integers (``ValueError`` naming the argument otherwise).
    """

    def __init__(self, orig_rate: int, new_rate: int) -> None:
        check_int("orig_rate", orig_rate, minimum=1)
        check_int("new_rate", new_rate, minimum=1)
        gcd = math.gcd(orig_rate, new_rate)
        self._orig, self._new = orig_rate // gcd, new_rate // gcd
        self._kernel, self._width = sinc_kernel(self._orig, self._new)
        # Input samples from global index _start on (before the first, zeros: torchaudio pads so).
        self._buffer = np.zeros(self._width, np.float32)
        self._start = -self._width
        self._block = 0  # the next block of _orig inputs (and _new outputs) to compute
        self._heard = 0  # input samples pushed
        self._made = 0  # output samples returned

    @property
    def identity(self) -> bool:
        """Whether the rates are equal (:meth:`push` returns its input)."""
        return self._orig == self._new

    def push(self, samples: np.ndarray) -> np.ndarray:
        """The next input samples ``(n,)`` float32 in; the output samples ``(m,)`` float32 now known."""
        samples = np.asarray(samples, np.float32)
        if self.identity:
            self._heard += len(samples)
            self._made += len(samples)
            return samples
        self._buffer = np.concatenate((self._buffer, samples))
        self._heard += len(samples)
        # Block b reads inputs [b * orig - width, b * orig + width + orig): complete ones only.
        last = (self._heard - self._width - self._orig) // self._orig
        return self._blocks(last + 1)

    def flush(self) -> np.ndarray:
        """The signal has ended: the last output samples, after which the output is ``ceil(n * new / orig)`` long."""
        if self.identity:
            return np.zeros(0, np.float32)
        target = -(-self._heard * self._new // self._orig)
        self._buffer = np.concatenate((self._buffer, np.zeros(self._width + self._orig, np.float32)))
        wanted = target - self._made
        outputs = self._blocks(-(-target // self._new))[:wanted]  # the blocks holding the target's outputs
        self._made = target
        return outputs

    def _blocks(self, end: int) -> np.ndarray:
        """The outputs of blocks ``_block .. end - 1`` (none when ``end`` is not past it); drops the inputs no
        later block reads."""
        count = end - self._block
        if count <= 0:
            return np.zeros(0, np.float32)
        span = self._kernel.shape[1]
        offset = self._block * self._orig - self._width - self._start
        inputs = self._buffer[offset : offset + (count - 1) * self._orig + span]
        windows = np.lib.stride_tricks.sliding_window_view(inputs, span)[:: self._orig]
        outputs = (windows @ self._kernel.T).ravel()
        self._block = end
        keep_from = end * self._orig - self._width  # the first input the next block reads
        self._buffer = self._buffer[keep_from - self._start :]
        self._start = keep_from
        self._made += len(outputs)
        return outputs
