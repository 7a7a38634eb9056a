"""The Phi-4-multimodal (Phi-4MM) audio front end: 80 kaldi-mel log filterbanks, ``(T, 80)``.

Reproduces ``transformers``' ``Phi4MultimodalFeatureExtractor`` (itself the
Phi-4MM processor's ``_extract_spectrogram`` + ``_extract_features`` at
16 kHz): frames of 25 ms every 10 ms that fit in the signal (no centring),
pre-emphasis 0.97 applied inside each frame (its first sample is
pre-emphasised against itself, as kaldi does), samples scaled to 16-bit PCM
range, a symmetric Hamming window, a 512-point power spectrum, 80 triangular
filters spaced on the kaldi mel scale and triangular in mel (0-7690 Hz), power
clamped at >= 1, natural log.

Differences from the reference, all deliberate:

- Its FFT can run in float32 (``fft_dtype``) for speed, at the cost of
  parity in weak low filters of loud frames; the default float64 matches.
- Input is 16 kHz only, like the transformers extractor. The original Phi-4MM
  processor also took 8 kHz audio and, by default ("fillzero"), computed a
  256-point spectrum zero-filled above 4 kHz; here 8 kHz audio is resampled
  to 16 kHz by :mod:`audiomask.audio` instead (the processor's "resample"
  option). Its downsampling of other rates by an integer factor
  (``resample_poly(wav, 1, fs // 16000)``, which leaves 44.1 kHz audio at
  22.05 kHz) is not reproduced.
- In a padded batch, frames past a row's length are 0 (= log of the clamp
  floor). The reference leaves some of them holding values computed from the
  row's last samples; both are padding, excluded by the lengths.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from audiomask.constants import HOP_LENGTH, SAMPLE_RATE, WINDOW_LENGTH
from audiomask.features.framing import Framing
from audiomask.features.frontend import SLAB_FRAMES, Frontend, MelBands

__all__ = [
    "HOP_SAMPLES",
    "MEL_HIGH_HZ",
    "N_FFT",
    "N_MELS",
    "PCM_SCALE",
    "PREEMPHASIS",
    "SAMPLE_RATE",
    "WIN_SAMPLES",
    "Phi4MMFrontend",
    "kaldi_mel_banks",
]

WIN_SAMPLES = WINDOW_LENGTH  # 400: 25 ms frames
HOP_SAMPLES = HOP_LENGTH  # 160: one frame per 10 ms
N_FFT = 512  # the next power of two above WIN_SAMPLES
N_MELS = 80
MEL_LOW_HZ = 0.0
MEL_HIGH_HZ = 7690.0  # the reference's upper filter edge, below the 8 kHz Nyquist
PREEMPHASIS = 0.97
PCM_SCALE = 32768.0  # float samples -> 16-bit PCM range, the scale the model was trained on
POWER_FLOOR = 1.0  # clamp before the log: log(1) = 0 for silence
_SCRATCH = threading.local()  # per thread: {fft dtype: scratch buffers of one slab}
# Filter groups of the banded mel product over 257 power bins: the fastest split in blocks of
# MEL_BLOCK_ROWS frames (figures: docs/defaults.md).
MEL_GROUPS = 3


def kaldi_mel(hz: np.ndarray | float) -> np.ndarray:
    """Kaldi's mel scale, ``1127 ln(1 + f / 700)``."""
    return 1127.0 * np.log1p(np.asarray(hz, dtype=np.float64) / 700.0)


