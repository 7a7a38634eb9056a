"""The fused elementwise kernels against the decoder layer's PyTorch ops: on the CPU through Triton's interpreter
(float32), on a GPU compiled (float32 and bfloat16, against the same ops on the CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from audiomask.llm import lm
from audiomask.llm.pointwise import fuses, norm_rotate, rms_norm
from audiomask.models.fused import silu_gate
from tests.conftest import assert_within_ulps

NORM_SIZES = (8, 1024, 3072)  # a tiny model's hidden size, the 0.6B's, Phi-4-mini's (a block of 4,096)
# (heads, head_dim, rotary dims, normed): Qwen3's heads (query and key), a tiny model's, Phi-4-mini's partial rotary
HEAD_CASES = [(16, 128, 128, True), (8, 128, 128, True), (4, 8, 8, True), (3, 8, 6, False), (24, 128, 96, False)]
GATE_SIZES = (16, 3072)


def norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The layer's RMSNorm as PyTorch ops (on the CPU, where they run)."""
    module = lm._RMSNorm(x.shape[-1], eps)
    module.weight.data = weight.cpu()
    return module(x.cpu())


def check(device: str, dtype: torch.dtype, ulps: float) -> None:
    """Every kernel on ``device`` within ``ulps`` units of ``dtype``'s last place of the CPU's PyTorch ops."""
    generator = torch.Generator().manual_seed(0)

    def close(got: torch.Tensor, want: torch.Tensor, what: object) -> None:
        assert_within_ulps(got, want, ulps, what)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    for size in NORM_SIZES:
        x, weight = randn(5, size) * 3, randn(size)
        close(rms_norm(x.to(device), weight.to(device), 1e-6), norm_reference(x, weight, 1e-6), ("norm", size))
    for heads, head_dim, rotary, normed in HEAD_CASES:
        # Heads of a fused projection's output: rows strided past the heads, as q and k come from qkv_proj.
        x = randn(6, heads * head_dim + 24)[:, : heads * head_dim].view(6, heads, head_dim)
        weight = randn(head_dim) if normed else None
        angles = torch.rand(6, rotary // 2, generator=generator) * 40
        cos, sin = (torch.cat((angles, angles), -1).cos().to(dtype), torch.cat((angles, angles), -1).sin().to(dtype))
        want = lm._rotate(norm_reference(x, weight, 1e-6) if normed else x, cos, sin)
        got = norm_rotate(
            x.to(device), None if weight is None else weight.to(device), 1e-6, cos.to(device), sin.to(device)
        )
        close(got, want, ("heads", heads, head_dim, rotary, normed))
    for size in GATE_SIZES:
        gate_up = randn(7, 2 * size) * 4
        gate, up = gate_up.chunk(2, dim=-1)
        close(silu_gate(gate_up.to(device), gate_first=True), F.silu(gate) * up, ("gate", size))


def test_kernels_in_tritons_interpreter_equal_the_layers_ops(in_triton_interpreter) -> None:
    in_triton_interpreter("import torch; from tests.llm.test_pointwise import check; check('cpu', torch.float32, 8)")


def test_fuses_only_on_cuda() -> None:
    assert not fuses(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "ulps"), [(torch.float32, 8), (torch.bfloat16, 1)])
def test_kernels_on_cuda_equal_the_layers_ops(dtype: torch.dtype, ulps: float) -> None:
    assert fuses(torch.device("cuda"))
    check("cuda", dtype, ulps)
