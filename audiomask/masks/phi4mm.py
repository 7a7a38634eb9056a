"""Phi-4-multimodal (Phi-4MM) audio encoder masks, in numpy.

Mirrors ``transformers.models.phi4_multimodal.modeling_phi4_multimodal``
(``adaptive_enc_mask``, ``Phi4MultimodalAudioModel._streaming_mask`` in eval
mode, the hidden-state mask of ``forward_embeddings``) and vLLM's
``phi4mm_audio`` (``_chunk_size_selection``, ``compute_lens_change``).
Polarity: ``True`` = the query row MAY attend to the key column. Shapes are
``(B, T_q, T_k)``; all lengths count encoder tokens (after subsampling) unless
they say feature frames.

Upstream adds this boolean mask to a float relative-position bias, so a
"masked" key there is only 1 logit down; converting to a hard mask is the
encoder's business, not this module's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from audiomask.checks import check_int, check_lengths
from audiomask.constants import FRAME_MS
from audiomask.masks.band import chunk_band, regular_band, result_array

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_LEFT_CHUNK",
    "TIME_REDUCTION",
    "adaptive_enc_mask",
    "hs_mask",
    "select_chunk_size",
    "streaming_mask",
    "subsampled_lengths",
]

FEATURE_HOP_MS = FRAME_MS  # one 80-mel feature frame per 10 ms (hop 160 at 16 kHz)
SUBSAMPLING_CONVS = 3  # NeMo dw_striding subsampling: three stride-2 convolutions
TIME_REDUCTION = 2**SUBSAMPLING_CONVS  # 8 feature frames per encoder token
TOKEN_MS = FEATURE_HOP_MS * TIME_REDUCTION  # 80 ms of audio per encoder token
# Phi4MultimodalAudioConfig defaults (the released checkpoint): chunk_size -1 =
# full attention; left_chunk 18 chunks of context when a chunk size is set.
DEFAULT_CHUNK_SIZE = -1  # encoder tokens per chunk; <= 0 = full attention
DEFAULT_LEFT_CHUNK = 18  # chunks


def adaptive_enc_mask(
    x_len: int,
    chunk_start_idx: object,
    left_window: int = 0,
    right_window: int = 0,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Chunked streaming mask with arbitrary chunk starts, upstream ``adaptive_enc_mask``.

    With ``cs = chunk_start_idx``, ``starts = [0] + cs`` and
    ``ends = cs + [x_len]`` delimit ``n + 1`` chunks (``n = len(cs)``); query
    row ``i`` lies in the chunk ``k`` with ``starts[k] <= i < ends[k]`` and may
    attend to key columns
    ``starts[max(k - left_window, 0)] <= j < ends[min(k + right_window, n)]``.

    Edge cases, as upstream: ``cs`` starting with 0 makes an empty first chunk
    (it still counts as a chunk, which never changes the result because
    ``starts[0] == starts[1] == 0``); ``cs`` not starting at 0 makes
    ``[0, cs[0])`` the first chunk; ``cs`` ending with ``x_len`` makes an empty
    last chunk; empty ``cs`` gives all True; ``x_len == 0`` gives ``(0, 0)``.
    Unlike upstream (which then returns garbage or fails), ``cs`` must be
    strictly increasing integers in ``[0, x_len]``.

    Args:
        x_len: sequence length ``T`` in tokens, ``>= 0``.
        chunk_start_idx: ``(n,)`` first token of each chunk, strictly increasing, in ``[0, x_len]``.
        left_window: chunks of left context, ``>= 0``.
        right_window: chunks of right context (look-ahead), ``>= 0``.
        out: optional C-contiguous ``bool`` array of shape ``(T, T)`` to write into.

    Returns:
        ``(T_q, T_k) = (x_len, x_len)`` C-contiguous ``bool``; ``True`` = may attend.

    >>> adaptive_enc_mask(6, [0, 2, 4]).astype(int)
    array([[1, 1, 0, 0, 0, 0],
           [1, 1, 0, 0, 0, 0],
           [0, 0, 1, 1, 0, 0],
           [0, 0, 1, 1, 0, 0],
           [0, 0, 0, 0, 1, 1],
           [0, 0, 0, 0, 1, 1]])
    >>> adaptive_enc_mask(5, [2], left_window=1).astype(int)
    array([[1, 1, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [1, 1, 1, 1, 1],
           [1, 1, 1, 1, 1],
           [1, 1, 1, 1, 1]])
    """
    x_len = check_int("x_len", x_len, minimum=0)
    starts = check_lengths("chunk_start_idx", chunk_start_idx, maximum=x_len, maximum_name="x_len")
    if starts.size > 1:
        steps = np.diff(starts)
        if steps.min() <= 0:
            i = int(np.argmin(steps))
            raise ValueError(
                f"chunk_start_idx must be strictly increasing, got {starts[i]} then {starts[i + 1]} at index {i + 1}"
            )
    left_window = check_int("left_window", left_window, minimum=0)
    right_window = check_int("right_window", right_window, minimum=0)
    bounds = np.concatenate([[0], starts, [x_len]])
    return chunk_band(bounds, left_window, right_window, result_array(out, (x_len, x_len), "x_len"))


