"""Qwen3-ASR audio encoder lengths, windows and masks, in numpy.

Mirrors ``transformers.models.qwen3_asr.modeling_qwen3_asr``
(``_get_feat_extract_output_lengths``, ``get_audio_cu_seqlens``, the chunking
of ``Qwen3ASREncoder.forward``) and the packed-chunk layout of the Qwen3-Omni /
Qwen3-ASR reference audio encoders (``chunk_lengths``, ``padded_mask_after_cnn``;
there an empty utterance's "tail chunk" index lands on another utterance's
chunk and overwrites its length; here an empty utterance simply has no chunk).
Polarity: ``True`` = the query row MAY attend to the key column.

The mel spectrogram (10 ms frames) of each utterance is cut into conv chunks
of ``2 * n_window`` frames, the last one holding the remainder. Each chunk
goes through three stride-2 convs on its own, and the valid outputs of all
chunks of all utterances are packed into one token sequence. Attention is
bidirectional inside windows of ``n_window_infer`` frames' worth of tokens,
which restart at every utterance, and absent across windows.

One deliberate difference: upstream hard-codes 13 tokens per full chunk (the
conv length of 100 frames, right only for ``n_window == 50``); here it is the
conv length of ``2 * n_window``, which is what the encoder actually packs.
For ``n_window == 50`` the two agree exactly.
"""

from __future__ import annotations

import numpy as np

from audiomask.checks import INT64_MAX, check_int, check_lengths
from audiomask.masks.band import check_alloc, chunk_band, result_array
from audiomask.masks.chunk import padding_mask

__all__ = [
    "CHUNK_FRAMES",
    "N_WINDOW",
    "N_WINDOW_INFER",
    "TOKENS_PER_CHUNK",
    "WINDOW_TOKENS",
    "chunk_lengths",
    "cu_seqlens",
    "output_lengths",
    "padded_mask_after_cnn",
    "window_mask",
]

CONV_LAYERS = 3  # conv2d kernel 3, stride 2, padding 1, applied per chunk


def _conv_lengths(frames: np.ndarray | int) -> np.ndarray | int:
    """Output length of the three convs for ``frames`` input frames (0 stays 0)."""
    for _ in range(CONV_LAYERS):
        frames = (frames - 1) // 2 + 1  # floor division maps 0 to 0 as well
    return frames


