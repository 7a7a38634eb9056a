"""The streaming latency benchmark (``audiomask bench``, ``scripts/bench_latency.py``): one run, side by side.

Sections (each in the JSON report under its name):

1. ``transfer``: the mask of a chunk moved to the device four ways, or
   built there: ``pageable``, ``pin_per_copy``, ``ring``, ``ring_in_place``,
   ``on_device`` (:mod:`audiomask.bench.transfer`), one entry per strategy,
   payload size and GPU state (``gpu_state``: idle, busy, busy_hot, busy_steady;
   the transfer guarantees are judged in busy_steady, a queue kept fed through
   the whole block): host time per chunk (p50/p99),
   GPU time, and the end-to-end time from the lengths on the host to the mask
   on the device. Without CUDA, only what means something on the CPU runs.
2. ``pipeline``: serial versus overlapped driver, the overlap figure and
   the host time per chunk (:mod:`audiomask.bench.overlap`).
3. ``latency``: one stream per chunk size (160, 320, 640, 1280 ms) through
   :class:`~audiomask.asr.recognizer.StreamingRecognizer`: algorithmic latency,
   compute latency p50/p95/p99, first-partial latency, real-time factor
   (:mod:`audiomask.bench.single_stream`).
4. ``throughput``: the most concurrent real-time streams (p99 chunk latency
   below the chunk's duration) of the shipped model through the driver, and of
   the full-size Phi-4MM encoder (bf16) and the Qwen3-ASR-0.6B encoder (bf16)
   each through the driver and as its encoder step alone; each row says what
   stops it (GPU compute or memory, the host's front end or driver loop),
   the device memory per stream and the host cores used
   (:mod:`audiomask.bench.throughput`), and how close it comes to the
   device's limits: the encoder's FLOPs per audio second, the TFLOPS achieved
   and their fraction of the dense bf16 peak, the streams that compute and
   memory allow and the row's fraction of the nearer (:mod:`audiomask.bench.limits`).

Beside them: ``environment`` (command, date, git commit, versions, CPU, GPU,
driver), ``settings``, ``models``, ``verdicts`` (the checks of the run's figures),
``notes`` (what was skipped and why) and ``section_seconds``. Every section has
a time budget, a share of ``--seconds`` (time a section leaves unused goes to
the later ones), and prints progress. ``--quick`` is a smoke test of every
section (tiny stand-ins for the full-size encoders, few repetitions) within a
50 s budget: not a measurement. The JSON is
rewritten after every section, so a run stopped early keeps what it measured. PNG plots
(matplotlib: the ``plot`` extra) are written beside the JSON, or later from
it with ``--plot``.

Usage (the H200):   python3 scripts/bench_latency.py --out bench/results/latency_h200.json
Short form (H200):  python3 scripts/bench_latency.py --short --frontend-workers 8 --out bench/results/capacity_h200.json
CPU smoke test:     python3 scripts/bench_latency.py --quick --out /tmp/latency.json
Plots from a JSON:  python3 scripts/bench_latency.py --plot bench/results/latency_h200.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from audiomask.asr.checkpoint import SHIPPED_ENCODER_CONFIG
from audiomask.bench import plots, transfer_verdicts
from audiomask.bench import transfer as transfer_bench
from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.harness import QueueFiller
from audiomask.bench.limits import EncoderLimits, device_memory_bytes
from audiomask.bench.models import BenchModel, build_model
from audiomask.bench.overlap import pipeline_section, pipeline_threads
from audiomask.bench.search import search
from audiomask.bench.single_stream import measure_latency
from audiomask.bench.tables import print_tables
from audiomask.bench.throughput import ProbePlan, make_probe
from audiomask.bench.timing import Budget, log
from audiomask.constants import FRAME_MS
from audiomask.transfer import KiB, MiB, default_ring

__all__ = ["main", "streaming_chunking"]

SECTIONS = ("transfer", "pipeline", "latency", "throughput")
SECTION_SHARES = {"transfer": 0.15, "pipeline": 0.10, "latency": 0.12, "throughput": 0.63}  # of --seconds
TRANSFER_STRATEGIES = ("pageable", "pin_per_copy", "ring", "ring_in_place", "on_device")
TRANSFER_CONDITIONS = ("idle", "busy", "busy_hot", "busy_steady")  # the guarantees are judged in busy_steady
# Busy states whose verdicts are reported beside the judged busy_steady: both time copies within
# ~1 ms of work queued on an idle GPU (transfer_bench's docstring says why that is a transient).
TRANSFER_REPORTED_BUSY = ("busy_hot", "busy")
CHUNK_MS = (160, 320, 640, 1280)  # single-stream latency rows
SHIPPED_CHUNK_MS = SHIPPED_ENCODER_CONFIG.chunk_size * SHIPPED_ENCODER_CONFIG.time_reduction * FRAME_MS  # 320 ms
LEFT_CONTEXT_MS = SHIPPED_CHUNK_MS * SHIPPED_ENCODER_CONFIG.left_chunk  # 1280 ms of left context at every chunk size
PHI4MM_FULL_CHUNK_MS = 1280  # full-size Phi-4MM in the pipeline and throughput: 16 tokens of 80 ms per chunk
PHI4MM_FULL_LEFT_CHUNKS = 4  # 5.12 s of left context (key/value cache: 80 tokens per stream and block)
# (model, path, share of the throughput budget, first N tried): the driver's rows start front-end processes
# per probe; the full-size rows start where they are known to pass, so that their time goes to their limits.
# Below the capacities docs/benchmarks.md commits: probes under them would only spend the row's share (each
# driver probe starts front-end processes). Figures: docs/defaults.md.
FULL_SIZE_SEARCH_START = 8192
SHIPPED_SEARCH_START = 512
THROUGHPUT_RUNS = (
    ("shipped", "driver", 0.05, SHIPPED_SEARCH_START),
    ("phi4mm_full", "encoder_step", 0.15, FULL_SIZE_SEARCH_START),
    ("phi4mm_full", "driver", 0.3, FULL_SIZE_SEARCH_START),
    ("qwen3_asr_0.6b", "encoder_step", 0.15, FULL_SIZE_SEARCH_START),
    ("qwen3_asr_0.6b", "driver", 0.3, FULL_SIZE_SEARCH_START),
)
THROUGHPUT_ROWS = tuple(f"{name}/{path}" for name, path, *_ in THROUGHPUT_RUNS)  # --rows' names
# The short form (--short): each row probed at these stream counts alone, no search: the capacities that
# docs/benchmarks.md commits (and the aims), checked again on the H200 after a change to the planner, driver,
# streams or front end. Qwen3-ASR's step at 40,960: above its aim. On a device with known limits each full-size
# step is also probed at STEP_LIMIT_AIM of its nearer limit; its driver at DRIVER_SHARE_AIM of the most streams
# its step held in the same run (of the step's aim where the step did not run), the count its verdict needs.
SHORT_COUNTS = {
    ("shipped", "driver"): (2048,),
    ("phi4mm_full", "encoder_step"): (12_288,),
    ("phi4mm_full", "driver"): (10_240,),
    ("qwen3_asr_0.6b", "encoder_step"): (20_480, 40_960),
    ("qwen3_asr_0.6b", "driver"): (10_240, 17_408),
}
FULL_SIZE_MODELS = ("phi4mm_full", "qwen3_asr_0.6b")
PIPELINE_MODELS = ("shipped", "phi4mm_full")  # the Phi-4MM models (the pipeline section's chunking is theirs)
# In-phase streams' chunks all arrive at once: with lanes the first lane's step starts after
# an eighth of the front end's time, and the later lanes' features are computed during the steps.
DRIVER_LANES = 8
STREAMS_AIM = 10_000  # the aim: concurrent real-time streams of each full-size encoder on one H200
DRIVER_SHARE_AIM = 0.8  # the aim: a full-size encoder's driver capacity over its encoder step's
STEP_LIMIT_AIM = 0.9  # the aim: a full-size encoder step's capacity over the nearer of its compute and memory limits


@dataclass(frozen=True)
class RunSettings:
    """Everything a run's size depends on (``FULL`` or ``QUICK``); recorded in the report."""

    seconds: float  # time budget of all sections together
    transfer_sizes: tuple[int, ...]  # bytes per payload
    transfer_repeats: transfer_bench.Repeats
    latency_models: tuple[str, ...]
    latency_chunks: int  # chunks per single-stream row (the first is the first partial)
    pipeline_cycles: int
    pipeline_repeats: int
    pipeline_max_batch: int
    probe: ProbePlan
    max_streams: int
    frontend_workers: int | None = None  # the throughput drivers' front-end processes (None: the driver chooses)
    lanes: int = 1  # the throughput drivers' lanes (StreamingDriver over that many streams, a cycle a lane)
    driver_processes: int = 1  # the throughput drivers: that many on the device, one a process, streams shared out
    short: bool = False  # throughput rows probed at SHORT_COUNTS (at most max_streams) alone, no search
    rows: tuple[str, ...] = THROUGHPUT_ROWS  # the throughput section's rows, "model/path"


