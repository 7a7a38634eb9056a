"""slot_attention against attention written out row by row: on the CPU through Triton's interpreter, on a GPU compiled."""

from __future__ import annotations

import pytest
import torch

from audiomask.llm.attention import KEY_BLOCK, reads_in_place, slot_attention

# (heads, kv_heads, head_dim, queries per row): decode steps and prefills, one and several query blocks.
CASES = [(4, 2, 8, 1), (4, 2, 8, 3), (2, 2, 16, 1), (4, 1, 8, 40), (16, 8, 128, 1), (16, 8, 128, 37)]


def reference(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: list, first: list, count: list
) -> torch.Tensor:
    """Each real query's softmax over its slot's keys up to its position, in float64 ``(B, n, heads, head_dim)``."""
    heads, head_dim = queries.shape[2:]
    group = heads // keys.shape[1]
    out = torch.zeros(queries.shape, dtype=torch.float64)
    for row, (slot, start, real) in enumerate(zip(slots, first, count)):
        for query in range(real):
            seen = start + query + 1
            k = keys[slot, :, :seen].double().repeat_interleave(group, 0)  # (heads, seen, head_dim)
            v = values[slot, :, :seen].double().repeat_interleave(group, 0)
            scores = torch.einsum("hd,hkd->hk", queries[row, query].double(), k) * head_dim**-0.5
            out[row, query] = torch.einsum("hk,hkd->hd", scores.softmax(-1), v)
    return out


def check(device: str, dtype: torch.dtype, tolerance: float) -> None:
    """Every case of :data:`CASES` on ``device``: rows of different lengths in any slot order, at any position."""
    generator = torch.Generator().manual_seed(0)
    capacity = 2 * KEY_BLOCK + 11  # rows whose keys span one, two and three key blocks
    for heads, kv_heads, head_dim, n in CASES:
        keys, values = (torch.randn(5, kv_heads, capacity, head_dim, generator=generator) for _ in range(2))
        queries = torch.randn(4, n, heads, head_dim, generator=generator)
        slots, count = [3, 0, 4, 1], [n, max(1, n - 2), 1, n]
        first = [0, 7, capacity - 1, capacity - n]
        want = reference(queries, keys, values, slots, first, count)
        starts = [sum(count[:row]) for row in range(len(count))]
        packed = torch.cat([queries[row, :real] for row, real in enumerate(count)])  # row after row
        indices = [torch.tensor(values_, device=device) for values_ in (slots, first, count, starts)]
        got = slot_attention(*(t.to(device, dtype) for t in (packed, keys, values)), *indices, n)
        assert got.dtype == dtype and got.shape == packed.shape
        want = torch.cat([want[row, :real] for row, real in enumerate(count)])
        error = (got.double().cpu() - want).abs().max().item()
        assert error < tolerance, (heads, kv_heads, head_dim, n, error)


def test_slot_attention_in_tritons_interpreter_equals_the_reference(in_triton_interpreter) -> None:
    in_triton_interpreter("import torch; from tests.llm.test_attention import check; check('cpu', torch.float32, 1e-5)")


def test_reads_in_place_only_on_cuda() -> None:
    assert not reads_in_place(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_slot_attention_on_cuda_equals_the_reference(dtype: torch.dtype, tolerance: float) -> None:
    assert reads_in_place(torch.device("cuda"))
    check("cuda", dtype, tolerance)