N_WINDOW = 50  # mel frames; half a conv chunk (upstream config default)
CHUNK_FRAMES = 2 * N_WINDOW  # 100 mel frames (1 s) per conv chunk
TOKENS_PER_CHUNK = _conv_lengths(CHUNK_FRAMES)  # 13 tokens out of a full chunk
N_WINDOW_INFER = 800  # mel frames (8 s) per attention window (upstream config default)
WINDOW_TOKENS = TOKENS_PER_CHUNK * (N_WINDOW_INFER // CHUNK_FRAMES)  # 104 tokens per full window


def _check_feature_lens(feature_lens: object, n_window: int) -> tuple[np.ndarray, int]:
    """Validated ``(feature_lens, chunk_frames)``."""
    lengths = check_lengths("feature_lens", feature_lens)
    n_window = check_int("n_window", n_window, minimum=1, maximum=INT64_MAX // 2)  # doubled into int64 below
    return lengths, 2 * n_window


def _split(totals: np.ndarray, piece: int, names: str) -> np.ndarray:
    """Cut each total into pieces of ``piece`` plus a shorter remainder; all pieces, in order.

    ``_split([250, 0, 100], 100) -> [100, 100, 50, 100]``: a zero total gives
    no piece, an exact multiple no remainder. The pieces' array is bounded like
    a mask (``check_alloc``, quoting ``names``).
    """
    counts = -(-totals // piece)
    largest = int(counts.max()) if counts.size else 0
    check_alloc(names, (largest,), np.int64)  # each count bounded first: their sum cannot overflow
    total = int(counts.sum())
    check_alloc(names, (total,), np.int64)
    pieces = np.full(total, piece, dtype=np.int64)
    has_pieces = counts > 0
    last = np.cumsum(counts)[has_pieces] - 1
    pieces[last] = totals[has_pieces] - (counts[has_pieces] - 1) * piece
    return pieces


def chunk_lengths(feature_lens: object, n_window: int = N_WINDOW) -> np.ndarray:
    """Mel frames of every conv chunk, all utterances packed in order.

    Each utterance of ``T`` frames gives ``ceil(T / (2 * n_window))`` chunks:
    full ones of ``2 * n_window`` frames, the last one holding the remainder.
    An empty utterance gives no chunk. (Upstream's padded layout also has
    all-zero padding chunks; these are the non-zero ones, in the same order.)

    Args:
        feature_lens: ``(B,)`` mel frames per utterance, ``>= 0``.
        n_window: half the chunk length, in mel frames, ``>= 1``.

    Returns:
        ``(num_chunks,)`` ``int64`` frames per chunk.

    >>> chunk_lengths([250, 0, 100])
    array([100, 100,  50, 100])
    """
    lengths, chunk_frames = _check_feature_lens(feature_lens, n_window)
    return _split(lengths, chunk_frames, "feature_lens and n_window")


def _output_lengths(lengths: np.ndarray, chunk_frames: int) -> np.ndarray:
    full_chunks, remainder = np.divmod(lengths, chunk_frames)
    return full_chunks * _conv_lengths(chunk_frames) + _conv_lengths(remainder)


def output_lengths(feature_lens: object, n_window: int = N_WINDOW) -> np.ndarray:
    """Encoder tokens per utterance: upstream ``_get_feat_extract_output_lengths``.

    13 tokens per full chunk of 100 frames plus the conv length of the
    remainder, ``len <- (len - 1) // 2 + 1`` three times (50 -> 7, 130 -> 17,
    250 -> 33, 1000 -> 130).

    Args:
        feature_lens: ``(B,)`` mel frames per utterance, ``>= 0``.
        n_window: half the chunk length, in mel frames, ``>= 1``.

    Returns:
        ``(B,)`` ``int64`` tokens.

    >>> output_lengths([50, 130, 250, 1000, 100, 0])
    array([  7,  17,  33, 130,  13,   0])
    """
    lengths, chunk_frames = _check_feature_lens(feature_lens, n_window)
    return _output_lengths(lengths, chunk_frames)


def padded_mask_after_cnn(
    feature_lens: object,
    n_window: int = N_WINDOW,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Which conv outputs of each chunk are valid: ``mask[c, t] = t < conv_len(chunk_lengths[c])``.

    Selecting ``conv_out[mask]`` (chunks x tokens, row-major) packs the tokens
    of all utterances in order. Width is the longest chunk's token count (13
    when any chunk is full; 0 with no chunk at all).

    Args:
        feature_lens: ``(B,)`` mel frames per utterance, ``>= 0``.
        n_window: half the chunk length, in mel frames, ``>= 1``.
        out: optional C-contiguous ``bool`` array of shape ``(num_chunks, max_len_after_cnn)``.

    Returns:
        ``(num_chunks, max_len_after_cnn)`` C-contiguous ``bool``; ``True`` = valid token.

    >>> padded_mask_after_cnn([130], n_window=50).astype(int)
    array([[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
           [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    """
    lengths, chunk_frames = _check_feature_lens(feature_lens, n_window)
    tokens = _conv_lengths(_split(lengths, chunk_frames, "feature_lens and n_window"))
    width = int(tokens.max()) if tokens.size else 0
    out = result_array(out, (tokens.size, width), "feature_lens and n_window")  # bounded under this call's names
    return padding_mask(tokens, width, out=out)


def _window_lengths(feature_lens: object, n_window: int, n_window_infer: int) -> np.ndarray:
    """Tokens of every attention window, all utterances packed in order."""
    lengths, chunk_frames = _check_feature_lens(feature_lens, n_window)
    n_window_infer = check_int("n_window_infer", n_window_infer, minimum=1)
    if n_window_infer % chunk_frames:
        # Upstream floors n_window_infer / chunk_frames; a window that cut a
        # chunk would not match the encoder's chunking, so refuse it.
        raise ValueError(
            f"n_window_infer must be a positive multiple of 2 * n_window ({chunk_frames}), got {n_window_infer}"
        )
    window_tokens = _conv_lengths(chunk_frames) * (n_window_infer // chunk_frames)
    tokens = _output_lengths(lengths, chunk_frames)
    total = int(tokens.sum())
    if total > np.iinfo(np.int32).max:
        raise ValueError(f"feature_lens give {total} tokens, more than int32 cu_seqlens can hold")
    return _split(tokens, window_tokens, "feature_lens, n_window and n_window_infer")


def cu_seqlens(
    feature_lens: object,
    n_window: int = N_WINDOW,
    n_window_infer: int = N_WINDOW_INFER,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Cumulative token boundaries of the attention windows, upstream ``get_audio_cu_seqlens``.

    Each utterance's tokens are cut into windows of
    ``13 * (n_window_infer // (2 * n_window))`` tokens (104) plus a remainder;
    windows restart at every utterance and empty utterances add none. Equal to
    upstream wherever upstream is defined (it divides by zero when every
    utterance is empty; here that gives ``[0]``).

    Args:
        feature_lens: ``(B,)`` mel frames per utterance, ``>= 0``.
        n_window: half the chunk length, in mel frames, ``>= 1``.
        n_window_infer: mel frames per attention window, a multiple of ``2 * n_window``.
        out: optional C-contiguous ``int32`` array of shape ``(num_windows + 1,)``.

    Returns:
        ``(num_windows + 1,)`` ``int32``, starting at 0, ending at the total token count.

    >>> cu_seqlens([250, 1000])
    array([  0,  33, 137, 163], dtype=int32)
    >>> cu_seqlens([3000])
    array([  0, 104, 208, 312, 390], dtype=int32)
    """
    windows = _window_lengths(feature_lens, n_window, n_window_infer)
    out = result_array(out, (windows.size + 1,), "feature_lens", np.int32)
    out[0] = 0
    np.cumsum(windows, out=out[1:])
    return out


def window_mask(
    feature_lens: object,
    n_window: int = N_WINDOW,
    n_window_infer: int = N_WINDOW_INFER,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Dense block-diagonal attention mask over the packed tokens, for paths without varlen attention.

    ``mask[i, j]`` is True when tokens ``i`` and ``j`` lie in the same window of
    :func:`cu_seqlens`: bidirectional inside a window, nothing across windows
    or utterances.

    Args:
        feature_lens: ``(B,)`` mel frames per utterance, ``>= 0``.
        n_window: half the chunk length, in mel frames, ``>= 1``.
        n_window_infer: mel frames per attention window, a multiple of ``2 * n_window``.
        out: optional C-contiguous ``bool`` array of shape ``(N, N)``, ``N`` = total tokens.

    Returns:
        ``(T_q, T_k) = (N, N)`` C-contiguous ``bool``; ``True`` = may attend.

    Tiny windows for display: 16-frame chunks of 2 tokens, windows of 2 chunks (4 tokens);
    40 frames -> 5 tokens -> windows [4, 1]; 10 frames -> 2 tokens -> [2].

    >>> window_mask([40, 10], n_window=8, n_window_infer=32).astype(int)
    array([[1, 1, 1, 1, 0, 0, 0],
           [1, 1, 1, 1, 0, 0, 0],
           [1, 1, 1, 1, 0, 0, 0],
           [1, 1, 1, 1, 0, 0, 0],
           [0, 0, 0, 0, 1, 0, 0],
           [0, 0, 0, 0, 0, 1, 1],
           [0, 0, 0, 0, 0, 1, 1]])
    """
    windows = _window_lengths(feature_lens, n_window, n_window_infer)
    total = int(windows.sum())
    out = result_array(out, (total, total), "feature_lens")
    bounds = np.zeros(windows.size + 1, np.int64)
    np.cumsum(windows, out=bounds[1:])
    return chunk_band(bounds, 0, 0, out)