FULL = RunSettings(
    seconds=420.0,
    transfer_sizes=(16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB),
    transfer_repeats=transfer_bench.Repeats(idle=50, busy=20, steady=50, gpu=5, staging=0, warmup=2),
    latency_models=("shipped", "phi4mm_full"),
    latency_chunks=40,
    # A pipeline's fill and drain (one front-end cycle before the first step, one step after the last
    # front-end cycle) cost a run one cycle of the shorter stage: enough cycles keep that a small part of
    # the 10 % allowance (figures: docs/defaults.md).
    # 96 cycles of 320 ms: one 30.7 s utterance per stream.
    pipeline_cycles=96,
    pipeline_repeats=5,
    pipeline_max_batch=4096,
    probe=ProbePlan(warmup=0, chunks=8),
    max_streams=65_536,
)
QUICK = RunSettings(
    seconds=50.0,
    transfer_sizes=(16 * KiB, 256 * KiB, 1 * MiB),
    transfer_repeats=transfer_bench.Repeats(idle=8, busy=3, steady=3, gpu=2, staging=0, warmup=1),
    latency_models=("shipped",),
    latency_chunks=3,
    pipeline_cycles=4,
    pipeline_repeats=1,
    pipeline_max_batch=2,
    probe=ProbePlan(warmup=0, chunks=2),
    max_streams=2,
)


