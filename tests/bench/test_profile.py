"""audiomask.bench.profile: an encoder step's kernels by family, the report's sums, and the script's run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from audiomask.bench.models import build_model
from audiomask.bench.profile import family, profile_step

ROOT = Path(__file__).resolve().parents[2]
# Kernel names as the H200's profiles of the two encoder steps print them, and their families.
GPU_KERNELS = {
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1_kernel0_0": "attention",
    "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false>>": "attention",
    "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true>": "layout",
    "void cudnn::detail::implicit_convolve_sgemm<__nv_bfloat16, float, 1024, 5, 5, 3, 3, 3, 1>": "conv",
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64": "conv",
    "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<3, c10::BFloat16, int>": "conv",
    "_patch_conv": "conv",  # audiomask.models.fused's first-conv kernel
    "_bias_activation": "elementwise",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1": "gemm",
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNT": "gemm",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>": "norm",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<c10::BFloat16>>": "elementwise",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)>": "elementwise",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2>>": "copy",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...>>": "copy",
    "Memset (Device)": "copy",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>": "reduction",
}


# A front end's operators as torch.profiler names them on a CPU, and their families.
FRONTEND_OPERATORS = {
    "aten::_fft_r2c": "fft",
    "aten::mm": "gemm",
    "aten::index_select": "copy",
    "aten::amax": "reduction",
    "aten::log10_": "elementwise",
    "aten::pow_": "elementwise",
    "aten::maximum": "elementwise",
}


@pytest.mark.parametrize(("kernel", "expected"), {**GPU_KERNELS, **FRONTEND_OPERATORS}.items())
def test_kernel_families(kernel: str, expected: str) -> None:
    assert family(kernel) == expected


def _check(report: dict, streams: int) -> None:
    families = report["families"]
    assert report["streams"] == streams and report["ms_per_step"] > 0
    assert sum(entry["share"] for entry in families.values()) == pytest.approx(1.0)
    assert sum(entry["ms_per_step"] for entry in families.values()) == pytest.approx(report["ms_per_step"])
    assert sum(entry["kernels_per_step"] for entry in families.values()) == pytest.approx(report["kernels_per_step"])
    assert {"conv", "gemm", "attention"} <= set(families)  # what an encoder step is made of
    times = [kernel["ms_per_step"] for kernel in report["top_kernels"]]
    assert times == sorted(times, reverse=True) and all(kernel["family"] for kernel in report["top_kernels"])


@pytest.mark.parametrize("name", ["qwen3_asr_0.6b", "phi4mm_full"])
def test_profile_step_on_the_cpu(name: str) -> None:
    model = build_model(name, torch.device("cpu"), quick=True)
    chunking = {"chunk_size": 2, "left_chunk": 1} if model.is_phi4mm else {}
    _check(profile_step(model, 3, steps=8, **chunking), 3)


def _run_script(*arguments: str) -> None:
    """Run ``python arguments...`` in the checkout; it must succeed."""
    result = subprocess.run(
        [sys.executable, *arguments], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_script_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    _run_script(
        "scripts/bench_profile.py",
        "--model",
        "qwen3_asr_0.6b",
        "--streams",
        "2",
        "3",
        "--quick",
        "--device",
        "cpu",
        "--out",
        str(out),
    )
    report = json.loads(out.read_text())
    assert report["command"].endswith(f"--out {out}") and report["torch_version"] == torch.__version__
    assert [row["streams"] for row in report["rows"]] == [2, 3]
    for row in report["rows"]:
        _check(row, row["streams"])


@pytest.mark.gpu
def test_profile_step_on_cuda_counts_kernels() -> None:
    model = build_model("phi4mm_full", torch.device("cuda"), quick=True)
    report = profile_step(model, 4, steps=4, chunk_size=2, left_chunk=1)
    _check(report, 4)
    assert report["measures"] == "kernels' device time"


def test_front_end_stage_report_holds_its_operators(tmp_path: Path) -> None:
    """scripts/bench_features.py --slots-only: each family's steady row splits its cycle's CPU time by operator
    family, an FFT and mel products among them, and the rest of the cycle beside them."""
    out = tmp_path / "slots.json"
    _run_script(
        "scripts/bench_features.py",
        "--slots-only",
        "--slots",
        "8",
        "--slot-cycles",
        "2",
        "--warmup",
        "0",
        "--out",
        str(out),
    )
    rows = json.loads(out.read_text())["slot_stage"]["rows"]
    steady = [row for row in rows if row["case"] == "steady"]
    assert {row["family"] for row in steady} == {"phi4mm", "qwen3_asr"}
    for row in steady:
        operators = row["operators"]
        assert {"fft", "gemm", "copy", "elementwise"} <= set(operators["families"])
        assert sum(entry["share"] for entry in operators["families"].values()) == pytest.approx(1.0)
        assert operators["ms_per_step"] > 0 and operators["unattributed_ms_per_cycle"] >= 0
    assert all("operators" not in row for row in rows if row["case"] == "churn")
