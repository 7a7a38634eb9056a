"""A throughput row's limits: the FLOPs counted from the model equal a hand count; peaks, limits and row fields."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from audiomask.bench.limits import (
    COMPUTE_SHARE,
    DENSE_BF16_PEAK_TFLOPS,
    EncoderLimits,
    achieved_tflops,
    compute_limit,
    count_step_flops,
    memory_limit,
    peak_tflops,
)
from audiomask.bench.models import TINY_PHI4MM, TINY_QWEN3_ASR, TINY_SHIPPED, build_model
from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder, Qwen3ASRConfig, Qwen3ASREncoder

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_latency.py"
THROUGHPUT_TIMEOUT_S = 120  # the quick throughput section alone takes ~10 s on a 2-core machine
FRAME_MS = 10  # a feature frame
KERNEL_TAPS = 9  # the 3 x 3 kernels of both subsamplings
TOP_TAP_ROW = 3  # a 3 x 3 kernel's first row: what a Phi-4MM stage's cached input step contributes to output step 0
LINEAR = 2  # FLOP per multiply-add


def ceil_half(size: int) -> int:
    """Outputs of a stride-2, kernel-3, padding-1 convolution over ``size`` inputs."""
    return (size + 1) // 2


def phi4mm_step_flops(config: Phi4MMAudioConfig, chunk_size: int, left_chunk: int) -> int:
    """FLOP of one Phi-4MM chunk step of one stream with a full left context, by hand from the config.

    Subsampling, per stride-2 stage: a 3 x 3 conv of one input channel per group (the first stage has one
    input channel; the later ones are depthwise) to C channels; after the first stage the cached input step's
    top kernel row into output step 0 (the first stage's conv reads it as its top row) and a pointwise C x C
    conv; then a linear layer to D per token.
    Each block, per token: two feed-forwards (D -> 2 I, I -> D), the q/k/v projection (D -> 3 D), the two
    attention products against the (left_chunk + 1) * chunk_size cached keys (2 * keys * D each), the output
    projection, and the conv module's GLU (D -> 2 E), pointwise (D * m -> D) and output (D -> E) convs. Not
    counted by FlopCounterMode, so not here: the conv module's depthwise conv (multiply-adds of shifted views,
    2 * kernel_size FLOP per channel and token) and elementwise work (norms, activations, softmax, residuals).
    """
    frames, bins, channels = chunk_size * config.time_reduction, config.input_size, config.nemo_conv_channels
    flops = 0
    for stage in range(config.subsampling_stages):
        frames, bins = frames // 2, ceil_half(bins)
        flops += LINEAR * KERNEL_TAPS * channels * frames * bins
        if stage:
            flops += LINEAR * TOP_TAP_ROW * channels * bins
            flops += LINEAR * channels * channels * frames * bins
    hidden, inner = config.hidden_size, config.intermediate_size
    flops += chunk_size * LINEAR * channels * bins * hidden
    keys = (left_chunk + 1) * chunk_size
    feed_forward = LINEAR * (hidden * 2 * inner + inner * hidden)
    attention = LINEAR * (hidden * 3 * hidden + hidden * hidden) + 2 * LINEAR * keys * hidden
    conv_module = LINEAR * (
        hidden * 2 * config.ext_pw_out_channel
        + hidden * config.depthwise_multiplier * config.depthwise_separable_out_channel
        + hidden * config.ext_pw_out_channel
    )
    return flops + config.num_blocks * chunk_size * (2 * feed_forward + attention + conv_module)


def qwen3_asr_window_flops(config: Qwen3ASRConfig) -> int:
    """FLOP of one Qwen3-ASR window of one stream (its conv chunks and its attention once), by hand.

    Per conv chunk of 2 * n_window frames and num_mel_bins bins: three stride-2 3 x 3 convs (1 -> C, C -> C,
    C -> C), then a linear layer from C * bins to D per token. Per window of W tokens and layer: q, k, v and
    output projections (D -> D each), the two attention products (2 * W * W * D each) and the MLP (D -> F -> D).
    """
    frames, bins, channels, inputs = config.chunk_frames, config.num_mel_bins, config.downsample_hidden_size, 1
    conv = 0
    for _ in range(3):
        frames, bins = ceil_half(frames), ceil_half(bins)
        conv += LINEAR * KERNEL_TAPS * inputs * channels * frames * bins
        inputs = channels
    dim, window = config.d_model, config.window_tokens
    conv += config.chunk_tokens * LINEAR * channels * bins * dim
    layer = window * LINEAR * (4 * dim * dim + 2 * dim * config.encoder_ffn_dim) + 2 * LINEAR * window * window * dim
    return config.chunks_per_window * conv + config.encoder_layers * layer


@pytest.mark.parametrize(
    ("config", "chunk_size", "left_chunk"),
    [
        (TINY_PHI4MM, 2, 1),
        (TINY_PHI4MM, 3, 0),
        (TINY_SHIPPED, 8, 8),  # 2 subsampling stages, kernel 9
        (dataclasses.replace(TINY_PHI4MM, input_size=81, depthwise_multiplier=2, num_blocks=1), 1, 3),
    ],
)
def test_phi4mm_flops_equal_the_hand_count(config: Phi4MMAudioConfig, chunk_size: int, left_chunk: int) -> None:
    torch.manual_seed(0)
    chunk_ms = chunk_size * config.time_reduction * FRAME_MS
    flops, audio_ms = count_step_flops(Phi4MMEncoder(config).eval(), chunk_ms, left_chunk)
    assert (flops, audio_ms) == (phi4mm_step_flops(config, chunk_size, left_chunk), chunk_ms)


@pytest.mark.parametrize(
    "config",
    [
        TINY_QWEN3_ASR,
        Qwen3ASRConfig(
            encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=8, d_model=8, downsample_hidden_size=2
        ),
    ],
)
def test_qwen3_asr_flops_equal_the_hand_count(config: Qwen3ASRConfig) -> None:
    torch.manual_seed(0)
    window_ms = config.chunks_per_window * config.chunk_frames * FRAME_MS
    assert count_step_flops(Qwen3ASREncoder(config).eval()) == (qwen3_asr_window_flops(config), window_ms)


def test_the_peak_is_looked_up_by_the_device_name() -> None:
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0  # the SXM part's name
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA A100 80GB PCIe") == peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops("NVIDIA L40S") == 362.0
    assert peak_tflops("NVIDIA GeForce RTX 3090") is None and peak_tflops(None) is None
    keys = [key for key, _ in DENSE_BF16_PEAK_TFLOPS]
    for index, key in enumerate(keys):  # no key is shadowed by a shorter one before it
        assert not any(earlier in key for earlier in keys[:index]), key


def test_the_limits_are_the_shares_of_peak_and_memory() -> None:
    # Full-size Phi-4MM at ~12.7 GFLOP per audio second: ~31,000 streams at 40 % of an H200's 989 TFLOPS.
    assert compute_limit(12.7e9, 989.0) == int(COMPUTE_SHARE * 989e12 / 12.7e9) == 31_149
    assert compute_limit(1e9, None) is None
    assert compute_limit(1e9, 100.0, share=1.0) == 100_000
    assert memory_limit(1000, 30, fixed_bytes=100) == 30  # (1000 - 100) // 30
    assert memory_limit(100, 30, fixed_bytes=200) == 0
    assert memory_limit(None, 30) is None
    # 10,000 streams of 1.28 s chunks at 12.7 GFLOP per audio second in 1.28 s of device time: 127 TFLOPS.
    assert achieved_tflops(10_000, 12.7e9, 1280, 1280) == pytest.approx(127.0)
    assert achieved_tflops(10_000, 12.7e9, 1280, 640) == pytest.approx(254.0)


def test_row_fields_judge_the_reported_probe_against_the_nearer_limit() -> None:
    limits = EncoderLimits(
        flop_per_audio_s=10e9,
        state_bytes_per_stream=8 * 2**20,
        shared_bytes=2**20,
        weight_bytes=2**30,
        peak_tflops=1000.0,
    )
    row = {
        "max_streams": 10_000,
        "chunk_ms": 1000,
        "device_bytes": 141 * 2**30,
        "lanes": 8,
        "cycle_costs": {"streams": 12_000, "gpu_ms_per_cycle": 500.0},
    }
    fields = limits.row_fields(row)
    assert fields["achieved_tflops"] == pytest.approx(12_000 * 10e9 / 0.5 / 1e12)  # 240
    assert fields["fraction_of_peak"] == pytest.approx(0.24)
    assert fields["compute_limit_streams"] == 40_000
    assert fields["memory_limit_streams"] == (141 * 2**30 - 2**30 - 8 * 2**20) // (8 * 2**20) == 17_919
    assert fields["nearer_limit"] == "memory"
    assert fields["fraction_of_nearer_limit"] == pytest.approx(10_000 / 17_919)
    on_the_cpu = dataclasses.replace(limits, peak_tflops=None).row_fields({**row, "device_bytes": None})
    assert (
        on_the_cpu["fraction_of_peak"] is on_the_cpu["nearer_limit"] is on_the_cpu["fraction_of_nearer_limit"] is None
    )
    assert on_the_cpu["achieved_tflops"] == pytest.approx(240.0)  # what the CPU computed
    assert limits.row_fields({**row, "cycle_costs": None})["achieved_tflops"] is None


def test_encoder_limits_of_a_model_count_its_step_and_its_state() -> None:
    model = build_model("phi4mm_full", torch.device("cpu"), quick=True)  # TINY_PHI4MM, float32
    limits = EncoderLimits.of(model, 160, 1)
    assert limits.flop_per_audio_s == phi4mm_step_flops(TINY_PHI4MM, 2, 1) * 1000 / 160  # FLOP per 160 ms
    # The key/value ring of the left chunk's 2 tokens and the conv cache of every block, the subsampling's
    # cached input steps (1 x 80, 8 x 40, 8 x 20), float32.
    config = TINY_PHI4MM
    blocks = config.num_blocks * (2 * 2 * config.hidden_size + (config.kernel_size - 1) * config.hidden_size)
    assert limits.state_bytes_per_stream == 4 * (blocks + 80 + 8 * 40 + 8 * 20)
    assert limits.weight_bytes == 4 * sum(
        t.numel() for m in (model.asr.encoder, model.asr.head) for t in (*m.parameters(), *m.buffers())
    )
    assert limits.peak_tflops is None


def test_quick_throughput_rows_report_the_limits(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--sections", "throughput", "--no-plots", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=THROUGHPUT_TIMEOUT_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    rows = json.loads(out.read_text())["throughput"]
    assert {row["path"] for row in rows} == {"driver", "encoder_step"}
    for row in rows:
        assert row["flop_per_audio_s"] > 0 and row["state_bytes_per_stream"] > 0
        assert row["achieved_tflops"] > 0  # on the CPU: what the CPU computed
        for field in ("peak_tflops", "fraction_of_peak", "compute_limit_streams", "memory_limit_streams"):
            assert row[field] is None, field  # no GPU: no peak, no device memory
        assert row["nearer_limit"] is None and row["fraction_of_nearer_limit"] is None
    by_model = {}
    for row in rows:  # counted once per model: both paths of a model carry the same figures
        by_model.setdefault(row["model"], set()).add((row["flop_per_audio_s"], row["state_bytes_per_stream"]))
    assert all(len(figures) == 1 for figures in by_model.values())
    table = completed.stdout.split("GFLOP/audio s", 1)[1]  # the limits table, after its heading
    assert "memory limit" in table.splitlines()[0]
    line = next(line for line in table.splitlines() if line.startswith("qwen3_asr_0.6b  encoder_step"))
    assert line.split()[-1] == "n/a"  # of the nearer limit: none on the CPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_count_on_cuda_equals_the_hand_count(dtype: torch.dtype) -> None:
    """CUDA's fused attention kernels are counted as the CPU's: the same figures on either device."""
    torch.manual_seed(0)
    phi4mm = Phi4MMEncoder(TINY_PHI4MM).eval().to("cuda", dtype)
    qwen3_asr = Qwen3ASREncoder(TINY_QWEN3_ASR).eval().to("cuda", dtype)
    assert count_step_flops(phi4mm, 160, 1) == (phi4mm_step_flops(TINY_PHI4MM, 2, 1), 160)
    window_ms = TINY_QWEN3_ASR.chunks_per_window * TINY_QWEN3_ASR.chunk_frames * FRAME_MS
    assert count_step_flops(qwen3_asr) == (qwen3_asr_window_flops(TINY_QWEN3_ASR), window_ms)