class Models:
    """Each model built once, on first use."""

    def __init__(self, device: torch.device, quick: bool) -> None:
        self.device, self.quick = device, quick
        self._built: dict[str, BenchModel] = {}

    def __getitem__(self, name: str) -> BenchModel:
        self.build([name])
        return self._built[name]

    def build(self, names: Sequence[str]) -> None:
        """Build the models of ``names`` not built yet."""
        for name in names:
            if name not in self._built:
                log(f"building {name} on {self.device}")
                self._built[name] = build_model(name, self.device, quick=self.quick)

    def info(self) -> dict[str, dict]:
        return {name: model.info() for name, model in self._built.items()}


def streaming_chunking(model: BenchModel) -> tuple[int, int]:
    """``(chunk_size, left_chunk)`` a Phi-4MM model streams with in the pipeline and throughput sections.

    The full-size encoder: :data:`PHI4MM_FULL_CHUNK_MS` and :data:`PHI4MM_FULL_LEFT_CHUNKS`; others
    their config's, or the shipped architecture's where the config has none (full attention).
    """
    config = model.asr.encoder.config
    if model.name == "phi4mm_full":
        return PHI4MM_FULL_CHUNK_MS // (FRAME_MS * config.time_reduction), PHI4MM_FULL_LEFT_CHUNKS
    if config.chunk_size >= 1:
        return config.chunk_size, config.left_chunk
    return SHIPPED_ENCODER_CONFIG.chunk_size, SHIPPED_ENCODER_CONFIG.left_chunk


