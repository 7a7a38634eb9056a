"""How close a throughput row comes to the device's limits: compute (FLOPs) and memory (the state of its streams).

Compute. :func:`flop_per_audio_second` counts an encoder's FLOPs per second of
one stream's audio from the model itself (:func:`count_step_flops`): its real
streaming step (:func:`~audiomask.streaming.open_slots`, one slot, eager) runs
under ``torch.utils.flop_counter.FlopCounterMode``. The counted steps are those
in which a slot emits its outputs once, after its left context has filled:

- Phi-4MM: one chunk step after ``left_chunks`` uncounted steps have filled
  its key/value ring (every later step costs the same: ``C`` queries against
  ``(left_chunks + 1) * C`` keys in every block);
- Qwen3-ASR: the 8 steps of one attention window, 8 conv chunks and the
  window's attention once: per audio second what the benchmark's steady state
  costs, where each step attends about one window in eight.

The counter counts matrix products, convolutions and attention's two products
(``2 * T_q * T_k * d`` each, per head). It does not count elementwise work
(activations, normalisations, softmax, residual adds, the relative position
bias), nor the Phi-4MM conv module's depthwise conv, which runs as multiply-adds
of shifted views (``2 * kernel_size`` FLOP per channel and token: 0.02 % of a
full-size block). ``torch.utils.flop_counter`` has no formula for the CPU's
fused attention kernel: :data:`_CPU_ATTENTION` gives it the formula of the CUDA
kernels, and the steps run the encoders' reference ops
(:func:`audiomask.models.fused.reference_ops`: convolutions, not the kernels
or the patch products that compute them), so that a count is the model's, the
same on every device.

:func:`compute_limit`: the streams that :data:`COMPUTE_SHARE` of the device's
dense bf16 peak (:func:`peak_tflops`, from :data:`DENSE_BF16_PEAK_TFLOPS` by
the device's name) keeps in real time. :func:`memory_limit`: the streams whose
state fits in the device's memory. :class:`EncoderLimits` holds what an
encoder's rows are judged against, worked out once per model and run, and
:meth:`EncoderLimits.row_fields` gives a row's figures: achieved TFLOPS, its
fraction of the peak, both limits and the row's streams as a fraction of the
nearer one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from audiomask.bench.models import BenchModel
from audiomask.bench.timing import MS_PER_S
from audiomask.models import fused
from audiomask.streaming import chunk_plan, open_slots

__all__ = [
    "COMPUTE_SHARE",
    "DENSE_BF16_PEAK_TFLOPS",
    "TERA",
    "EncoderLimits",
    "achieved_tflops",
    "compute_limit",
    "count_step_flops",
    "device_memory_bytes",
    "device_peak_tflops",
    "flop_per_audio_second",
    "memory_limit",
    "peak_tflops",
]

COMPUTE_SHARE = 0.4  # of the dense bf16 peak: what the compute limit assumes a chunk step sustains
TERA = 1e12  # FLOP per TFLOP
# Dense (no sparsity) bf16 tensor-core peaks, TFLOPS, from NVIDIA's data sheets, keyed by a substring of
# torch.cuda.get_device_name(); the first match wins, so the more specific names come first (an H100 SXM
# is named "NVIDIA H100 80GB HBM3": a plain "H100" is the SXM part).
DENSE_BF16_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
)


def _fused_attention_flop(
    query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size, *args: object, **kwargs: object
) -> int:
    """The CUDA attention kernels' formula (``torch.utils.flop_counter.sdpa_flop_count``), for the CPU's kernel."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


_CPU_ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _fused_attention_flop}


def peak_tflops(device_name: str | None) -> float | None:
    """The dense bf16 peak (TFLOPS) of the device named ``device_name``; ``None`` for an unknown name or ``None``.

    >>> peak_tflops("NVIDIA H200"), peak_tflops("NVIDIA H100 PCIe"), peak_tflops("NVIDIA A100-SXM4-80GB")
    (989.0, 756.0, 312.0)
    >>> peak_tflops("NVIDIA GeForce RTX 4090") is None, peak_tflops(None) is None
    (True, True)
    """
    if device_name is None:
        return None
    return next((peak for key, peak in DENSE_BF16_PEAK_TFLOPS if key in device_name), None)


def device_peak_tflops(device: torch.device) -> float | None:
    """:func:`peak_tflops` of a CUDA ``device`` by its name; ``None`` on the CPU."""
    return peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


