"""Host->device copy strategies side by side: host time per copy and GPU-side time, idle and busy stream.

Strategies, for payloads of 16 KiB .. 64 MiB:

- ``pageable``: a non-blocking ``Tensor.to`` from pageable memory
  (``audiomask.transfer.baselines.direct_copy``): the negative control, which
  waits for the GPU queue once a payload outgrows the driver's own staging buffers
- ``pin_per_copy``: pin a fresh copy, then a non-blocking ``Tensor.to`` (the vLLM approach)
- ``ring``: ``audiomask.to_device`` (staging memcpy into a pinned ring slot + event-guarded submit)
- ``ring_in_place``: a Phi-4MM mask built by ``hs_mask(out=)`` straight into a ring slot, then
  submitted; host time is the submit alone (the build is reported as ``build_ms_p50``)
- ``on_device`` (the latency benchmark's, not this script's): the same mask built with torch
  on the device (:func:`audiomask.bench.device_masks.hs_mask_torch`); host time is moving the
  lengths there plus launching the build

and the floors that ``ring`` and ``ring_in_place`` are made of, timed the same way:
``staging_numpy`` / ``staging_torch`` (the staging memcpy into a leased slot with numpy's
single-threaded copy / torch's multi-threaded one: ``stage_copy`` picks one by size) and
``bare_copy`` (one ``copy_`` from a ring slot in which a mask has just been built into a fresh
device tensor on the ring's copy stream: the allocation, the driver's copy and torch's dispatch,
which a ring submit also pays, nothing else).

Each is timed in five GPU states (``gpu_state``; ``busy_gpu`` is True in the three busy ones),
see :data:`CONDITIONS`: ``idle`` (a synchronised device); ``waited`` (the host first sleeps
``BUSY_MS`` with the GPU idle: the control of ``busy``); ``busy`` (``BUSY_MS`` of GPU work queued
right before each copy, the host blocked in the previous repetition's synchronise); ``busy_hot``
(as ``busy``, the host running front-end-like work meanwhile and for ``SETTLE_MS`` after queueing);
``busy_steady``, the state of a server under load: the current CUDA stream is kept fed for a whole
block (:class:`~audiomask.bench.harness.QueueFeed`, topped up outside the timed region to
>= ``BUSY_MS`` of queued work, the depth before each timed copy recorded as ``queue_ms_min`` /
``queue_ms_p50``), the GPU never idle within the block (``gpu_idle_gaps`` counts top-ups that
found it drained). ``busy`` and ``busy_hot`` time each copy within ~1 ms of work queued on an
idle GPU, a transient in which every CUDA call costs several times more: the comparisons are
judged in ``idle`` and ``busy_steady`` (:data:`JUDGED_CONDITIONS`), the others reported beside
them. ``queue_still_busy``: the fraction of copies after which the queued work was still running
(the host did not wait for it). Dropping the result is timed apart (``free_ms_*``).

GPU-side time is one figure per (strategy, size) from a separate pass
(:func:`~audiomask.bench.copy_timing.gpu_pass`). ``staging`` reports the memcpy into a pinned slot
in a hot loop, for its GB/s. Python's garbage collector is paused during timed loops. Without
CUDA the script measures the staging copy only and says which strategies it skipped.

Usage: python3 scripts/bench_transfer.py --out bench/results/transfer_h200.json [--quick] [--sizes 16K 1M 64M]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from audiomask.bench.copy_timing import (
    GATE_MS,
    STEADY_LEAD_MS,
    STEADY_WARMUP_DEPTHS,
    Strategy,
    end_to_end_pass,
    gpu_pass,
    host_pass,
    steady_pass,
)
from audiomask.bench.device_masks import hs_mask_torch
from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.harness import HostWorkload, QueueFeed, QueueFiller
from audiomask.bench.timing import percentiles
from audiomask.bench.transfer_verdicts import FLOORS, JUDGED_CONDITIONS, STEADY_MIN_QUEUE_MS, verdicts
from audiomask.masks.phi4mm import TIME_REDUCTION, hs_mask
from audiomask.transfer import KiB, MiB, PinnedRing, default_ring, parallel_copy_bytes, stage_copy, to_device
from audiomask.transfer.baselines import direct_copy, pin_per_copy

__all__ = [
    "CONDITIONS",
    "CPU_STRATEGIES",
    "JUDGED_CONDITIONS",
    "Case",
    "GpuState",
    "Repeats",
    "build_host_mask",
    "main",
    "make_case",
    "make_strategies",
    "measure",
    "parse_size",
    "print_table",
    "verdicts",
]

SIZES = (16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)
STRATEGIES = (
    "pageable",
    "pin_per_copy",
    "ring",
    "ring_in_place",
)  # this script's; the latency benchmark adds on_device
CPU_STRATEGIES = ("ring", "ring_in_place", "on_device")  # those that mean something without CUDA (device = CPU)
BUSY_MS = 50.0  # GPU work queued ahead of a busy-stream copy


class GpuState(NamedTuple):
    """How a state sets the GPU and the host up before each timed copy."""

    busy: bool  # GPU work is queued on the current CUDA stream ahead of the copy
    host_wait: bool  # the host sleeps BUSY_MS first, with the GPU idle (the control of "busy")
    hot: bool  # the host runs front-end-like work instead of blocking while the GPU drains
    steady: bool  # the queue is kept fed through the whole block: it never drains between copies


CONDITIONS = {
    "idle": GpuState(busy=False, host_wait=False, hot=False, steady=False),
    "waited": GpuState(busy=False, host_wait=True, hot=False, steady=False),
    "busy": GpuState(busy=True, host_wait=False, hot=False, steady=False),
    "busy_hot": GpuState(busy=True, host_wait=False, hot=True, steady=False),
    "busy_steady": GpuState(busy=True, host_wait=False, hot=True, steady=True),
}
STEADY_PIECE_MS = 1.0  # busy_steady: the queue is fed in pieces of this much work: the queue depth's resolution
MASK_TOKENS_SMALL = 128  # (B, 128, 128) bool masks for payloads under 1 MiB
MASK_TOKENS_LARGE = 1024  # (B, 1024, 1024) from 1 MiB
# The masks built in place or on the device: Phi-4MM hidden-state masks of random lengths,
# chunks of 16 tokens (1.28 s), 4 chunks of left context.
MASK_CHUNK_SIZE = 16
MASK_LEFT_CHUNK = 4


@dataclass(frozen=True)
class Repeats:
    idle: int  # timed copies per idle case
    busy: int  # timed copies per busy or waited case (each costs BUSY_MS)
    steady: int  # timed copies per busy_steady case (each costs its own time: the queue is never waited for)
    gpu: int  # GPU-side timings per (strategy, size) (each costs GATE_MS)
    staging: int
    warmup: int  # untimed repetitions before each of the above


FULL = Repeats(idle=400, busy=30, steady=200, gpu=10, staging=100, warmup=3)  # p99 of 400 and 200 timed copies
QUICK = Repeats(idle=10, busy=3, steady=5, gpu=2, staging=10, warmup=1)


@dataclass
class Case:
    """One payload size: the same random bytes for every strategy."""

    nbytes: int
    payload: np.ndarray  # (nbytes,) uint8, pageable
    tensor: torch.Tensor  # the same memory as a CPU tensor
    mask_shape: tuple[int, int, int]  # (B, L, L) bool of nbytes for the in-place mask
    mask: np.ndarray  # (B, L, L) bool, pageable: where copy strategies build their mask end to end


def make_case(nbytes: int, rng: np.random.Generator) -> Case:
    """A case of ``nbytes`` random bytes, and the shape of a ``(B, L, L)`` bool mask of the same size."""
    payload = rng.integers(0, 256, nbytes, dtype=np.uint8)
    tokens = MASK_TOKENS_LARGE if nbytes >= MiB else MASK_TOKENS_SMALL
    shape = (nbytes // tokens**2, tokens, tokens)
    return Case(nbytes, payload, torch.from_numpy(payload), shape, np.zeros(shape, np.bool_))


def parse_size(text: str) -> int:
    """Bytes of a payload size written as ``16K``, ``1M`` or a plain number of bytes.

    The in-place mask of a case is ``(B, L, L)`` bool with ``L`` 128 below 1 MiB and 1024 from
    1 MiB, so a size must be a multiple of ``L * L`` bytes: 16 KiB, or 1 MiB from 1 MiB.

    >>> parse_size("16K"), parse_size("64M"), parse_size("32768")
    (16384, 67108864, 32768)
    """
    units = {"K": KiB, "M": MiB}
    digits, unit = (text[:-1], units[text[-1].upper()]) if text[-1:].upper() in units else (text, 1)
    try:
        nbytes = int(digits) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be a number of bytes or like 16K or 1M, got {text!r}") from None
    step = MASK_TOKENS_LARGE**2 if nbytes >= MiB else MASK_TOKENS_SMALL**2
    if nbytes <= 0 or nbytes % step:
        raise argparse.ArgumentTypeError(
            f"size must be a positive multiple of {step // KiB}K (the in-place mask's L*L bytes), got {text!r}"
        )
    return nbytes


def mask_lengths(batch: int, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """``(batch,)`` int64 random feature lengths in ``[1, tokens * TIME_REDUCTION]``."""
    return rng.integers(1, tokens * TIME_REDUCTION + 1, size=batch)


def build_host_mask(out: np.ndarray, rng: np.random.Generator) -> None:
    """Write a ``(B, L, L)`` Phi-4MM hidden-state mask of random lengths into ``out`` with numpy ``hs_mask``."""
    batch, tokens, _ = out.shape
    lengths = mask_lengths(batch, tokens, rng)
    hs_mask(lengths, tokens * TIME_REDUCTION, MASK_CHUNK_SIZE, MASK_LEFT_CHUNK, out=out)


def build_device_mask(lengths: np.ndarray, tokens: int, device: torch.device) -> torch.Tensor:
    """The same mask built with torch on ``device``; the host lengths move there through ``to_device``."""
    on_device = to_device(lengths, device)
    return hs_mask_torch(on_device, tokens * TIME_REDUCTION, MASK_CHUNK_SIZE, MASK_LEFT_CHUNK)


def make_strategies(device: torch.device, ring: PinnedRing, rng: np.random.Generator) -> dict[str, Strategy]:
    """Every strategy and floor that runs on ``device`` (without CUDA: those of :data:`CPU_STRATEGIES`)."""
    cuda = device.type == "cuda"

    def prepare_in_place(case: Case) -> object:
        staged = ring.stage(case.mask_shape, np.bool_)
        start = time.perf_counter()
        build_host_mask(staged.array, rng)
        strategies["ring_in_place"].build_ms.append((time.perf_counter() - start) * 1e3)
        return staged

    def in_place_end_to_end(case: Case) -> torch.Tensor:
        staged = ring.stage(case.mask_shape, np.bool_)
        build_host_mask(staged.array, rng)
        return staged.to(device)

    def copied_end_to_end(copy: Callable[[Case], torch.Tensor]) -> Callable[[Case], torch.Tensor]:
        def end_to_end(case: Case) -> torch.Tensor:
            build_host_mask(case.mask, rng)
            return copy(case)

        return end_to_end

    def on_device_lengths(case: Case) -> object:
        return mask_lengths(case.mask_shape[0], case.mask_shape[1], rng)

    def on_device_end_to_end(case: Case) -> torch.Tensor:
        return build_device_mask(on_device_lengths(case), case.mask_shape[1], device)

    strategies = {
        "ring": Strategy(
            "ring",
            True,
            lambda case, stream, state: to_device(case.payload, device, stream=stream, ring=ring),
            end_to_end=copied_end_to_end(lambda case: to_device(case.mask, device, ring=ring)),
        ),
        "ring_in_place": Strategy(
            "ring_in_place",
            True,
            lambda case, stream, staged: staged.to(device, stream=stream),  # type: ignore[attr-defined]
            prepare_in_place,
            end_to_end=in_place_end_to_end,
        ),
        "on_device": Strategy(
            "on_device",
            False,
            lambda case, stream, lengths: build_device_mask(lengths, case.mask_shape[1], device),  # type: ignore[arg-type]
            on_device_lengths,
            end_to_end=on_device_end_to_end,
        ),
    }
    if not cuda:
        return strategies
    copy_stream, consumer = ring.copy_stream(device), torch.cuda.current_stream(device)

    def lease(case: Case) -> object:
        return ring.stage(case.nbytes, np.uint8)

    def prepare_bare(case: Case) -> object:
        staged = ring.stage(case.mask_shape, np.bool_)
        build_host_mask(staged.array, rng)
        torch.cuda.set_stream(copy_stream)
        return staged

    def finish_bare(staged: object) -> None:
        torch.cuda.set_stream(consumer)
        staged.release(copy_stream.record_event())  # type: ignore[attr-defined]  # not reused before the copy ran

    strategies.update(
        {
            "pageable": Strategy(
                "pageable",
                False,
                lambda case, stream, state: direct_copy(case.tensor, device),
                end_to_end=copied_end_to_end(lambda case: direct_copy(torch.from_numpy(case.mask), device)),
            ),
            "pin_per_copy": Strategy(
                "pin_per_copy",
                False,
                lambda case, stream, state: pin_per_copy(case.tensor, device),
                end_to_end=copied_end_to_end(lambda case: pin_per_copy(torch.from_numpy(case.mask), device)),
            ),
            "staging_numpy": Strategy(
                "staging_numpy",
                False,
                lambda case, stream, staged: np.copyto(staged.array, case.payload),  # type: ignore[attr-defined]
                lease,
                lambda staged: staged.release(),  # type: ignore[attr-defined]
            ),
            "staging_torch": Strategy(
                "staging_torch",
                False,
                lambda case, stream, staged: staged.tensor.copy_(case.tensor),  # type: ignore[attr-defined]
                lease,
                lambda staged: staged.release(),  # type: ignore[attr-defined]
            ),
            "bare_copy": Strategy(
                "bare_copy",
                True,
                lambda case, stream, staged: direct_copy(staged.tensor, device, method="copy_"),  # type: ignore[attr-defined]
                prepare_bare,
                finish_bare,
            ),
        }
    )
    return strategies


def measure(
    cases: Sequence[Case],
    names: Sequence[str],
    strategies: dict[str, Strategy],
    repeats: Repeats,
    busy_ms: float,
    device: torch.device,
    *,
    conditions: Sequence[str] = tuple(CONDITIONS),
    end_to_end: bool = False,
) -> list[dict]:
    """One entry per (strategy, size, GPU state): host times, and the GPU-side (and end-to-end) times per size.

    On CUDA every state of ``conditions`` (names of :data:`CONDITIONS`) runs; on the CPU only ``idle``
    (no GPU to keep busy). Each entry names its state twice, as ``gpu_state`` and (older reports'
    key) ``condition``; ``busy_gpu`` is True for every state with GPU work queued ahead of the copy.
    """
    cuda = device.type == "cuda"
    consumer = torch.cuda.current_stream(device) if cuda else None
    side_stream = torch.cuda.Stream(device) if cuda else None  # where ring copies run in the GPU-side pass
    filler = QueueFiller(device) if cuda else None
    feed = QueueFeed(filler, consumer, busy_ms, STEADY_PIECE_MS) if cuda else None  # type: ignore[arg-type]
    workload = HostWorkload(device)
    entries: list[dict] = []
    for case in cases:
        for name in names:
            strategy = strategies[name]
            extra: dict = {}
            if cuda and name not in FLOORS:
                extra.update(gpu_pass(strategy, case, repeats.gpu, repeats.warmup, filler, side_stream))  # type: ignore[arg-type]
            if end_to_end and strategy.end_to_end is not None:
                extra.update(end_to_end_pass(strategy, case, device, repeats.idle, repeats.warmup))
            for condition in conditions if cuda else ("idle",):
                state = CONDITIONS[condition]
                if state.steady:
                    reps = repeats.steady
                    host = steady_pass(strategy, case, reps, repeats.warmup, feed, workload)  # type: ignore[arg-type]
                else:
                    reps = repeats.busy if state.busy or state.host_wait else repeats.idle
                    host = host_pass(
                        strategy,
                        case,
                        busy_ms if state.busy else 0.0,
                        reps,
                        repeats.warmup,
                        filler,
                        consumer,
                        busy_ms if state.host_wait else 0.0,
                        workload if state.hot else None,
                    )
                entries.append(
                    {
                        "strategy": name,
                        "bytes": case.nbytes,
                        "gpu_state": condition,
                        "condition": condition,
                        "busy_gpu": state.busy,
                        "host_wait_ms": busy_ms if state.host_wait else 0.0,
                        "reps": reps,
                        **host,
                        **extra,
                    }
                )
        gc.collect()
    return entries


def staging_pass(case: Case, ring: PinnedRing, repeats: int, warmup: int) -> list[dict]:
    """The memcpy into a ring slot in a hot loop: ``stage_copy`` (what to_device does), numpy's and torch's copies."""
    methods = {
        "stage_copy": lambda staged: stage_copy(staged.tensor, case.payload),
        "numpy_copyto": lambda staged: np.copyto(staged.array, case.payload),
        "torch_copy": lambda staged: staged.tensor.copy_(case.tensor),
    }
    rows = []
    for method, copy in methods.items():
        times = []
        for i in range(warmup + repeats):
            with ring.stage(case.nbytes, np.uint8) as staged:
                start = time.perf_counter()
                copy(staged)
                elapsed = (time.perf_counter() - start) * 1e3
            if i >= warmup:
                times.append(elapsed)
        stats = percentiles(times)
        rows.append(
            {
                "method": method,
                "bytes": case.nbytes,
                **{f"host_ms_{key}": value for key, value in stats.items()},
                "gbps": case.nbytes / stats["p50"] / 1e6,
            }
        )
    return rows


def print_table(entries: list[dict], staging: list[dict] = ()) -> None:
    """The entries (and staging rows) as a fixed-width table on stdout.

    ``q busy``: the fraction of copies after which the queued work was still running; ``q ms``
    (busy_steady): the least GPU work queued before a timed copy, ms.
    """
    header = f"{'strategy':<14}{'bytes':>10}{'state':>13}{'host p50':>10}{'host p99':>10}{'free p99':>10}"
    end_to_end_column = f"{'e2e p50':>9}" if any("end_to_end_ms_p50" in e for e in entries) else ""
    print(f"\n{header}{'gpu ms':>9}{'GB/s':>7}{'q busy':>8}{'q ms':>7}{end_to_end_column}")
    for e in entries:
        gpu = f"{e['gpu_ms_p50']:9.3f}{e['gbps']:7.1f}" if "gpu_ms_p50" in e else f"{'-':>9}{'-':>7}"
        busy = f"{e['queue_still_busy']:8.2f}" if "queue_still_busy" in e else f"{'':>8}"
        queued = f"{e['queue_ms_min']:7.0f}" if "queue_ms_min" in e else f"{'':>7}"
        end_to_end = f"{e['end_to_end_ms_p50']:9.3f}" if "end_to_end_ms_p50" in e else ""
        print(
            f"{e['strategy']:<14}{e['bytes']:>10}{e['gpu_state']:>13}"
            f"{e['host_ms_p50']:10.3f}{e['host_ms_p99']:10.3f}{e['free_ms_p99']:10.3f}{gpu}{busy}{queued}{end_to_end}"
        )
    if staging:
        print(f"\n{'staging (hot)':<14}{'bytes':>10}{'host p50':>10}{'host p99':>10}{'GB/s':>7}")
        for s in staging:
            print(f"{s['method']:<14}{s['bytes']:>10}{s['host_ms_p50']:10.3f}{s['host_ms_p99']:10.3f}{s['gbps']:7.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/bench_transfer.py``: every strategy and floor at every size and condition; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    parser.add_argument("--busy-ms", type=float, default=BUSY_MS, help="GPU work queued for busy cases (ms)")
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=parse_size,
        default=list(SIZES),
        metavar="SIZE",
        help="payload sizes, e.g. 16K 1M 64M (multiples of 16K below 1M, of 1M from 1M; default: 16K..64M)",
    )
    args = parser.parse_args(argv)
    repeats = QUICK if args.quick else FULL
    began = time.perf_counter()
    rng = np.random.default_rng(0)
    cuda = torch.cuda.is_available()
    report: dict = {
        **capture_environment(sys.argv),
        "repeats": dataclasses.asdict(repeats),
        "busy_ms": args.busy_ms,
        "gate_ms": GATE_MS,
        "sizes": args.sizes,
        "judged_states": list(JUDGED_CONDITIONS),
        "steady": {
            "lead_ms": STEADY_LEAD_MS,
            "warmup_depths": STEADY_WARMUP_DEPTHS,
            "piece_ms": STEADY_PIECE_MS,
            "min_queue_ms": STEADY_MIN_QUEUE_MS,
        },
        "parallel_copy_bytes": parallel_copy_bytes(),
    }
    ring = default_ring("cuda")  # where CUDA is missing: the CPU ring, unpinned
    cases = [make_case(n, rng) for n in args.sizes]
    gc.collect()
    gc.disable()
    try:
        staging = [row for case in cases for row in staging_pass(case, ring, repeats.staging, repeats.warmup)]
        entries: list[dict] = []
        if cuda:
            device = torch.device("cuda", torch.cuda.current_device())
            report["busy_ms_measured"] = QueueFiller(device).measure(args.busy_ms)
            print("in-place mask builder: audiomask.masks.phi4mm.hs_mask")
            strategies = make_strategies(device, ring, rng)
            entries = measure(cases, STRATEGIES + FLOORS, strategies, repeats, args.busy_ms, device)
    finally:
        gc.enable()
    report["staging"] = staging
    report["entries"] = entries
    report["ring_stats"] = dataclasses.asdict(ring.stats())
    print_table(entries, staging)
    if cuda:
        report["verdicts"] = verdicts(entries, report["busy_ms_measured"])
        print(f"\nverdicts: judged in {' and '.join(JUDGED_CONDITIONS)}; busy_hot and busy reported beside them")
        for claim, result in report["verdicts"].items():
            print(f"{claim}: {'n/a' if result['ok'] is None else 'yes' if result['ok'] else 'no'}")
    else:
        report["skipped"] = list(STRATEGIES + FLOORS)
        print(
            f"\nCUDA not available: GPU strategies skipped ({', '.join(STRATEGIES + FLOORS)}); "
            "staging copy measured only"
        )
    report["seconds"] = time.perf_counter() - began
    print(f"\n{report['seconds']:.1f} s")
    if args.out:
        write_result(args.out, report)
    return 0
