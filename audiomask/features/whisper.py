"""The Whisper / Qwen3-ASR audio front end: slaney-mel log spectrogram, ``(n_mels, T)``.

Reproduces ``transformers``' ``WhisperFeatureExtractor`` (``feature_size=n_mels``)
and ``Qwen3ASRFeatureExtractor`` (128 mels): frames of 400 samples (25 ms)
every 160 (10 ms), centred on their hop (the signal reflect-padded by 200 on
each side), a periodic Hann window, a 400-point power spectrum, slaney-scale
mel filters with slaney area normalisation (0-8 kHz), ``log10`` of the power
clamped at ``1e-10``, a floor ``DYNAMIC_RANGE`` (8, i.e. 80 dB) below the peak,
then ``(x + 4) / 4``. The STFT's last frame is dropped: ``T = N // 160``.

Padding rules (transformers' ``padding=`` options):

- ``padding="longest"`` on one utterance: ``WhisperFrontend(n_mels)``.
- Whisper's default ``padding="max_length"`` (30 s): ``min_samples=480000``
  zero-extends shorter audio to 30 s (longer audio is not truncated).
- Qwen3-ASR: :meth:`WhisperFrontend.qwen3_asr` zero-extends clips shorter
  than 8000 samples (0.5 s) and zero-pads the frame axis to a multiple of
  100 frames (``2 * n_window``); its default ``padding="max_length"`` is
  ``qwen3_asr(min_samples=480000)``.
- In a batch each row is computed as if alone, as its stream would be
  (padding past its frames is 0). transformers zero-pads the shorter rows
  before its STFT, so there their last two frames see zeros where ours see
  the row's own reflection; every other frame agrees.

The floor. Offline (``floor="utterance"``, the reference) it is the peak of
the whole utterance minus 8, which a stream cannot know until its end.
Streams use the *running floor* (``floor="running"``, also available offline
so that a batch can reproduce what streams produce): frame ``t`` is floored 8
below the peak of frames ``0..t``; while that peak is still below
:data:`SILENCE_PEAK` (nothing but digital silence or a 16-bit noise floor so
far), 8 below ``peak_prior`` (:data:`PEAK_PRIOR`, a speech peak at a
conversational level) instead. Without the prior, a stream's leading silence
would stay at log10(1e-10) = -10, a value offline features never hold (there
silence sits 8 below the utterance's peak); a prior kept beyond the silence
would shift every floored value of audio quieter or louder than the prior, for
the whole stream. From the frame holding the utterance's peak on, the running
floor equals the utterance's; before it, only values below the higher of the
two floors differ, each by at most ``|running floor - utterance floor| / 4``.
How many values differ, and by how much, on the sample utterances at several
levels: ``features_cpu_2core.json``, docs/benchmarks.md "Front ends".
"""

from __future__ import annotations

import numpy as np
import torch
import torchaudio

from audiomask.checks import check_int
from audiomask.constants import HOP_LENGTH, SAMPLE_RATE, WINDOW_LENGTH
from audiomask.features.framing import Framing
from audiomask.features.frontend import Frontend, MelBands

__all__ = [
    "DYNAMIC_RANGE",
    "FLOORS",
    "HOP_SAMPLES",
    "N_FFT",
    "PEAK_PRIOR",
    "QWEN3_FRAME_MULTIPLE",
    "QWEN3_MIN_SAMPLES",
    "SAMPLE_RATE",
    "SILENCE_PEAK",
    "WHISPER_WINDOW_SAMPLES",
    "WhisperFrontend",
]

N_FFT = WINDOW_LENGTH  # 400: the 25 ms window is the FFT size (201 bins)
HOP_SAMPLES = HOP_LENGTH  # 160: one frame per 10 ms
MEL_HIGH_HZ = SAMPLE_RATE / 2
POWER_FLOOR = 1e-10  # clamp before log10: -10 for digital silence
# Filter groups of the banded mel product: among the fastest splits in blocks of MEL_BLOCK_ROWS frames
# (figures: docs/defaults.md).
MEL_GROUPS = 5
DYNAMIC_RANGE = 8.0  # log10 units (80 dB) kept below the peak
LOG_OFFSET = 4.0  # (x + 4) / 4 maps the usual range to about [-1, 1.5]
LOG_SCALE = 4.0
WHISPER_WINDOW_SAMPLES = 30 * SAMPLE_RATE  # Whisper's fixed 30 s input ("max_length" padding)
QWEN3_MIN_SAMPLES = SAMPLE_RATE // 2  # 8000: Qwen3-ASR zero-extends shorter clips
QWEN3_N_WINDOW = 50  # Qwen3ASR n_window: the encoder's conv chunks hold 2 * n_window frames
QWEN3_FRAME_MULTIPLE = 2 * QWEN3_N_WINDOW
# Running floor, in log10 mel power. PEAK_PRIOR: a speech peak at a
# conversational level (the espeak-ng utterances in samples/, peaking near
# -1 dBFS, peak at 1.1-1.4; speech recorded 5-10 dB lower peaks 0.5-1 lower,
# 10 dB being 1 log10 unit of power). SILENCE_PEAK: frames peaking below it
# are silence: a 16-bit noise floor peaks at -9 to -7, noise at -60 dBFS
# near -4.7, speech at -40 dBFS near -2.7.
PEAK_PRIOR = 0.5
SILENCE_PEAK = -6.0
FLOORS = ("utterance", "running")