def transfer_section(settings: RunSettings, device: torch.device, budget: Budget, notes: list[str]) -> list[dict]:
    """One entry per strategy, size and GPU state; sizes the budget cannot reach are skipped with a note."""
    cuda = device.type == "cuda"
    names = TRANSFER_STRATEGIES if cuda else transfer_bench.CPU_STRATEGIES
    if not cuda:
        notes.append(
            "transfer: no CUDA, so the device is the CPU: pageable and pin_per_copy (host->device copies) "
            "are skipped, the GPU is never busy, and ring / ring_in_place are host copies"
        )
    rng = np.random.default_rng(0)
    strategies = transfer_bench.make_strategies(device, default_ring(device), rng)
    entries: list[dict] = []
    gc.collect()
    gc.disable()  # no collector pauses inside timed loops
    try:
        for size in settings.transfer_sizes:
            if budget.expired():
                notes.append(f"transfer: out of time before {size} bytes; larger sizes skipped")
                break
            case = transfer_bench.make_case(size, rng)
            entries += transfer_bench.measure(
                [case],
                names,
                strategies,
                settings.transfer_repeats,
                transfer_bench.BUSY_MS,
                device,
                conditions=TRANSFER_CONDITIONS,
                end_to_end=True,
            )
            log(f"  transfer {size} bytes done")
    finally:
        gc.enable()
    return entries


