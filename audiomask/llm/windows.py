"""The open encoder windows of streaming Qwen3-ASR streams, encoded incrementally (for ``LLMStreams``).

Qwen3-ASR's encoder attends inside fixed 8 s windows of 1 s conv chunks, each chunk convolved on its own:
a closed window's tokens are final, and so are a completed chunk's conv tokens. A stream's open window is
kept as frames (one row of a buffer on the model's device, a slot per stream) and as the conv tokens of its
completed chunks, so that an update convolves only its new chunks and attends only the open window again.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from audiomask.llm.lm import ATTENTION_BACKENDS
from audiomask.llm.model import AudioLM
from audiomask.ragged import ragged_index
from audiomask.transfer import to_device

__all__ = ["encode_open_windows", "shift_open_windows"]


def encode_open_windows(
    model: AudioLM,
    windows: torch.Tensor,
    chunk_tokens: torch.Tensor,
    chunks_done: np.ndarray,
    slots: np.ndarray,
    lengths: np.ndarray,
    counts: np.ndarray,
) -> torch.Tensor:
    """The projected audio tokens ``(B, n, hidden)`` of slot ``slots[b]``'s first ``lengths[b]`` frames of
    ``windows`` (``(slots, mel bins, width)`` float32, the open windows' frames; ``counts[b]`` tokens).

    Convolutions run only over the chunks not yet convolved: each chunk is convolved on its own, so a
    completed chunk's conv tokens are final and kept (slot s's first ``chunks_done[s]`` in
    ``chunk_tokens[s]``, ``(slots, window tokens, d_model)``; both updated here, the chunks a closing
    window leaves moved to the next window's places); the open window's attention runs again. Rows whose
    frames close a window (more than one window's frames) attend apart from the others: padded to the
    longest in one batch, every row would attend two windows.
    """
    encoder, config = model.encoder, model.encoder.config
    device, dtype = windows.device, chunk_tokens.dtype
    size, per_chunk, per_window = config.chunk_frames, config.chunk_tokens, config.chunks_per_window
    window_frames = per_window * size  # 800 frames: 8 s
    done = chunks_done[slots]
    chunks = -(-lengths // size)  # chunks holding frames, the last possibly short
    fresh = chunks - done
    rows, index = ragged_index(fresh)
    index += done[rows]
    where = to_device(np.stack((rows, index, slots[rows])), device)
    frames = windows.view(*windows.shape[:2], -1, size)[where[2], :, where[1]]  # (N, bins, size)
    convolved = encoder.embed_chunks(frames.to(dtype))  # (N, chunk_tokens, d_model)
    tokens = chunk_tokens[to_device(slots, device)]  # (B, window_tokens, d_model): kept chunks first
    tokens = F.pad(tokens, (0, 0, 0, max(0, int(chunks.max()) * per_chunk - tokens.shape[1])))
    tokens.view(len(slots), -1, per_chunk, tokens.shape[2])[where[0], where[1]] = convolved
    # The open window's completed chunks after this update, at their places in the next window.
    closing = lengths // window_frames
    complete = lengths // size
    keep = np.flatnonzero((index >= per_window * closing[rows]) & (index < complete[rows]))
    if keep.size:
        kept = to_device(np.stack((slots[rows[keep]], index[keep] - per_window * closing[rows[keep]])), device)
        places = chunk_tokens.view(len(chunks_done), per_window, per_chunk, -1)
        places[kept[0], kept[1]] = convolved[to_device(keep, device)]
    chunks_done[slots] = complete - per_window * closing
    closes = lengths > window_frames
    groups = [rows for rows in (np.flatnonzero(~closes), np.flatnonzero(closes)) if len(rows)]
    pieces = []
    for group in groups:
        longest = int(counts[group].max())
        width = -(-max(1, longest) // per_chunk) * per_chunk
        with sdpa_kernel(ATTENTION_BACKENDS):  # the open windows' lengths change every update: no cuDNN plans
            outputs = encoder.attend_windows(tokens[to_device(group, device), :width], counts[group], longest)
        pieces.append(model.projector(outputs))
    if len(pieces) == 1:
        return pieces[0]
    audio = pieces[0].new_zeros(len(slots), max(piece.shape[1] for piece in pieces), pieces[0].shape[2])
    for group, piece in zip(groups, pieces, strict=True):
        audio[to_device(group, device), : piece.shape[1]] = piece
    return audio


def shift_open_windows(windows: torch.Tensor, slots: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Move frames ``starts[r] .. lengths[r]`` of slot ``slots[r]`` of ``windows`` (``(slots, mel bins, width)``) to the front (the frames of windows closed
    before them are done with); the rest of each row becomes zeros. One gather, one scatter."""
    if not len(slots):
        return
    width = windows.shape[2]
    offsets = np.arange(width)
    source = np.minimum(starts[:, None] + offsets, width - 1)
    keep = offsets < (lengths - starts)[:, None]
    device = windows.device
    slots_at = to_device(slots, device)
    moved = windows[slots_at[:, None], :, to_device(source, device)]  # (rows, width, bins)
    windows[slots_at] = (moved * to_device(keep, device)[:, :, None]).transpose(1, 2)
