"""Fixtures of the streaming tests: pushing utterances through an encoder's slots in pieces, and checking the outputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

TOLERANCE = 1e-4  # float32 on CPU


def stream_in_pieces(slots, features: torch.Tensor, lengths: list[int], sizes: list[int]):
    """Push each utterance's frames in pieces of ``sizes`` frames (cycled), all slots in lock step, then flush.

    A piece holds ``size`` frames per slot, of which ``real[b]`` are slot
    ``b``'s next frames and the rest noise (shorter utterances run out first).
    Time is on the slots' ``time_dim`` of ``features``. Returns the outputs
    of every call (the flush last) and the sum of their ``last_lengths``.
    """
    time_dim = slots.time_dim
    lengths = np.asarray(lengths)
    generator = torch.Generator().manual_seed(3)
    sent = np.zeros(lengths.size, np.int64)
    outputs = []
    valid = np.zeros(lengths.size, np.int64)
    step = 0
    while (sent < lengths).any():
        size = sizes[step % len(sizes)]
        step += 1
        real = np.clip(lengths - sent, 0, size)
        shape = list(features.shape)
        shape[time_dim] = size
        piece = torch.randn(shape, generator=generator) * 3
        for row, (start, count) in enumerate(zip(sent.tolist(), real.tolist())):
            piece[row].narrow(time_dim - 1, 0, count).copy_(features[row].narrow(time_dim - 1, start, count))
        outputs.append(slots.push(piece, real))
        valid += slots.last_lengths
        sent += real
    outputs.append(slots.flush())
    return outputs, valid + slots.last_lengths


def assert_streamed_equals(pieces, valid, reference, reference_lengths, push_unit: int, max_valid_diff) -> None:
    """Pushes emit whole units (chunks, windows); joined, the outputs equal the reference on the valid tokens."""
    assert all(piece.shape[1] % push_unit == 0 for piece in pieces[:-1])
    assert valid.tolist() == reference_lengths.tolist()  # last_lengths add up to the offline lengths
    outputs = torch.cat(pieces, dim=1)
    assert outputs.shape == reference.shape
    assert torch.isfinite(outputs).all()
    assert max_valid_diff(outputs, reference, reference_lengths.tolist()) <= TOLERANCE


@pytest.fixture(scope="session", name="stream_in_pieces")
def stream_in_pieces_fixture() -> Callable:
    return stream_in_pieces


@pytest.fixture(scope="session", name="assert_streamed_equals")
def assert_streamed_equals_fixture(max_valid_diff) -> Callable:
    return lambda *args, **kwargs: assert_streamed_equals(*args, max_valid_diff=max_valid_diff, **kwargs)