def latency_section(
    settings: RunSettings, models: Models, budget: Budget, notes: list[str], names: Sequence[str]
) -> list[dict]:
    rows = []
    for name in names:
        for chunk_ms in CHUNK_MS:
            if budget.expired():
                notes.append(f"latency: out of time before {name} at {chunk_ms} ms; skipped")
                continue
            left_chunks = max(1, LEFT_CONTEXT_MS // chunk_ms)
            row = measure_latency(models[name], chunk_ms, left_chunks, settings.latency_chunks)
            rows.append(row)
            log(
                f"  latency {name} {chunk_ms} ms: compute p50 {row['compute_ms_p50']:.1f} / "
                f"p99 {row['compute_ms_p99']:.1f} ms, first partial {row['first_partial_ms']:.0f} ms"
            )
    return rows


def throughput_section(settings: RunSettings, models: Models, budget: Budget) -> list[dict]:
    """One row per run of :data:`THROUGHPUT_RUNS`: its search, and how close it came to the device's limits."""
    results = []
    limits: dict[str, EncoderLimits] = {}  # per model, counted once
    step_streams: dict[str, int] = {}  # per model, the most streams its encoder step held in this run
    runs = _throughput_runs(settings)
    shares_left = sum(share for _, _, share, _ in runs)
    for name, path, share, start in runs:
        model = models[name]
        chunking = dict(zip(("chunk_size", "left_chunk"), streaming_chunking(model))) if model.is_phi4mm else {}
        probe, probe_settings = make_probe(
            model,
            path,
            settings.probe,
            **chunking,
            frontend_workers=settings.frontend_workers,
            lanes=settings.lanes,
            driver_processes=settings.driver_processes,
        )
        if name not in limits:  # before the run's budget is set: the count is no part of the search
            limits[name] = EncoderLimits.of(model, probe_settings["chunk_ms"], probe_settings.get("left_chunk"))
        run_budget = Budget(max(budget.left(), 1e-3) * share / shares_left)
        shares_left -= share
        log(f"  throughput {name}/{path}: budget {run_budget.seconds:.0f} s")
        start = min(start, settings.max_streams)
        short_counts = _short_counts(name, path, limits[name], model, step_streams.get(name))
        counts = sorted({min(count, settings.max_streams) for count in short_counts})
        row = search(
            probe,
            probe_settings,
            model.device,
            run_budget,
            settings.max_streams,
            start,
            counts=counts if settings.short else None,
        )
        results.append({**row, **limits[name].row_fields(row)})
        if path == "encoder_step" and row["max_streams"] > 0:
            step_streams[name] = row["max_streams"]
    return results


def _throughput_runs(settings: RunSettings) -> list[tuple[str, str, float, int]]:
    """The runs of :data:`THROUGHPUT_RUNS` that ``settings.rows`` names, in that order."""
    return [run for run, row in zip(THROUGHPUT_RUNS, THROUGHPUT_ROWS) if row in settings.rows]


def _short_counts(
    name: str, path: str, limits: EncoderLimits, model: BenchModel, step_streams: int | None = None
) -> set[int]:
    """The short form's counts of a row: :data:`SHORT_COUNTS`, and for a full-size model on a device with known
    limits the aims: its step at :data:`STEP_LIMIT_AIM` of the step's nearer limit; its driver at
    :data:`DRIVER_SHARE_AIM` of ``step_streams`` (the most streams the step held in this run: the driver's
    verdict compares its capacity with that), or of the step's aim where the step did not run."""
    counts = set(SHORT_COUNTS[name, path])
    nearer = limits.nearer_limit(device_memory_bytes(model.device))
    if name not in FULL_SIZE_MODELS or nearer is None:
        return counts
    step_aim = math.ceil(STEP_LIMIT_AIM * nearer)
    if path == "driver":
        counts.add(math.ceil(DRIVER_SHARE_AIM * (step_streams or step_aim)))
    else:
        counts.add(step_aim)
    return counts


def _check(ok: bool | None, **details: object) -> dict:
    return {"ok": ok, **details}


def verdicts(report: dict) -> dict[str, dict]:
    """The checks of this run's figures (``ok`` None: not measured here, and why).

    Transfer: the guarantees of :func:`audiomask.bench.transfer_verdicts.guarantees` in busy_steady,
    and the in-place p99 bound in the busy states reported beside it.
    """
    found: dict[str, dict] = {}
    if any(e["strategy"] == "pageable" for e in report["transfer"]):
        busy_ms = report["settings"].get("busy_ms_measured", transfer_bench.BUSY_MS)
        found.update(transfer_verdicts.guarantees(report["transfer"], busy_ms, "busy_steady"))
        for condition in TRANSFER_REPORTED_BUSY:
            found.update(transfer_verdicts.in_place_p99(report["transfer"], condition, f"{condition}; reported"))
    elif report["transfer"]:
        found["transfer strategies against each other"] = _check(None, why="needs CUDA (host->device copies)")
    pipeline = report["pipeline"]
    if pipeline:
        found["overlapped pipeline wall within 10% of max(T_cpu, T_gpu) (front end in its own process)"] = _check(
            pipeline["process_within_10pct_of_max_cpu_gpu"],
            ratio=pipeline["process_over_max_of_sums"],
            ratio_to_serial_max=pipeline["process_over_serial_max"],
        )
        found["overlapped pipeline wall within 10% of max(T_cpu, T_gpu) (front end on a thread; reported)"] = _check(
            pipeline["within_10pct_of_max_cpu_gpu"],
            ratio=pipeline["pipelined_over_max_of_sums"],
            ratio_to_serial_max=pipeline["pipelined_over_serial_max"],
        )
    found.update(_throughput_verdicts(report["throughput"]))
    return found


def _throughput_verdicts(rows: list[dict]) -> dict[str, dict]:
    """Full-size rows reported, and the aims of concurrent real-time streams (each with what stops its row)."""
    by_run = {(row["model"], row["path"]): row for row in rows}
    reported = {model for (model, _), row in by_run.items() if row["max_streams"] > 0}
    found = {
        "throughput reported for both full-size configs": _check(
            all(name in reported for name in FULL_SIZE_MODELS), models=sorted(reported)
        )
    }
    phi4mm = {path: row["max_streams"] for (model, path), row in by_run.items() if model == "phi4mm_full"}
    found[f"aim: >= {STREAMS_AIM} concurrent real-time streams of the full-size Phi-4MM encoder"] = _check(
        max(phi4mm.values(), default=0) >= STREAMS_AIM, max_streams=phi4mm
    )
    for model, title in (("phi4mm_full", "full-size Phi-4MM"), ("qwen3_asr_0.6b", "Qwen3-ASR-0.6B")):
        driver, step = by_run.get((model, "driver")), by_run.get((model, "encoder_step"))
        share = driver["max_streams"] / step["max_streams"] if driver and step and step["max_streams"] else None
        ok = None
        if driver is not None:
            ok = driver["max_streams"] >= STREAMS_AIM and (share or 0.0) >= DRIVER_SHARE_AIM
        claim = f"{title} through the driver >= {STREAMS_AIM:,} concurrent real-time streams"
        found[f"{claim} and >= {DRIVER_SHARE_AIM:.0%} of its encoder step's capacity"] = _check(
            ok,
            max_streams=driver and driver["max_streams"],
            of_encoder_step=share,
            limiting_resource=driver and driver.get("limiting_resource"),
        )
        fraction = step and step.get("fraction_of_nearer_limit")
        found[f"{title} encoder step >= {STEP_LIMIT_AIM:.0%} of the nearer of its compute and memory limits"] = _check(
            None if fraction is None else fraction >= STEP_LIMIT_AIM,
            max_streams=step and step["max_streams"],
            of_nearer_limit=fraction,
            nearer_limit=step and step.get("nearer_limit"),
            **({} if fraction is not None else {"why": "no limits known (the CPU, or an unknown device)"}),
        )
    return found


def _models_needed(sections: Sequence[str], settings: RunSettings, pipeline_model: str) -> list[str]:
    """The models the chosen sections measure, in order of first use."""
    needed = [pipeline_model] if "pipeline" in sections else []
    needed += list(settings.latency_models) if "latency" in sections else []
    needed += [name for name, *_ in _throughput_runs(settings)] if "throughput" in sections else []
    return list(dict.fromkeys(needed))


def _write_plots(report: dict, json_path: Path, notes: list[str]) -> list[str]:
    try:
        return plots.write_plots(report, json_path)
    except ImportError:
        notes.append("plots skipped: matplotlib is not installed (pip install 'audiomask[plot]', then --plot FILE)")
        print(notes[-1])
        return []


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="audiomask bench",
        description="The streaming latency benchmark: transfer, pipeline, single-stream latency and concurrent streams.",
    )
    parser.add_argument("--out", type=Path, help="write the JSON report here (and its PNG plots beside it)")
    parser.add_argument("--quick", action="store_true", help="a smoke test of every section (< 1 min on 2 cores)")
    parser.add_argument("--device", default="auto", help="auto (CUDA where available), cpu or cuda[:N]")
    parser.add_argument("--seconds", type=float, help="time budget of all sections (default: 420, quick: 50)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="run only these")
    parser.add_argument("--max-streams", type=int, help="throughput search bound (default: 65536, quick: 2)")
    parser.add_argument(
        "--short",
        action="store_true",
        help="the capacity run's short form: the throughput section alone, each row probed at the stream counts "
        "docs/benchmarks.md commits, no search (~5 min on one H200)",
    )
    parser.add_argument(
        "--frontend-workers", type=int, help="front-end processes of the throughput drivers (default: from the cores)"
    )
    parser.add_argument(
        "--lanes",
        type=int,
        default=DRIVER_LANES,
        help=f"lanes of the throughput drivers: a cycle steps one lane's streams (default: {DRIVER_LANES})",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=THROUGHPUT_ROWS,
        default=list(THROUGHPUT_ROWS),
        help="the throughput section's rows (default: all)",
    )
    parser.add_argument(
        "--driver-processes",
        type=int,
        default=1,
        help="drivers of each throughput driver row, one a process with its own front end, the streams and "
        "cores shared out (as `audiomask serve --replicas` runs them; default: 1)",
    )
    parser.add_argument(
        "--pipeline-model", choices=PIPELINE_MODELS, default="shipped", help="the model of the pipeline section"
    )
    parser.add_argument("--plot", type=Path, metavar="JSON", help="only write the PNG plots of an existing report")
    parser.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    args = parser.parse_args(argv)
    if args.seconds is not None and not args.seconds > 0:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    if args.max_streams is not None and args.max_streams < 1:
        parser.error(f"--max-streams must be >= 1, got {args.max_streams}")
    if args.frontend_workers is not None and args.frontend_workers < 1:
        parser.error(f"--frontend-workers must be >= 1, got {args.frontend_workers}")
    if args.lanes < 1:
        parser.error(f"--lanes must be >= 1, got {args.lanes}")
    if args.driver_processes < 1:
        parser.error(f"--driver-processes must be >= 1, got {args.driver_processes}")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device must be auto, cpu or cuda[:N], got {args.device!r}")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device must be auto, cpu or cuda[:N], got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine (use cpu or auto)")
    if device.type == "cuda":
        if device.index is not None:
            torch.cuda.set_device(device.index)
        device = torch.device("cuda", torch.cuda.current_device())
    args.device = device
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``argv`` without the program name; default ``sys.argv[1:]``); returns the exit status."""
    args = _parse(argv)
    if args.plot is not None:
        report = json.loads(args.plot.read_text())
        notes: list[str] = []
        for path in _write_plots(report, args.plot, notes):
            print(f"wrote {path}")
        return 1 if notes else 0
    began = time.perf_counter()
    device = args.device
    base = QUICK if args.quick else FULL
    settings = replace(
        base,
        seconds=args.seconds or base.seconds,
        max_streams=args.max_streams or base.max_streams,
        frontend_workers=args.frontend_workers,
        lanes=args.lanes,
        driver_processes=args.driver_processes,
        short=args.short,
        rows=tuple(args.rows),
    )
    if args.short:
        args.sections = ["throughput"]
    report: dict = {
        "environment": capture_environment(sys.argv),  # the process's command line: the script or the CLI
        "settings": {
            **asdict(settings),
            "quick": args.quick,
            "device": str(device),
            "sections": args.sections,
            "pipeline_model": args.pipeline_model,
            "chunk_ms": list(CHUNK_MS),
            "left_context_ms": LEFT_CONTEXT_MS,
            "phi4mm_full_chunk_ms": PHI4MM_FULL_CHUNK_MS,
            "phi4mm_full_left_chunks": PHI4MM_FULL_LEFT_CHUNKS,
            "busy_ms": transfer_bench.BUSY_MS,
        },
        "models": {},
        "transfer": [],
        "pipeline": {},
        "latency": [],
        "throughput": [],
        "notes": [],
        "section_seconds": {},
    }
    if args.quick:
        report["notes"].append(
            "--quick: a smoke test of every section (tiny stand-ins, few repetitions), not a measurement"
        )
    if device.type == "cuda":
        report["settings"]["busy_ms_measured"] = QueueFiller(device).measure(transfer_bench.BUSY_MS)
    models = Models(device, args.quick)
    models.build(_models_needed(args.sections, settings, args.pipeline_model))  # before the sections' clocks start
    notes = report["notes"]
    shares_left = sum(SECTION_SHARES[name] for name in args.sections)
    sections_began = time.perf_counter()
    for section in SECTIONS:
        if section not in args.sections:
            continue
        left = settings.seconds - (time.perf_counter() - sections_began)
        budget = Budget(max(left, 1e-3) * SECTION_SHARES[section] / shares_left)
        shares_left -= SECTION_SHARES[section]
        log(f"{section}: budget {budget.seconds:.0f} s")
        started = time.perf_counter()
        if section == "transfer":
            report["transfer"] = transfer_section(settings, device, budget, notes)
        elif section == "pipeline":
            model = models[args.pipeline_model]
            chunk_size, left_chunk = streaming_chunking(model)
            report["pipeline"] = pipeline_section(
                model,
                chunk_size,
                left_chunk,
                settings.pipeline_cycles,
                settings.pipeline_repeats,
                settings.pipeline_max_batch,
                budget,
                pipeline_threads(),
            )
        elif section == "latency":
            report["latency"] = latency_section(settings, models, budget, notes, settings.latency_models)
        else:
            report["throughput"] = throughput_section(settings, models, budget)
        report["section_seconds"][section] = time.perf_counter() - started
        if args.out is not None:  # a run stopped later (a wall-clock limit) still leaves what it measured
            report["models"] = models.info()
            write_result(args.out, report)
    report["models"] = models.info()
    report["verdicts"] = verdicts(report)
    report["seconds"] = time.perf_counter() - began
    print_tables(report)
    print()
    for claim, result in report["verdicts"].items():
        print(f"{claim}: {'n/a' if result['ok'] is None else 'yes' if result['ok'] else 'no'}")
    if args.out is not None and not args.no_plots:
        report["plots"] = _write_plots(report, args.out, notes)
    print(f"\n{report['seconds']:.1f} s")
    if args.out is not None:
        write_result(args.out, report)
    return 0