@torch.no_grad()
def count_step_flops(
    encoder: nn.Module, chunk_ms: int | None = None, left_chunks: int | None = None
) -> tuple[int, int]:
    """``(FLOP, audio ms)``: the FLOPs of ``encoder``'s counted streaming steps of one stream and the milliseconds
    of audio they encode (see the module docstring for which steps are counted).

    ``chunk_ms`` and ``left_chunks``: the configuration, as :func:`~audiomask.streaming.chunk_plan` takes them
    (``None``: the encoder's). One slot is opened on the encoder's device (eager, no CUDA graph) and stepped on
    zero features; the count does not depend on the values or the dtype.
    """
    slots = open_slots(encoder, 1, chunk_ms=chunk_ms, left_chunks=left_chunks, cuda_graph=False)
    plan = slots.plan
    chunk = np.zeros(slots.chunk_shape, np.float32)
    valid = np.full(1, plan.chunk_frames)
    for _ in range(plan.left_chunks or 0):  # the key/value ring filled: the steady state
        slots.step(chunk, valid)
    counted_steps = plan.tokens_per_chunk // plan.chunk_tokens  # the steps of one emission of the outputs
    with fused.reference_ops(), FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION) as counter:
        for _ in range(counted_steps):
            slots.step(chunk, valid)
    return counter.get_total_flops(), counted_steps * plan.chunk_ms


def flop_per_audio_second(encoder: nn.Module, chunk_ms: int | None = None, left_chunks: int | None = None) -> float:
    """FLOP per second of one stream's audio through ``encoder``'s streaming step: :func:`count_step_flops`'s
    FLOPs over its audio seconds (arguments as its)."""
    flops, audio_ms = count_step_flops(encoder, chunk_ms, left_chunks)
    return flops * MS_PER_S / audio_ms


def compute_limit(flop_per_audio_s: float, peak: float | None, share: float = COMPUTE_SHARE) -> int | None:
    """Streams that ``share`` of a ``peak`` of TFLOPS keeps in real time, each costing ``flop_per_audio_s``
    FLOP per second; ``None`` without a peak.

    >>> compute_limit(12.7e9, 989.0)
    31149
    """
    if peak is None:
        return None
    return math.floor(share * peak * TERA / flop_per_audio_s)


def device_memory_bytes(device: torch.device) -> int | None:
    """The device's total memory in bytes; ``None`` on the CPU."""
    return torch.cuda.mem_get_info(device)[1] if device.type == "cuda" else None