def kaldi_mel_banks(
    n_mels: int = N_MELS,
    n_fft: int = N_FFT,
    sample_rate: int = SAMPLE_RATE,
    low_hz: float = MEL_LOW_HZ,
    high_hz: float = MEL_HIGH_HZ,
) -> np.ndarray:
    """Kaldi-style mel filters: ``n_mels`` triangles equally spaced and triangular on the kaldi mel scale.

    Filter ``m`` rises from mel edge ``m`` to ``m + 1`` and falls to ``m + 2``,
    the ``n_mels + 2`` edges equally spaced from ``kaldi_mel(low_hz)`` to
    ``kaldi_mel(high_hz)``; FFT bin ``k`` (``k * sample_rate / n_fft`` Hz)
    gets the triangle's height at its mel. No area normalisation.

    Returns:
        ``(n_fft // 2 + 1, n_mels)`` float64 weights in [0, 1] (spectrum bins x filters).

    >>> banks = kaldi_mel_banks()
    >>> banks.shape, float(banks[-1].max())   # the 8 kHz bin lies above 7690 Hz
    ((257, 80), 0.0)
    """
    edges = np.linspace(kaldi_mel(low_hz), kaldi_mel(high_hz), n_mels + 2)
    bins = kaldi_mel(np.arange(n_fft // 2 + 1) * (sample_rate / n_fft))[:, None]
    rising = (bins - edges[:-2]) / (edges[1:-1] - edges[:-2])
    falling = (edges[2:] - bins) / (edges[2:] - edges[1:-1])
    return np.maximum(0.0, np.minimum(rising, falling))


class Phi4MMFrontend(Frontend):
    """Phi-4MM log-mel features, ``(T, 80)`` float32 with ``T = (N - 400) // 160 + 1`` (0 below 400 samples).

    ``frontend(samples)`` for one utterance, ``frontend.batch(signals)`` for a
    ragged batch, ``frontend.stream()`` / ``frontend.streams(count)`` for
    streaming; streamed frames equal the offline ones for any chunking.

    Args:
        fft_dtype: precision of the windowed frames and their FFT:
            ``torch.float64`` (default, the reference's: agrees with
            transformers to ~2e-6) or ``torch.float32`` (faster; see the
            benchmark). A float32 FFT's rounding error is relative to the
            frame's loudest component, about 1e-7 of it with MKL, so a mel
            filter covering one or two FFT bins (the lowest filters do) that
            holds ~90-100 dB less power than that component, just above the
            clamp, comes out up to ~4e-3 off on loud speech. Either way the
            pre-emphasis is rounded to float32 exactly as the reference rounds it.

    >>> import numpy as np
    >>> frontend = Phi4MMFrontend()
    >>> samples = np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)   # 1 s
    >>> features = frontend(samples)
    >>> features.shape, features.dtype
    ((98, 80), dtype('float32'))
    >>> stream = frontend.stream()
    >>> streamed = np.concatenate([stream.push(samples[:5000]), stream.push(samples[5000:]), stream.flush()])
    >>> bool(np.abs(streamed - features).max() <= 1e-5)
    True
    """

    framing = Framing(win=WIN_SAMPLES, hop=HOP_SAMPLES, pad=0, drop_last=False)
    n_mels = N_MELS
    time_axis = 0

    def __init__(self, fft_dtype: torch.dtype = torch.float64) -> None:
        if fft_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"fft_dtype must be torch.float32 or torch.float64, got {fft_dtype!r}")
        self.fft_dtype = fft_dtype
        window = torch.hamming_window(WIN_SAMPLES, periodic=False, dtype=torch.float64)
        # PCM scaling folded into the window (a power of two: exact). The
        # first sample's pre-emphasis is against itself: x[0] - 0.97 x[0].
        self._window = (PCM_SCALE * window).to(fft_dtype)
        self._bands = MelBands(kaldi_mel_banks(), MEL_GROUPS)

    def _scratch(self) -> dict[str, torch.Tensor]:
        """This thread's scratch for one slab of :data:`SLAB_FRAMES` frames (~3.6 MB in float64), made once.

        Reused across calls rather than allocated per slab: freshly allocated
        megabyte buffers come back from the allocator as new pages often
        enough (glibc trims its heap) that page faults cost more than the
        arithmetic (figures: docs/defaults.md). Per thread, so that threads may share a front end.
        """
        buffers = getattr(_SCRATCH, "buffers", None)
        if buffers is None:
            buffers = _SCRATCH.buffers = {}
        scratch = buffers.get(self.fft_dtype)
        if scratch is None:
            samples = HOP_SAMPLES * (SLAB_FRAMES - 1) + WIN_SAMPLES
            # Normal tensors even when the first call comes under torch.inference_mode (an LLM's transcription):
            # inference tensors could not be written by any later call outside it.
            with torch.inference_mode(False):
                scratch = buffers[self.fft_dtype] = {
                    "padded": torch.zeros((SLAB_FRAMES, N_FFT), dtype=self.fft_dtype),  # columns WIN_SAMPLES: stay 0
                    "emphasized": torch.empty(samples, dtype=self.fft_dtype),
                    "delayed": torch.empty(samples, dtype=torch.float32),
                    "first": torch.empty(SLAB_FRAMES, dtype=torch.float32),
                    "power": torch.empty((SLAB_FRAMES, N_FFT // 2 + 1), dtype=torch.float32),
                }
        return scratch

    def _mel_power_into(self, signal: torch.Tensor, frames: int, out: torch.Tensor) -> None:
        scratch = self._scratch()
        # Pre-emphasis once over the signal (frames overlap 2.5 times), in
        # float32 as the reference computes it: x[n] - fl32(0.97 * x[n - 1]),
        # the difference rounded to float32 and then widened.
        n = len(signal) - 1
        delayed = torch.mul(signal[:-1], PREEMPHASIS, out=scratch["delayed"][:n])
        emphasized = scratch["emphasized"][:n]
        if self.fft_dtype == torch.float32:
            torch.sub(signal[1:], delayed, out=emphasized)
        else:
            emphasized.copy_(torch.sub(signal[1:], delayed, out=delayed))
        # Each frame's first sample is pre-emphasised against itself.
        first = signal[: HOP_SAMPLES * (frames - 1) + 1 : HOP_SAMPLES]
        first_emph = torch.mul(first, PREEMPHASIS, out=scratch["first"][:frames])
        torch.sub(first, first_emph, out=first_emph)
        padded = scratch["padded"][:frames]
        torch.mul(emphasized.unfold(0, WIN_SAMPLES - 1, HOP_SAMPLES), self._window[1:], out=padded[:, 1:WIN_SAMPLES])
        padded[:, 0].copy_(first_emph).mul_(self._window[0])  # widened first: the product in fft_dtype
        # rfft without out=: MKL's out= variant computes into a new tensor and copies it into out.
        self._bands.project_power(torch.fft.rfft(padded), scratch["power"][:frames], out)

    def _log_(self, mel: torch.Tensor, peaks: torch.Tensor | None) -> None:
        mel.clamp_(min=POWER_FLOOR).log_()
