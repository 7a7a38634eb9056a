"""Where an encoder step's device time goes: its kernels by family, from ``torch.profiler``.

:func:`profile_step` runs the streaming step of the throughput benchmark's
``encoder_step`` row (:func:`audiomask.bench.throughput.encoder_steps`: the
same slots, features and start groups) under the profiler and sums its
kernels' device time by :data:`FAMILIES`, a kernel's family read from its name
(cuBLAS and CUTLASS GEMMs, cuDNN and PyTorch convolutions, attention, norms,
layout conversions, copies, reductions, elementwise work, the project's own
Triton kernels by their names). On a CPU the "kernels" are the operators'
own CPU time (``aten::addmm`` is a GEMM): a smoke run of the same code.

The report answers what a step costs and which lever comes next: the
families' milliseconds per step and shares, the kernel count per step, and
the largest kernels. :func:`report_events` makes such a report of any
profiled steps (``scripts/bench_features.py``: the front-end stage's cycles,
their FFTs among the families).
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from audiomask.bench.models import BenchModel
from audiomask.bench.throughput import encoder_steps
from audiomask.checks import check_int

__all__ = ["FAMILIES", "family", "profile_step", "report_events"]

US_PER_MS = 1000.0
TOP_KERNELS = 15  # the largest kernels a report lists
# Kernel families by name, first match wins: attention, layout and convolution before GEMM (cuDNN's attention,
# layout and implicit-GEMM convolution kernels carry GEMM's words too). Lower-case regular expressions.
FAMILIES: dict[str, str] = {
    "fft": r"fft",  # a front end's spectra
    "attention": r"flash|fmha|sdpa|attention|softmax",
    "layout": r"nchwtonhwc|nhwctonchw|transpose|permute",
    "conv": r"conv|fprop|depthwise",
    "gemm": r"gemm|gemv|cutlass|nvjet|cublas|addmm|aten::mm\b|matmul|linear|bmm",
    "norm": r"layer_norm|layernorm|rms_norm|batch_norm",
    "copy": r"copy|memcpy|memset|fill|cat|index|scatter|gather|pad",
    "reduction": r"reduce|sum|mean|argmax|amax|cummax",
    "elementwise": r"elementwise|vectorized|unrolled|add|mul|activation|gelu|relu|silu|sigmoid|tanh|erf|where|clamp|"
    r"log|pow|div|maximum|square",
}
_PATTERNS = {name: re.compile(pattern) for name, pattern in FAMILIES.items()}


def family(kernel: str) -> str:
    """The family of :data:`FAMILIES` that the kernel (or CPU operator) named ``kernel`` belongs to, else ``other``.

    >>> family("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), family("aten::layer_norm")
    ('gemm', 'norm')
    >>> family("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"), family("x")
    ('elementwise', 'other')
    """
    name = kernel.lower()
    return next((label for label, pattern in _PATTERNS.items() if pattern.search(name)), "other")


def profile_step(
    model: BenchModel,
    streams: int,
    *,
    steps: int = 8,
    chunk_size: int = 0,
    left_chunk: int = 0,
    cuda_graph: bool = False,
) -> dict:
    """Profile ``steps`` encoder steps of ``streams`` streams after their warm-up; the report.

    ``chunk_size``, ``left_chunk`` and ``cuda_graph`` as :func:`~audiomask.bench.throughput.encoder_steps`. On a
    CUDA device the report counts the kernels' device time (the queue's busy time if they never overlap); on a
    CPU the operators' self CPU time. Qwen3-ASR's steps should be a multiple of 8 (each closes one window in
    eight, a window per stream every 8 steps).
    """
    steps = check_int("steps", steps, minimum=1)
    warmup, step = encoder_steps(model, streams, chunk_size=chunk_size, left_chunk=left_chunk, cuda_graph=cuda_graph)
    cuda = model.device.type == "cuda"
    with torch.inference_mode():
        for index in range(warmup + 1):  # a first timed-like step too: lazy initialisation stays out
            step(index)
        if cuda:
            torch.cuda.synchronize(model.device)
        activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
        with profile(activities=activities) as profiler:
            for index in range(warmup + 1, warmup + 1 + steps):
                step(index)
            if cuda:
                torch.cuda.synchronize(model.device)
    settings = {"model": model.name, "streams": streams, "cuda_graph": cuda_graph}
    return report_events(profiler.events(), cuda, steps, settings)


def report_events(events: list, cuda: bool, steps: int, settings: dict) -> dict:
    """Kernels (CUDA) or operators' self time (CPU) of a profiler's ``events`` over ``steps`` steps, per step, by
    family and largest first; ``settings`` head the report."""
    time_us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for event in events:
        if cuda and event.device_type == DeviceType.CUDA:
            spent = event.device_time_total
        elif not cuda and event.device_type == DeviceType.CPU:
            spent = event.self_cpu_time_total
        else:
            continue
        time_us[event.name] += spent
        count[event.name] += 1
    total_us = sum(time_us.values())
    families: dict[str, dict] = {}
    for name, spent in time_us.items():
        entry = families.setdefault(family(name), {"ms_per_step": 0.0, "kernels_per_step": 0.0})
        entry["ms_per_step"] += spent / US_PER_MS / steps
        entry["kernels_per_step"] += count[name] / steps
    for entry in families.values():
        entry["share"] = entry["ms_per_step"] * steps * US_PER_MS / total_us if total_us else 0.0
    largest = sorted(time_us, key=time_us.__getitem__, reverse=True)[:TOP_KERNELS]
    return {
        **settings,
        "steps": steps,
        "measures": "kernels' device time" if cuda else "operators' self CPU time",
        "ms_per_step": total_us / US_PER_MS / steps,
        "kernels_per_step": sum(count.values()) / steps,
        "families": dict(sorted(families.items(), key=lambda item: -item[1]["ms_per_step"])),
        "top_kernels": [
            {
                "name": name,
                "family": family(name),
                "ms_per_step": time_us[name] / US_PER_MS / steps,
                "calls_per_step": count[name] / steps,
                "share": time_us[name] / total_us,
            }
            for name in largest
        ],
    }
