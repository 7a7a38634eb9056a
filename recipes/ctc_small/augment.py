"""Augmentation: of waveforms on the host while features are computed, of features on the device per batch.

- :func:`augment`: speed, volume and noise perturbation of 16 kHz samples
  (:func:`colored_noise` is the noise).
- :func:`warp_mel`: vocal-tract-length perturbation of log-mel features.
- :func:`tilt_spectrum`: a random equaliser (a straight line across the mel bins).
- :func:`spec_augment`: SpecAugment's frequency bands and time spans.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from audiomask.constants import FRAMES_PER_SECOND, SAMPLE_RATE
from audiomask.transfer import to_device
from recipes.ctc_small.config import TrainConfig

__all__ = ["augment", "colored_noise", "spec_augment", "tilt_spectrum", "warp_mel"]

SPEED_FACTORS = (0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15)  # tempo, pitch and formants together: bridges voices
GAIN_DB = (-15.0, 5.0)  # volume change, uniform; the result is clipped to [-1, 1] as a recording would be
NOISE_SHARE = 0.5  # of augmented copies: additive noise
NOISE_SNR_DB = (5.0, 30.0)  # speech-to-noise power ratio, uniform
NOISE_SLOPE = (0.0, 2.0)  # noise power spectrum ~ f ** -slope: 0 white, 1 pink, 2 brown; uniform


def _resample(samples: np.ndarray, orig_sr: int, new_sr: int) -> np.ndarray:
    import torchaudio

    resampled = torchaudio.functional.resample(torch.from_numpy(samples).double(), orig_sr, new_sr)
    return resampled.float().numpy()


def colored_noise(length: int, slope: float, rng: np.random.Generator) -> np.ndarray:
    """``(length,)`` float32 noise of unit power whose power spectrum falls as ``f ** -slope``.

    >>> noise = colored_noise(1000, 1.0, np.random.default_rng(0))
    >>> noise.shape, noise.dtype, round(float(np.mean(noise.astype(np.float64) ** 2)), 6)
    ((1000,), dtype('float32'), 1.0)
    """
    size = 1 << max(length - 1, 1).bit_length()  # a power of two: an FFT of a prime length is ~10x slower
    spectrum = np.fft.rfft(rng.standard_normal(size))
    frequencies = np.arange(len(spectrum), dtype=np.float64)
    frequencies[0] = 1.0  # no infinite gain at DC
    noise = np.fft.irfft(spectrum * frequencies ** (-slope / 2), n=size)[:length]
    return (noise / max(np.sqrt(np.mean(noise**2)), 1e-12)).astype(np.float32)


def augment(samples: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """Speed, volume and noise perturbation of ``(N,)`` float32 16 kHz samples; returns them and what was drawn.

    Speed: the samples are played at ``factor`` times their rate (resampled
    from ``16000 * factor`` Hz to 16 kHz), which changes tempo and pitch like
    a faster or slower tape. Noise: colored noise at a random SNR, with
    probability :data:`NOISE_SHARE`. Volume: a random gain, then clipping to
    [-1, 1].

    >>> rng = np.random.default_rng(0)
    >>> out, drawn = augment(np.sin(np.arange(16000, dtype=np.float32) / 10) / 2, rng)
    >>> sorted(drawn), out.dtype, bool(np.abs(out).max() <= 1)
    (['gain_db', 'noise_snr_db', 'speed'], dtype('float32'), True)
    """
    factor = float(SPEED_FACTORS[int(rng.integers(len(SPEED_FACTORS)))])
    if factor != 1.0:
        samples = _resample(samples, round(SAMPLE_RATE * factor), SAMPLE_RATE)
    snr_db = None
    if rng.random() < NOISE_SHARE:
        snr_db = float(rng.uniform(*NOISE_SNR_DB))
        speech_power = float(np.mean(samples.astype(np.float64) ** 2))
        noise = colored_noise(len(samples), float(rng.uniform(*NOISE_SLOPE)), rng)
        samples = samples + noise * np.float32(np.sqrt(speech_power / 10 ** (snr_db / 10)))
    gain_db = float(rng.uniform(*GAIN_DB))
    samples = np.clip(samples * np.float32(10 ** (gain_db / 20)), -1.0, 1.0).astype(np.float32)
    return samples, {"speed": factor, "noise_snr_db": snr_db, "gain_db": gain_db}


def spec_augment(
    config: TrainConfig, features: torch.Tensor, lengths: np.ndarray, fill: torch.Tensor, rng: np.random.Generator
) -> torch.Tensor:
    """``features`` ``(B, T, 80)`` with random mel bands and short time spans set to ``fill`` ``(80,)`` (the mean).

    Per utterance: ``freq_masks`` bands of up to ``freq_mask_bins`` bins, and a Poisson number (``time_masks_per_s``
    a second) of spans of up to ``time_mask_frames`` frames, inside its ``lengths`` ``(B,)`` frames. Drawn on the
    host in a few vector calls.
    """
    batch, frames, bins = features.shape
    widths = rng.integers(0, config.freq_mask_bins + 1, (batch, config.freq_masks))
    starts = rng.integers(0, bins - widths + 1)
    band_index = np.arange(bins)[None, None, :]
    bands = ((band_index >= starts[..., None]) & (band_index < (starts + widths)[..., None])).any(axis=1)
    counts = rng.poisson(config.time_masks_per_s * lengths / FRAMES_PER_SECOND)
    rows = np.repeat(np.arange(batch), counts)
    widths = rng.integers(0, config.time_mask_frames + 1, len(rows))
    starts = rng.integers(0, np.maximum(1, lengths[rows] - widths))
    edges = np.zeros((batch, frames + 1), np.int64)  # +1 where a span starts, -1 after it ends
    np.add.at(edges, (rows, starts), 1)
    np.add.at(edges, (rows, np.minimum(starts + widths, frames)), -1)
    spans = np.cumsum(edges[:, :frames], axis=1) > 0
    bands, spans = to_device(bands, features.device), to_device(spans, features.device)
    return torch.where(bands[:, None, :] | spans[:, :, None], fill, features)


def warp_mel(features: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Vocal-tract-length perturbation: each utterance's mel axis stretched by its factor, linearly interpolated.

    ``features`` ``(B, T, 80)``, ``factors`` ``(B,)`` on the same device: output bin ``k`` reads input bin
    ``k / factor`` (a factor above 1 moves formants up, as a shorter vocal tract does), clamped to the top bin.

    >>> ramp = torch.arange(4.0).expand(1, 2, 4)
    >>> warp_mel(ramp, torch.tensor([2.0]))[0, 0].tolist()
    [0.0, 0.5, 1.0, 1.5]
    """
    bins = features.shape[-1]
    source = (torch.arange(bins, device=features.device) / factors[:, None]).clamp(max=bins - 1)  # (B, 80)
    low = source.floor().long()
    high = (low + 1).clamp(max=bins - 1)
    weight = (source - low)[:, None, :]
    index = low[:, None, :].expand(-1, features.shape[1], -1)
    upper = high[:, None, :].expand(-1, features.shape[1], -1)
    return torch.lerp(features.gather(2, index), features.gather(2, upper), weight)


