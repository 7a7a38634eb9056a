"""Streaming by re-feeding, as the official recipe does: :class:`ReFeedStreams`; :func:`streams_for` picks the class.

Phi-4-multimodal's released encoder attends over the whole utterance, so none
of its outputs is final before the utterance ends: every update encodes all
of the segment's features again (each frame still computed once, by the
streaming front end) and prefills the whole prompt into the stream's emptied
slot (head, audio, tail, the rolled-back prefix), as ``qwen-asr``'s
``streaming_transcribe`` does for Qwen3-ASR. An update's cost so grows with
the segment; a segment holds ``segment_windows`` spans of
:data:`SEGMENT_SPAN_FRAMES` (8 s) at most, then its offline answer is
committed and the stream goes on from there. The policy, the prefixes, the
finals and the slots are :class:`~audiomask.llm.streaming.LLMStreams`'.
Qwen3-ASR streams incrementally (:class:`~audiomask.llm.streaming.LLMStreams`);
the benchmark runs this class on it as the recipe's stand-in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from audiomask.constants import HOP_LENGTH
from audiomask.llm.model import AudioLM
from audiomask.llm.prompt import encode_texts
from audiomask.llm.streaming import LLMStreams, Partial
from audiomask.models import Qwen3ASREncoder

__all__ = ["FEATURE_BATCH_BYTES", "SEGMENT_SPAN_FRAMES", "ReFeedStreams", "streams_for"]

SEGMENT_SPAN_FRAMES = 800  # 8 s of 10 ms frames (a Qwen3-ASR window): what segment_windows counts
FEATURE_BATCH_BYTES = 256 * 2**20  # an update's feature batches: at most this many float32 bytes staged at once


def streams_for(model: AudioLM, slots: int, **options: Any) -> LLMStreams:
    """The streams ``model`` streams with: :class:`LLMStreams` (incremental) for Qwen3-ASR, whose encoder attends
    inside windows, :class:`ReFeedStreams` for the others. ``options``: :class:`LLMStreams`' keywords."""
    kind = LLMStreams if isinstance(model.encoder, Qwen3ASREncoder) else ReFeedStreams
    return kind(model, slots, **options)


class ReFeedStreams(LLMStreams):
    """:class:`~audiomask.llm.streaming.LLMStreams` whose every update encodes the whole segment again and
    prefills its whole prompt (the official recipe); any :class:`~audiomask.llm.model.AudioLM`.

    Its partials are each the model's answer for the segment so far, from the recipe's prefix: the offline
    path's (:meth:`AudioLM.audio_inputs`, one call per batch of at most :data:`FEATURE_BATCH_BYTES` of
    features) on the streaming front end's frames.
    """

    def _size_windows(self) -> None:
        self.window_frames = SEGMENT_SPAN_FRAMES
        self.window_tokens = _audio_tokens(self.model, SEGMENT_SPAN_FRAMES)

    def _init_windows(self, slots: int) -> None:
        self._frames: list[list[np.ndarray]] = [[] for _ in range(slots)]  # slot s's segment's frames (bins, T)
        self._window_filled = np.zeros(slots, np.int64)  # no open-window buffer: its lengths stay 0

    def _reset_windows(self, slot: int) -> None:
        self._frames[slot] = []

    def _push_window_frames(self, chunks: list[np.ndarray], slots: np.ndarray) -> np.ndarray:
        """Keep the frames of ``chunks`` with their segments' (each segment is encoded whole every update)."""
        new, added = self._push_frames(chunks, slots)
        for row, slot in enumerate(slots.tolist()):
            self._frames[slot].append(new[row, :, : added[row]])
        return np.zeros(len(slots), np.int64)

    def _decode(self, streams: list[Any], chunks: list[np.ndarray]) -> list[Partial]:
        if not streams:
            return []
        model, lm = self.model, self.model.lm
        for stream, chunk in zip(streams, chunks, strict=True):
            stream.samples.append(chunk)
        slots = np.array([stream.slot for stream in streams], np.int64)
        self._push_window_frames(chunks, slots)
        self._push_ahead(slots)
        frames = [np.concatenate(self._frames[stream.slot], axis=1) for stream in streams]
        span = self.window_frames * HOP_LENGTH
        for stream in streams:  # whole spans of samples heard: the segment ends once it holds segment_windows
            stream.closed_windows = sum(len(piece) for piece in stream.samples) // span
        audio = self._audio(frames)
        prefixes = self._prefixes(streams)
        inputs = []
        for stream, tokens, prefix, ids in zip(
            streams, audio, prefixes, encode_texts(model.tokenizer, prefixes), strict=True
        ):
            self.cache.reset(stream.slot)
            tail = lm.embed(torch.tensor([*self.parts.tail, *ids], dtype=torch.long))
            inputs.append(torch.cat([piece.to(lm.dtype) for piece in (self._head, tokens, tail)]))
            stream.raw = prefix
        return self._answer(streams, inputs)

    def _audio(self, frames: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Each segment's audio inputs ``(n_b, hidden_size)`` from its frames ``(bins, T_b)``, in feature batches
        of at most :data:`FEATURE_BATCH_BYTES`, laid out as the front end gives them."""
        time_major = self.model.frontend.time_axis == 0
        audio: list[torch.Tensor] = []
        for group in _feature_groups([frame.shape[1] for frame in frames], frames[0].shape[0]):
            lengths = np.array([frames[row].shape[1] for row in group], np.int64)
            batch = np.zeros((len(group), frames[0].shape[0], max(1, int(lengths.max()))), np.float32)
            for position, row in enumerate(group):
                batch[position, :, : lengths[position]] = frames[row]
            features = torch.from_numpy(batch.transpose(0, 2, 1).copy() if time_major else batch)
            audio += self.model.audio_inputs(features, lengths)
        return audio


def _audio_tokens(model: AudioLM, frames: int) -> int:
    """The language-model inputs ``frames`` feature frames of one utterance become."""
    encoder = model.encoder
    if isinstance(encoder, Qwen3ASREncoder):
        return int(encoder.output_lengths(np.array([frames]))[0])
    return -(-frames // encoder.config.time_reduction)


def _feature_groups(lengths: Sequence[int], bins: int) -> list[list[int]]:
    """Consecutive rows whose padded float32 feature batch stays within :data:`FEATURE_BATCH_BYTES`."""
    groups: list[list[int]] = [[]]
    longest = 0
    for row, length in enumerate(lengths):
        longest = max(longest, length)
        if groups[-1] and (len(groups[-1]) + 1) * bins * longest * 4 > FEATURE_BATCH_BYTES:
            groups.append([])
            longest = length
        groups[-1].append(row)
    return groups
