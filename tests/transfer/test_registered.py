"""audiomask.transfer.registered on the CPU: argument checks, and the staged fallback of copy_pinned.

Page-locking in place and the copies straight from it: test_transfer_gpu.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from audiomask.transfer import PinnedRegion, copy_pinned


@pytest.mark.parametrize(
    ("memory", "described"),
    [
        (np.zeros(4, np.float32), "ndarray"),
        (torch.zeros(4, 4).t(), "a cpu tensor, contiguous=False"),
    ],
    ids=["numpy", "transposed"],
)
def test_a_region_takes_only_a_contiguous_cpu_tensor(memory, described) -> None:
    with pytest.raises(ValueError, match=f"memory must be a contiguous CPU tensor, got {described}"):
        PinnedRegion(memory)


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA only")
def test_without_cuda_a_region_registers_nothing_and_says_nothing() -> None:
    memory = torch.arange(8.0).share_memory_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with PinnedRegion(memory) as region:
            assert region.pinned is False and region.nbytes == 32
    assert torch.equal(memory, torch.arange(8.0))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_copy_pinned_of_pageable_memory_is_a_staged_copy_that_frees_the_source_at_once(dtype) -> None:
    source = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    result, done = copy_pinned(source, "cpu", dtype=dtype)
    assert done is None
    assert torch.equal(result, source.to(dtype or source.dtype))
    source.zero_()  # the copy owns its memory
    assert result.abs().sum() > 0


def test_copy_pinned_names_a_bad_dtype() -> None:
    with pytest.raises(ValueError, match="dtype"):
        copy_pinned(torch.zeros(2), "cpu", dtype="no such dtype")