def tilt_spectrum(features: torch.Tensor, lengths: torch.Tensor, tilts_db: torch.Tensor) -> torch.Tensor:
    """A random equaliser: each utterance's log-mel plus a straight line across the mel bins.

    ``features`` ``(B, T, 80)`` natural-log mel power, ``lengths`` ``(B,)``
    frames and ``tilts_db`` ``(B,)`` on the same device: the top bin gains
    ``tilt / 2`` dB and the bottom one loses as much (voices and recording
    chains differ in spectral tilt, and a speaker's fricatives must not be
    told apart by it alone). Padding frames stay as they are.

    >>> out = tilt_spectrum(torch.zeros(1, 2, 80), torch.tensor([1]), torch.tensor([10.0]))
    >>> round(float(out[0, 0, -1] - out[0, 0, 0]), 4), float(out[0, 1].abs().max())  # ln(10): 10 dB
    (2.3026, 0.0)
    """
    bins, frames = features.shape[-1], features.shape[1]
    ramp = torch.linspace(-0.5, 0.5, bins, device=features.device)
    valid = torch.arange(frames, device=features.device)[None, :] < lengths[:, None]  # (B, T)
    offsets = (tilts_db * (math.log(10.0) / 10.0))[:, None] * ramp  # (B, 80), dB of power in natural-log units
    return features + valid[:, :, None] * offsets[:, None, :]