def _effective_chunk_size(seq_len: int, chunk_size: int) -> int:
    """``chunk_size <= 0`` (full attention) is one chunk over the whole sequence."""
    return chunk_size if chunk_size > 0 else max(seq_len, 1)


def streaming_mask(
    seq_len: int,
    batch_size: int,
    chunk_size: int,
    left_chunk: int,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Streaming mask of ``Phi4MultimodalAudioModel._streaming_mask`` (eval mode), made dense.

    Equals ``adaptive_enc_mask(L, arange(0, L, chunk_size), left_window=left_chunk)``
    in every batch row: chunks of ``chunk_size`` tokens, each seeing itself and
    ``left_chunk`` chunks back. ``chunk_size <= 0`` means full attention
    (upstream's config default -1). Upstream's training-only random flip of
    the chunk grid is not reproduced; draw training chunk sizes with
    :func:`select_chunk_size`. Unlike upstream's ``expand`` view, every batch
    row is written.

    Args:
        seq_len: ``L``, tokens after subsampling, ``>= 0``.
        batch_size: ``B``, ``>= 0``.
        chunk_size: tokens per chunk; ``<= 0`` = full attention.
        left_chunk: chunks of left context, ``>= 0``.
        out: optional C-contiguous ``bool`` array of shape ``(B, L, L)`` to write into.

    Returns:
        ``(B, T_q, T_k) = (B, L, L)`` C-contiguous ``bool``; ``True`` = may attend.

    >>> streaming_mask(5, 1, 2, 1)[0].astype(int)
    array([[1, 1, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [1, 1, 1, 1, 0],
           [1, 1, 1, 1, 0],
           [0, 0, 1, 1, 1]])
    """
    seq_len = check_int("seq_len", seq_len, minimum=0)
    batch_size = check_int("batch_size", batch_size, minimum=0)
    chunk_size = check_int("chunk_size", chunk_size)
    left_chunk = check_int("left_chunk", left_chunk, minimum=0)
    out = result_array(out, (batch_size, seq_len, seq_len), "batch_size and seq_len")
    return regular_band(seq_len, _effective_chunk_size(seq_len, chunk_size), left_chunk, out)


def _is_list(value: object) -> bool:
    """A list of chunk settings (a sequence or array, not a string)."""
    return isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes))


def select_chunk_size(
    chunk_size: int | Sequence[int],
    left_chunk: int | Sequence[int],
    rng: np.random.Generator | None = None,
) -> tuple[int, int]:
    """Pick the ``(chunk_size, left_chunk)`` pair for one step, vLLM's ``_chunk_size_selection``.

    Integers pass through (inference, or single-chunk-size training). Lists
    (variable chunk size training) must have the same non-zero length; one
    index is drawn uniformly with ``rng`` and both lists are read at it.
    Stricter than upstream: an integer ``chunk_size`` with a list
    ``left_chunk`` is an error (upstream passes the list on and fails later),
    and ``left_chunk`` must be ``>= 0``.

    Args:
        chunk_size: tokens per chunk (``<= 0`` = full attention), or a list of them.
        left_chunk: chunks of left context, or a list as long as ``chunk_size``.
        rng: a ``numpy.random.Generator``; defaults to ``np.random.default_rng()``.

    Returns:
        ``(chunk_size, left_chunk)`` as Python ints.

    >>> select_chunk_size(16, 18)
    (16, 18)
    >>> select_chunk_size([8, 16], [36, 18], rng=np.random.default_rng(0)) in [(8, 36), (16, 18)]
    True
    """
    if not _is_list(chunk_size):
        if _is_list(left_chunk):
            raise ValueError(f"left_chunk must be an integer when chunk_size is, got {left_chunk!r}")
        return check_int("chunk_size", chunk_size), check_int("left_chunk", left_chunk, minimum=0)
    if not _is_list(left_chunk):
        raise ValueError(f"left_chunk must be a list when chunk_size is a list, got {left_chunk!r}")
    if len(chunk_size) != len(left_chunk):
        raise ValueError(
            f"left_chunk must have the length of chunk_size ({len(chunk_size)}), got {len(left_chunk)}: {left_chunk!r}"
        )
    if len(chunk_size) == 0:
        raise ValueError(f"chunk_size must not be an empty list, got {chunk_size!r}")
    sizes = [check_int(f"chunk_size[{i}]", value) for i, value in enumerate(chunk_size)]
    lefts = [check_int(f"left_chunk[{i}]", value, minimum=0) for i, value in enumerate(left_chunk)]
    if rng is None:
        rng = np.random.default_rng()
    elif not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    index = int(rng.integers(len(sizes)))
    return sizes[index], lefts[index]


def subsampled_lengths(feature_lengths: object, time_reduction: int = TIME_REDUCTION) -> np.ndarray:
    """Tokens after the (non-causal) NeMo conv subsampling: ``ceil(T / time_reduction)``.

    Each stride-2 conv (kernel 3, padding 1) maps ``T`` to ``ceil(T / 2)``, and
    nested ceilings compose, so three of them give ``ceil(T / 8)``. Upstream
    computes the same with ``torch.ceil(feature_lens / time_reduction)``.

    Args:
        feature_lengths: ``(B,)`` feature frames per utterance, ``>= 0``.
        time_reduction: feature frames per token, ``>= 1`` (8 for Phi-4MM).

    Returns:
        ``(B,)`` ``int64`` token counts.

    >>> subsampled_lengths([40, 17, 0, 1])
    array([5, 3, 0, 1])
    """
    lengths = check_lengths("feature_lengths", feature_lengths)
    time_reduction = check_int("time_reduction", time_reduction, minimum=1)
    return -(-lengths // time_reduction)


def hs_mask(
    feature_lengths: object,
    max_frames: int,
    chunk_size: int,
    left_chunk: int,
    time_reduction: int = TIME_REDUCTION,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Hidden-state mask of ``forward_embeddings``: key padding AND streaming mask.

    ``out[b] = pad[b, None, :] & streaming[b]`` with
    ``pad[b, j] = j < ceil(feature_lengths[b] / time_reduction)`` and
    ``streaming = streaming_mask(L, B, chunk_size, left_chunk)``,
    ``L = ceil(max_frames / time_reduction)``. Only keys are masked: padded
    query rows still see the valid keys of their chunk band, as upstream.
    (Upstream's forward cuts sequences over 500 tokens into 500-token blocks
    and rebuilds this mask per block; this is the mask before that cut.)

    Args:
        feature_lengths: ``(B,)`` feature frames per utterance, each ``<= max_frames``.
        max_frames: padded feature length ``T`` in frames, ``>= 0``.
        chunk_size: tokens per chunk; ``<= 0`` = full attention.
        left_chunk: chunks of left context, ``>= 0``.
        time_reduction: feature frames per token, ``>= 1``.
        out: optional C-contiguous ``bool`` array of shape ``(B, L, L)`` to write into.

    Returns:
        ``(B, T_q, T_k) = (B, L, L)`` C-contiguous ``bool``; ``True`` = may attend.

    >>> hs_mask([40, 17], 40, chunk_size=2, left_chunk=1)[1].astype(int)
    array([[1, 1, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [1, 1, 1, 0, 0],
           [1, 1, 1, 0, 0],
           [0, 0, 1, 0, 0]])
    """
    max_frames = check_int("max_frames", max_frames, minimum=0)
    lengths = check_lengths("feature_lengths", feature_lengths, maximum=max_frames, maximum_name="max_frames")
    chunk_size = check_int("chunk_size", chunk_size)
    left_chunk = check_int("left_chunk", left_chunk, minimum=0)
    time_reduction = check_int("time_reduction", time_reduction, minimum=1)
    seq_len = -(-max_frames // time_reduction)
    out = result_array(out, (lengths.size, seq_len, seq_len), "feature_lengths and max_frames")
    regular_band(seq_len, _effective_chunk_size(seq_len, chunk_size), left_chunk, out)
    # Clearing the padded key columns of each batch row after the one-copy band
    # writes less than gathering per-row patterns (a loop over the batch, not time).
    for row, key_length in enumerate(subsampled_lengths(lengths, time_reduction).tolist()):
        out[row, :, key_length:] = False
    return out
