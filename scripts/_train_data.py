"""Training data for scripts/train_ctc.py: the corpus manifest, augmented features, and batches.

- :func:`read_manifest`: the utterances of a ``scripts/make_corpus.py`` corpus.
- :func:`augment`: speed, volume and noise perturbation of 16 kHz samples.
- :func:`compute_features`: the log-mel features of many utterances in worker
  processes (:class:`audiomask.features.Phi4MMFrontend`), each a copy clean or
  augmented, as one ``(frames, 80)`` float16 array with per-utterance offsets.
- :class:`Batcher`: batches of similar-length utterances under a frame budget.
- :func:`ctc_feasible`: whether a label fits in the CTC frames an utterance has.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, installed or not

SAMPLE_RATE = 16000  # Hz
SPEED_FACTORS = (0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15)  # tempo, pitch and formants together: bridges voices
GAIN_DB = (-15.0, 5.0)  # volume change, uniform; the result is clipped to [-1, 1] as a recording would be
NOISE_SHARE = 0.5  # of augmented copies: additive noise
NOISE_SNR_DB = (5.0, 30.0)  # speech-to-noise power ratio, uniform
NOISE_SLOPE = (0.0, 2.0)  # noise power spectrum ~ f ** -slope: 0 white, 1 pink, 2 brown; uniform


@dataclass(frozen=True)
class Utterance:
    """One line of a corpus manifest, with its audio path made absolute."""

    id: str
    path: Path
    text: str
    engine: str
    voice: str
    split: str
    seconds: float


def read_manifest(corpus: Path) -> list[Utterance]:
    """The utterances of ``corpus/manifest.jsonl`` in file order; a missing manifest is a ``ValueError``."""
    manifest = Path(corpus) / "manifest.jsonl"
    if not manifest.is_file():
        raise ValueError(f"corpus {str(corpus)!r} has no manifest.jsonl (make it with scripts/make_corpus.py)")
    utterances = []
    for line in manifest.read_text().splitlines():
        record = json.loads(line)
        utterances.append(
            Utterance(
                record["id"],
                Path(corpus) / record["path"],
                record["text"],
                record["engine"],
                record["voice"],
                record["split"],
                float(record["seconds"]),
            )
        )
    return utterances


def _resample(samples: np.ndarray, orig_sr: int, new_sr: int) -> np.ndarray:
    import torch
    import torchaudio

    resampled = torchaudio.functional.resample(torch.from_numpy(samples).double(), orig_sr, new_sr)
    return resampled.float().numpy()


def colored_noise(length: int, slope: float, rng: np.random.Generator) -> np.ndarray:
    """``(length,)`` float32 noise of unit power whose power spectrum falls as ``f ** -slope``."""
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


_FRONTEND = None  # the worker process's front end


def _init_worker() -> None:
    global _FRONTEND
    import torch

    from audiomask.features import Phi4MMFrontend

    torch.set_num_threads(1)  # one process per core already
    _FRONTEND = Phi4MMFrontend()


def _features_of(task: tuple[str, int | None]) -> np.ndarray:
    """Worker: ``(path, seed)`` -> ``(T, 80)`` float16 features; ``seed`` ``None``: clean, else augmented."""
    from audiomask.audio import load

    path, seed = task
    samples, _ = load(path, SAMPLE_RATE)
    if seed is not None:
        samples, _ = augment(samples, np.random.default_rng(seed))
    return _FRONTEND(samples).astype(np.float16)


@dataclass
class FeatureSet:
    """Features of many utterance copies in one array: copy ``i`` is ``frames[offsets[i]:offsets[i] + lengths[i]]``.

    ``frames`` ``(F, 80)`` float16 log-mel; ``items[i]`` indexes the utterance list it was made from.
    """

    frames: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    items: np.ndarray


def compute_features(
    utterances: Sequence[Utterance], copies: int, seed: int, workers: int, augmented: bool = True
) -> FeatureSet:
    """Features of ``copies`` copies of each utterance, computed in ``workers`` processes.

    Copy 0 is clean; copies ``1 ..`` are augmented (:func:`augment`) with
    seeds derived from ``seed``, the copy and the utterance, so the result
    does not depend on ``workers``. ``augmented=False``: every copy is clean.
    """
    tasks = [
        (str(utterance.path), None if copy == 0 or not augmented else seed * 1_000_003 + copy * 10_000_019 + index)
        for copy in range(copies)
        for index, utterance in enumerate(utterances)
    ]
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers, initializer=_init_worker) as pool:
            pieces = pool.map(_features_of, tasks, chunksize=16)
    else:
        _init_worker()
        pieces = [_features_of(task) for task in tasks]
    lengths = np.array([len(piece) for piece in pieces], np.int64)
    return FeatureSet(
        frames=np.concatenate(pieces) if pieces else np.zeros((0, 80), np.float16),
        offsets=np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64),
        lengths=lengths,
        items=np.tile(np.arange(len(utterances)), copies),
    )


def ctc_feasible(label: Sequence[int], tokens: int) -> bool:
    """Whether CTC can align ``label`` to ``tokens`` frames: one frame per label, plus a blank between repeats.

    >>> ctc_feasible([1, 2, 2], 3), ctc_feasible([1, 2, 2], 4)
    (False, True)
    """
    repeats = sum(1 for a, b in zip(label, label[1:]) if a == b)
    return len(label) + repeats <= tokens


class Batcher:
    """Batches of copy indices of similar length, each with at most ``batch_frames`` padded frames.

    Every epoch the lengths are jittered by up to ``jitter`` (relative) before
    sorting, so batches differ between epochs, and the batch order is shuffled.

    >>> batcher = Batcher(np.array([100, 400, 120, 390, 110]), batch_frames=800, seed=0)
    >>> sorted(sorted(batch.tolist()) for batch in batcher.epoch())
    [[0, 2, 4], [1, 3]]
    """

    def __init__(self, lengths: np.ndarray, batch_frames: int, seed: int, jitter: float = 0.1) -> None:
        if len(lengths) and int(lengths.max()) > batch_frames:
            raise ValueError(f"batch_frames ({batch_frames}) must hold the longest utterance ({int(lengths.max())})")
        self.lengths, self.batch_frames, self.jitter = np.asarray(lengths), batch_frames, jitter
        self.rng = np.random.default_rng(seed)

    def epoch(self) -> list[np.ndarray]:
        """One pass over every index, as a shuffled list of batches."""
        keys = self.lengths * (1 + self.jitter * self.rng.uniform(-1, 1, len(self.lengths)))
        order = np.argsort(keys, kind="stable")
        batches, start = [], 0
        while start < len(order):
            longest, end = self.lengths[order[start]], start + 1
            while end < len(order):
                grown = max(longest, self.lengths[order[end]])
                if grown * (end + 1 - start) > self.batch_frames:  # padded frames if it joined
                    break
                longest, end = grown, end + 1
            batches.append(order[start:end])
            start = end
        self.rng.shuffle(batches)
        return batches