class WhisperFrontend(Frontend):
    """Whisper / Qwen3-ASR log-mel features, ``(n_mels, T)`` float32 with ``T = N // 160``.

    Args:
        n_mels: mel filters (128 for Whisper large-v3 and Qwen3-ASR, 80 for
            earlier Whisper models), ``>= 1``.
        floor: ``"utterance"`` (the reference: peak of the whole utterance
            minus 8) or ``"running"`` (what streams use; see the module
            docstring). Streams always use the running floor.
        peak_prior: the peak (log10 mel power) the running floor assumes
            until a frame louder than :data:`SILENCE_PEAK` arrives.
        min_samples: zero-extend shorter utterances to this many samples.
        frame_multiple: zero-pad each utterance's frame axis to a multiple of this.

    >>> import numpy as np
    >>> frontend = WhisperFrontend(n_mels=128)
    >>> samples = np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)   # 1 s
    >>> frontend(samples).shape
    (128, 100)
    >>> WhisperFrontend.qwen3_asr()(samples[:4000]).shape   # 0.5 s minimum, 100-frame multiple
    (128, 100)
    >>> stream = WhisperFrontend(floor="running").stream()
    >>> streamed = np.concatenate([stream.push(samples[:7000]), stream.push(samples[7000:]), stream.flush()], axis=1)
    >>> bool(np.abs(streamed - WhisperFrontend(floor="running")(samples)).max() <= 1e-5)
    True
    """

    time_axis = 1
    frame_peaks = True  # the floor follows each frame's peak

    def __init__(
        self,
        n_mels: int = 128,
        *,
        floor: str = "utterance",
        peak_prior: float = PEAK_PRIOR,
        min_samples: int = 0,
        frame_multiple: int = 1,
    ) -> None:
        self.n_mels = check_int("n_mels", n_mels, minimum=1)
        if floor not in FLOORS:
            raise ValueError(f"floor must be one of {FLOORS}, got {floor!r}")
        self.floor = floor
        self.peak_prior = float(peak_prior)
        if not np.isfinite(self.peak_prior):
            raise ValueError(f"peak_prior must be finite, got {peak_prior!r}")
        self.min_samples = check_int("min_samples", min_samples, minimum=0)
        self.frame_multiple = check_int("frame_multiple", frame_multiple, minimum=1)
        self.framing = Framing(win=N_FFT, hop=HOP_SAMPLES, pad=N_FFT // 2, drop_last=True)
        self._window = torch.hann_window(N_FFT, dtype=torch.float32)
        filters = torchaudio.functional.melscale_fbanks(
            N_FFT // 2 + 1, 0.0, MEL_HIGH_HZ, self.n_mels, SAMPLE_RATE, norm="slaney", mel_scale="slaney"
        )
        self._bands = MelBands(filters.double().numpy(), MEL_GROUPS)

    @classmethod
    def qwen3_asr(cls, **options: object) -> WhisperFrontend:
        """The Qwen3-ASR front end: 128 mels, clips zero-extended to 0.5 s, frames padded to a multiple of 100.

        ``options`` override any argument of :class:`WhisperFrontend`.
        """
        settings = {"n_mels": 128, "min_samples": QWEN3_MIN_SAMPLES, "frame_multiple": QWEN3_FRAME_MULTIPLE}
        return cls(**{**settings, **options})

    def _mel_power_into(self, signal: torch.Tensor, frames: int, out: torch.Tensor) -> None:
        windowed = signal.unfold(0, N_FFT, HOP_SAMPLES) * self._window
        power = torch.empty((frames, N_FFT // 2 + 1), dtype=torch.float32)
        self._bands.project_power(torch.fft.rfft(windowed), power, out)

    def _log_(self, mel: torch.Tensor, peaks: torch.Tensor | None) -> None:
        mel.clamp_(min=POWER_FLOOR).log10_()
        if peaks is not None:
            torch.amax(mel, dim=1, out=peaks)
        _scale_(mel)

    def _new_state(self, count: int) -> np.ndarray:
        """Each stream's peak so far (float32 log10 mel power; -inf before its first frame)."""
        return np.full(count, -np.inf, dtype=np.float32)

    def _finish(
        self, batch: torch.Tensor, counts: np.ndarray, state: np.ndarray | None, peaks: torch.Tensor | None
    ) -> None:
        # The batch holds scaled values, (x + 4) / 4, and the floor is scaled alike: the scaling rounds
        # monotonically, so the maximum of the scaled values equals the scaled maximum, bit for bit.
        width = batch.shape[1]
        if width == 0:
            return
        frame_peak = peaks  # (S, width)
        padding = None
        if (counts < width).any():  # rows shorter than the batch: their padding must not count, nor change
            padding = torch.arange(width)[None, :] >= torch.from_numpy(counts)[:, None]
            frame_peak = frame_peak.masked_fill(padding, -np.inf)
        if state is None and self.floor == "utterance":
            peak = frame_peak.amax(dim=1, keepdim=True)
        else:  # peak of frames 0..t (with the stream's earlier frames); the prior while that is silence
            seed = torch.from_numpy(self._new_state(len(counts)) if state is None else state)
            peak = torch.cummax(frame_peak, dim=1).values.clamp_(min=seed[:, None])
            if state is not None:
                state[:] = peak[:, -1].numpy()  # padding is -inf: the last column holds the last frame's peak
            peak.masked_fill_(peak < SILENCE_PEAK, self.peak_prior)
        torch.maximum(batch, _scale_(peak.sub_(DYNAMIC_RANGE))[:, :, None], out=batch)
        if padding is not None:
            batch.masked_fill_(padding[:, :, None], 0.0)


def _scale_(values: torch.Tensor) -> torch.Tensor:
    """``(values + 4) / 4`` in place (float32 log10 mel power to Whisper's range); returns ``values``."""
    return values.add_(LOG_OFFSET).div_(LOG_SCALE)