def memory_limit(device_bytes: int | None, state_bytes_per_stream: int, fixed_bytes: int = 0) -> int | None:
    """Streams whose state fits in the device: ``(device_bytes - fixed_bytes) / state_bytes_per_stream``, floored.

    ``device_bytes``: the device's total memory (``None``: the CPU, no limit given); ``fixed_bytes``: what does
    not grow with the streams (:class:`EncoderLimits` subtracts the weights and the slots' shared state).

    >>> memory_limit(141 * 10**9, 8_283_750), memory_limit(None, 1)
    (17021, None)
    """
    if device_bytes is None:
        return None
    return max(0, (device_bytes - fixed_bytes) // state_bytes_per_stream)


def achieved_tflops(streams: int, flop_per_audio_s: float, chunk_ms: float, gpu_ms_per_chunk: float) -> float:
    """TFLOPS the device sustained: ``streams`` streams' chunks of ``chunk_ms`` ms of audio, each costing
    ``flop_per_audio_s`` FLOP per audio second, computed in ``gpu_ms_per_chunk`` ms of device time.

    >>> achieved_tflops(10_000, 12.7e9, 1280, 1280)
    127.0
    """
    return streams * flop_per_audio_s * chunk_ms / gpu_ms_per_chunk / TERA


def _module_bytes(modules: Sequence[nn.Module]) -> int:
    """Bytes of the parameters and buffers of ``modules``."""
    return sum(t.numel() * t.element_size() for m in modules for t in (*m.parameters(), *m.buffers()))


@dataclass(frozen=True)
class EncoderLimits:
    """What one model's throughput rows are judged against, worked out once per model and run.

    Attributes:
        flop_per_audio_s: FLOP per second of one stream's audio (:func:`flop_per_audio_second`).
        state_bytes_per_stream: the configuration's device state per stream, in the serving dtype
            (:attr:`~audiomask.streaming.ChunkPlan.slot_bytes`: Phi-4MM's key/value cache of the left context
            and its conv and subsampling caches, and with CUDA graphs the step's static inputs; Qwen3-ASR's window).
        shared_bytes: the device state a batch of slots shares (:attr:`~audiomask.streaming.ChunkPlan.shared_bytes`);
            a driver holds one batch a lane.
        weight_bytes: the model's parameters and buffers on the device (encoder and CTC head).
        peak_tflops: the device's dense bf16 peak (:func:`device_peak_tflops`), whatever the model's dtype (the
            shipped model runs float32); ``None`` on the CPU or an unknown device.
    """

    flop_per_audio_s: float
    state_bytes_per_stream: int
    shared_bytes: int
    weight_bytes: int
    peak_tflops: float | None

    @classmethod
    def of(cls, model: BenchModel, chunk_ms: int | None = None, left_chunks: int | None = None) -> EncoderLimits:
        """``model``'s figures in the configuration of ``chunk_ms`` and ``left_chunks`` (as
        :func:`~audiomask.streaming.chunk_plan` takes them), its slots' CUDA graphs where the device has them."""
        plan = chunk_plan(model.encoder, chunk_ms, left_chunks)
        return cls(
            flop_per_audio_s=flop_per_audio_second(model.encoder, chunk_ms, left_chunks),
            state_bytes_per_stream=plan.slot_bytes,
            shared_bytes=plan.shared_bytes,
            weight_bytes=_module_bytes([model.asr.encoder, model.asr.head]),
            peak_tflops=device_peak_tflops(model.device),
        )

    def limits(self, device_bytes: int | None, lanes: int = 1) -> dict[str, int | None]:
        """``{"compute": streams, "memory": streams}`` on a device of ``device_bytes`` (``None``: the CPU) with
        ``lanes`` batches of slots: :func:`compute_limit` and :func:`memory_limit` (less the weights and each
        lane's shared state); ``None`` where not known."""
        return {
            "compute": compute_limit(self.flop_per_audio_s, self.peak_tflops),
            "memory": memory_limit(
                device_bytes, self.state_bytes_per_stream, self.weight_bytes + lanes * self.shared_bytes
            ),
        }

    def nearer_limit(self, device_bytes: int | None, lanes: int = 1) -> int | None:
        """The smaller of :meth:`limits` (``None`` when neither is known)."""
        return min(
            (streams for streams in self.limits(device_bytes, lanes).values() if streams is not None), default=None
        )

    def row_fields(self, row: dict) -> dict:
        """The fields a throughput row (:func:`audiomask.bench.search.search`'s) gains, JSON-ready.

        ``flop_per_audio_s``, ``peak_tflops`` and ``state_bytes_per_stream`` as above;
        ``achieved_tflops``: :func:`achieved_tflops` at the probe whose costs the row reports
        (``cycle_costs``: its streams and device ms per chunk; the encoder's FLOPs only, a driver's CTC
        head and argmax are not counted), and ``fraction_of_peak`` of it (``None`` without a peak or costs);
        ``compute_limit_streams`` (:func:`compute_limit`), ``memory_limit_streams`` (:func:`memory_limit` of
        the row's ``device_bytes``, less the weights and each lane's shared state: the step's activations, the
        CUDA context and the allocator's reserve are not subtracted, so it bounds from above);
        ``nearer_limit`` (``"compute"`` or ``"memory"``, the smaller of the two) and
        ``fraction_of_nearer_limit``: the row's ``max_streams`` over it (``None`` where neither is known).
        """
        costs = row.get("cycle_costs") or {}
        achieved = None
        if costs.get("gpu_ms_per_cycle"):
            achieved = achieved_tflops(
                costs["streams"], self.flop_per_audio_s, row["chunk_ms"], costs["gpu_ms_per_cycle"]
            )
        limits = self.limits(row.get("device_bytes"), row.get("lanes", 1))
        known = {name: streams for name, streams in limits.items() if streams is not None}
        nearer = min(known, key=known.get) if known else None  # type: ignore[arg-type]
        return {
            "flop_per_audio_s": self.flop_per_audio_s,
            "peak_tflops": self.peak_tflops,
            "achieved_tflops": achieved,
            "fraction_of_peak": achieved / self.peak_tflops if achieved is not None and self.peak_tflops else None,
            "compute_limit_streams": limits["compute"],
            "state_bytes_per_stream": self.state_bytes_per_stream,
            "memory_limit_streams": limits["memory"],
            "nearer_limit": nearer,
            "fraction_of_nearer_limit": row["max_streams"] / known[nearer] if nearer and known[nearer] else None,
        }
