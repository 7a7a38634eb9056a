"""The data of training and evaluation: the corpus manifest, features of many utterances, and batches.

- :func:`read_manifest`: the utterances of a :mod:`recipes.ctc_small.corpus` corpus.
- :func:`compute_features`: the log-mel features of many utterances in worker
  processes (:class:`audiomask.features.Phi4MMFrontend`), each a copy clean or
  augmented (:func:`recipes.ctc_small.augment.augment`), as one
  ``(frames, 80)`` float16 array with per-utterance offsets
  (:class:`FeatureSet`; :func:`split_features` cuts it per copy).
- :class:`DeviceFeatures`: a :class:`FeatureSet` on the device, gathered into padded batches there.
- :class:`Batcher`: batches of similar-length utterances under a frame budget.
- :func:`ctc_feasible`: whether a label fits in the CTC frames an utterance has.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from audiomask.audio import load
from audiomask.constants import SAMPLE_RATE
from audiomask.features import Phi4MMFrontend
from audiomask.transfer import to_device
from recipes.ctc_small.augment import augment

__all__ = [
    "Batcher",
    "DeviceFeatures",
    "FeatureSet",
    "Utterance",
    "compute_features",
    "ctc_feasible",
    "read_manifest",
    "split_features",
]


@dataclass(frozen=True)
class Utterance:
    """One line of a corpus manifest, its audio path joined to the corpus folder."""

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
        raise ValueError(
            f"corpus {str(corpus)!r} has no manifest.jsonl (make it with python -m recipes.ctc_small.corpus)"
        )
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


_FRONTEND = None  # the worker process's front end


def _init_worker() -> None:
    global _FRONTEND
    torch.set_num_threads(1)  # one process per core already
    _FRONTEND = Phi4MMFrontend()


def _features_of(task: tuple[str, int | None]) -> np.ndarray:
    """Worker: ``(path, seed)`` -> ``(T, 80)`` float16 features; ``seed`` ``None``: clean, else augmented."""
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


def split_features(features: FeatureSet) -> list[np.ndarray]:
    """Each copy's ``(T, 80)`` frames as float32, in copy order."""
    return [features.frames[o : o + n].astype(np.float32) for o, n in zip(features.offsets, features.lengths)]


class DeviceFeatures:
    """A :class:`FeatureSet`'s frames on the device (float16), gathered into padded batches there."""

    UPLOAD_ROWS = 1 << 20  # frames per host->device copy (160 MiB of float16): within the pinned ring's bound

    def __init__(self, features: FeatureSet, device: torch.device) -> None:
        self.offsets, self.lengths = features.offsets, features.lengths
        self.frames = torch.empty(features.frames.shape, dtype=torch.float16, device=device)
        for start in range(0, len(features.frames), self.UPLOAD_ROWS):
            piece = features.frames[start : start + self.UPLOAD_ROWS]
            to_device(piece, device, out=self.frames[start : start + len(piece)])

    def batch(self, members: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """Copies ``members`` as ``(B, T_max, 80)`` float32 (padding repeats each last frame) and their lengths."""
        lengths = self.lengths[members]
        steps = np.minimum(np.arange(int(lengths.max())), lengths[:, None] - 1)
        index = to_device(self.offsets[members][:, None] + steps, self.frames.device)
        return self.frames[index].float(), lengths


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
