#!/usr/bin/env python3
"""Qwen3-ASR streaming through ``LLMStreams`` against the official re-feed recipe: random weights, real sizes.

One JSON report (and ``<out stem>.png`` where matplotlib imports) of four sections:

- ``capacity``: concurrent real-time streams through :class:`~audiomask.llm.streaming.LLMStreams` (one
  slot each; 30 s utterances at random points, chunks due at phases spread over a chunk, their audio fed in
  100 ms pieces as it arrives; the driver updates every due stream in one call): p50/p95/p99 partial latency (chunk due -> partial) per number
  of streams, doubling then bisection to the most whose p99 is under the chunk, for 2 s and 1 s chunks;
  the first partial of one stream alone (its first chunk fed -> its partial).
- ``anchor``: the same for the re-feed recipe on the same model code
  (:class:`~bench.llm_streams.ReFeedStreams`: all features encoded and the whole prompt prefilled every update).
- ``cost``: one stream alone through a long utterance (64 s), both ways: per update its latency (chunk fed ->
  partial), encoder and decoder time (CUDA events on a GPU) and the work counted: encoder frames and
  prefill tokens.
- ``transformers``: the recipe as a user without vLLM runs it, one stream through transformers' processor and
  ``generate`` (:class:`~bench.llm_transformers.TransformersReFeed`, the same random weights saved as a
  checkpoint directory): per update over ``--cost-seconds`` its wall time and prompt tokens, the first
  partial, and the audio after which an update no longer fits in a chunk (one stream stops being real time).

``--model phi4mm`` (Phi-4-multimodal-instruct's sizes) runs ``capacity`` and ``cost`` through
:class:`~bench.llm_streams.ReFeedStreams`, how it streams (its encoder attends over the whole utterance), with
the cost section's updates timed on the host (``host_ms``: chunk fed -> partial, one stream alone).

Every update decodes ``5 + round(4 * chunk_s)`` tokens (``StreamPolicy.fixed_tokens``: random weights never
say the end token); finals (the offline pass at an utterance's end) are not run. Each section stops at
``--max-seconds``. The model is built in memory (:func:`bench.llm_streams.build_model`), bf16 on CUDA; the
attention kernels are the recogniser's own choice (no cuDNN for the encoder: ``audiomask.llm.lm.ATTENTION_BACKENDS``).

Usage (the H200): python3 scripts/bench_llm.py --out bench/results/llm_streams_h200.json
CPU smoke test:   python3 scripts/bench_llm.py --tiny --out /tmp/llm_smoke.json
Phi-4-multimodal: python3 scripts/bench_llm.py --model phi4mm --sections capacity cost --out OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench/ is not installed

import numpy as np
import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.timing import MS_PER_S, Budget, log, percentiles
from audiomask.constants import HOP_LENGTH, SAMPLE_RATE
from audiomask.llm.refeed import SEGMENT_SPAN_FRAMES
from audiomask.llm.streaming import (
    DEFAULT_PASS_SLOTS,
    UPDATE_RESERVE_BYTES,
    UPDATE_RESERVE_BYTES_PER_SLOT,
    StreamPolicy,
)
from bench.llm_streams import (
    SIZES,
    BenchStreams,
    Driver,
    ReFeedStreams,
    build_model,
    fixed_tokens,
    is_phi4mm,
    one_stream,
)

SECTIONS = ("capacity", "anchor", "cost", "transformers")
PHI4MM_SECTIONS = ("capacity", "cost")  # its streams are the re-feed recipe, and transformers' run is Qwen3-ASR's
SEGMENT_WINDOWS = 4  # LLMStreams' default: a 30 s utterance never ends a segment (that would run a final pass)
WARMUP_REPEATS = 2  # untimed first partials before the timed ones
WARMUP_CHUNKS = 4  # untimed updates of one stream before any section (kernels loaded, allocator warm)
# Defaults of the real sizes (an H200 run of all sections in 4-7 minutes) and of --tiny (a CPU smoke run).
DEFAULTS = {
    "full": dict(start_streams=64, max_streams=4096, seconds=30.0, warm_s=2.0, measure_s=6.0, max_seconds=180.0)
    | dict(cost_seconds=64.0, first_repeats=10),
    "tiny": dict(start_streams=2, max_streams=16, seconds=12.0, warm_s=1.0, measure_s=4.0, max_seconds=30.0)
    | dict(cost_seconds=24.0, first_repeats=3),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON report (a PNG beside it)")
    parser.add_argument(
        "--model", choices=sorted(SIZES), default="0.6b", help="Qwen3-ASR size, or Phi-4-multimodal (random weights)"
    )
    parser.add_argument("--tiny", action="store_true", help="--model tiny and small counts: a CPU smoke run")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--chunks", type=float, nargs="+", default=[2.0, 1.0], help="capacity chunk seconds")
    parser.add_argument("--anchor-chunks", type=float, nargs="+", default=[2.0], help="anchor chunk seconds")
    parser.add_argument("--cost-chunk", type=float, default=2.0, help="the cost section's chunk seconds")
    parser.add_argument("--seconds", type=float, help="utterance seconds (streams restart after it)")
    parser.add_argument("--start-streams", type=int, help="the search's first level")
    parser.add_argument("--max-streams", type=int, help="the search's last level (CUDA: also what memory holds)")
    parser.add_argument("--warm-s", type=float, help="seconds of each level before latencies count")
    parser.add_argument("--measure-s", type=float, help="seconds of each level whose latencies count")
    parser.add_argument("--max-seconds", type=float, help="wall-time budget of each section")
    parser.add_argument("--cost-seconds", type=float, help="the cost section's utterance seconds")
    parser.add_argument("--first-repeats", type=int, help="timed first partials at one stream")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--eager-decode", action="store_true", help="decode steps eagerly, not from CUDA graphs")
    parser.add_argument(
        "--frontend-workers",
        type=int,
        default=0,
        help="push the streams' audio through the front end in N processes (default 0: threads)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    args.cuda_graphs = False if args.eager_decode else None  # LLMStreams' default: graphs on a CUDA device
    if args.tiny:
        args.model = "tiny"
    if is_phi4mm(args.model) and not set(args.sections) <= set(PHI4MM_SECTIONS):
        parser.error(f"--model {args.model} runs the sections {', '.join(PHI4MM_SECTIONS)}, got {args.sections}")
    for name, value in DEFAULTS["tiny" if "tiny" in args.model else "full"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def policy_for(chunk_s: float, segment_windows: int = SEGMENT_WINDOWS) -> StreamPolicy:
    """The recipe's policy with :func:`~bench.llm_streams.fixed_tokens` per update."""
    return StreamPolicy(chunk_s=chunk_s, fixed_tokens=fixed_tokens(chunk_s), segment_windows=segment_windows)


def first_partials(streams: BenchStreams, repeats: int) -> dict:
    """Milliseconds from a new utterance's first chunk fed to its partial, one stream alone, over ``repeats``."""
    size = streams.policy.chunk_samples
    signal = np.random.default_rng(1).standard_normal(size).astype(np.float32) * 0.1
    streams.open("first")
    times = []
    for index in range(WARMUP_REPEATS + repeats):
        elapsed = one_update(streams, "first", signal)
        if index >= WARMUP_REPEATS:
            times.append(elapsed)
        streams.restart("first")
    streams.drop("first")
    return {"repeats": repeats, **percentiles(times)}


def one_update(streams: BenchStreams, name: str, samples: np.ndarray) -> float:
    """Milliseconds of one update of stream ``name`` fed ``samples`` (update() returns host token lists: synced)."""
    if streams.model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    streams.feed(name, samples)
    streams.update([name])
    return (time.perf_counter() - start) * MS_PER_S


def release(device: str) -> None:
    """Give back the device memory of streams no longer referenced."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def slots_for(model: object, cls: type, policy: StreamPolicy, args: argparse.Namespace) -> tuple[int, str, int, int]:
    """``(slots, why so many, kv bytes per slot, slot positions)`` of ``cls`` streams: ``--max-streams``, or what
    CUDA memory holds."""
    probe = cls(model, 1, policy=policy)
    capacity = probe.capacity
    per_slot = model.lm.cache_slot_bytes(capacity)
    del probe
    release(args.device)
    if torch.device(args.device).type == "cuda":  # LLMStreams' own check: what its updates need beside the cache
        fits = model.lm.cache_slots_fitting(capacity, UPDATE_RESERVE_BYTES, UPDATE_RESERVE_BYTES_PER_SLOT)
        fits -= DEFAULT_PASS_SLOTS
        if fits < args.max_streams:
            return max(1, fits), "memory", per_slot, capacity
    return args.max_streams, "max_streams", per_slot, capacity


def search(
    driver: Driver,
    start: int,
    max_streams: int,
    warm_s: float,
    measure_s: float,
    budget: Budget,
    cap: str = "max_streams",
    resolution: float = 0.125,
) -> dict:
    """The most streams ``driver`` holds (p99 partial latency under a chunk): doubling from ``start`` (at most
    ``max_streams``), then bisection to ``resolution``; ``limit`` says what stopped it: ``latency``, ``cap`` (why
    ``max_streams`` is the most: ``max_streams`` or ``memory``), ``memory`` (out of memory) or ``budget``."""
    levels: list[dict] = []
    passed, failed, limit = 0, None, None
    level_s = warm_s + measure_s + 2 * driver.chunk_s

    def run(count: int) -> bool:
        nonlocal limit
        try:
            grow_s = driver.grow(count)
            level = driver.episode(count, warm_s, measure_s, abort_lag_s=max(3 * driver.chunk_s, 1.0))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            limit = "memory"
            levels.append({"streams": count, "passed": False, "error": "CUDA out of memory"})
            return False
        level["grow_s"] = grow_s
        levels.append(level)
        latency = level.get("latency_ms", {"p50": float("nan"), "p99": float("nan")})
        verdict = "pass" if level["passed"] else "FAIL"
        times = f"p50 {latency['p50']:.0f} ms, p99 {latency['p99']:.0f} ms"
        log(f"  {count} streams: {times}, {verdict} ({grow_s:.0f} s to grow)")
        return level["passed"]

    count = start
    while True:
        if count > max_streams:
            count = max_streams if passed < max_streams else 0
        if not count:
            limit = cap
            break
        if budget.left() < level_s:
            limit = "budget"
            break
        if not run(count):
            failed = count
            break
        passed, count = count, count * 2
    while limit is None and failed is not None and failed - passed > max(1, resolution * passed):
        if budget.left() < level_s:
            limit = "budget"
            break
        middle = (passed + failed) // 2
        if run(middle):
            passed = middle
        elif limit is None:
            failed = middle
    return {"levels": levels, "max_streams": passed, "first_failing": failed, "limit": limit or "latency"}


def streams_section(model: object, cls: type, chunks: list[float], args: argparse.Namespace) -> dict:
    """Per chunk size: the first partial of one stream alone, then the search for the most streams."""
    section = Budget(args.max_seconds)
    results = {}
    for position, chunk_s in enumerate(chunks):
        budget = Budget(max(1.0, section.left() / (len(chunks) - position)))
        policy = policy_for(chunk_s)
        log(f"{cls.__name__}, {chunk_s:g} s chunks ({policy.fixed_tokens} tokens an update)")
        first = first_partials(cls(model, 1, policy=policy, cuda_graphs=args.cuda_graphs), args.first_repeats)
        slots, cap, per_slot, capacity = slots_for(model, cls, policy, args)
        streams = cls(model, slots, policy=policy, cuda_graphs=args.cuda_graphs, frontend_workers=args.frontend_workers)
        driver = Driver(streams, args.seconds, seed=args.seed)
        found = search(driver, min(args.start_streams, slots), slots, args.warm_s, args.measure_s, budget, cap=cap)
        streams.close()  # the front end's threads or processes
        del driver, streams
        release(args.device)
        log(f"  most streams: {found['max_streams']} ({found['limit']}); first partial {first['p50']:.0f} ms")
        results[f"{chunk_s:g}s"] = {
            "chunk_s": chunk_s,
            "fixed_tokens": policy.fixed_tokens,
            "slot_positions": capacity,
            "kv_bytes_per_slot": per_slot,
            "slots": slots,
            "first_partial_ms": first,
            **found,
        }
    return results


def cost_section(model: object, args: argparse.Namespace) -> dict:
    """One stream of ``--cost-seconds``, incremental and re-feed: per update times and counted work (a
    Phi-4-multimodal: re-feed only, its updates timed on the host)."""
    phi4mm = is_phi4mm(args.model)
    window_frames = SEGMENT_SPAN_FRAMES if phi4mm else model.encoder.config.n_window_infer
    policy = policy_for(args.cost_chunk, int(args.cost_seconds // (window_frames * HOP_LENGTH / SAMPLE_RATE)) + 1)
    result: dict = {"chunk_s": args.cost_chunk, "seconds": args.cost_seconds}
    result["segment_windows"] = policy.segment_windows
    for label, cls in (("incremental", BenchStreams), ("refeed", ReFeedStreams))[phi4mm:]:
        log(f"cost: {label}, {args.cost_seconds:g} s at {args.cost_chunk:g} s chunks")
        streams = cls(model, 1, policy=policy, cuda_graphs=args.cuda_graphs)
        one_stream(streams, 3 * args.cost_chunk, seed=args.seed)  # warm-up
        result[label] = one_stream(streams, args.cost_seconds, probe=not phi4mm, seed=args.seed)
    return result


def transformers_section(args: argparse.Namespace, device: str, dtype: torch.dtype) -> dict:
    """One stream of the recipe through transformers over ``--cost-seconds`` at ``--cost-chunk`` chunks."""
    import tempfile

    from bench.llm_checkpoints import save_random_qwen3_asr, speech
    from bench.llm_transformers import TransformersReFeed, refeed_updates

    policy = policy_for(args.cost_chunk)
    log(f"transformers: one stream, {args.cost_seconds:g} s at {args.cost_chunk:g} s chunks")
    with tempfile.TemporaryDirectory(prefix="audiomask-bench-llm-") as directory:
        save_random_qwen3_asr(Path(directory), args.model, device=device, seed=args.seed)
        reference = TransformersReFeed(Path(directory), policy, device, dtype)
        refeed_updates(reference, speech(WARMUP_CHUNKS * args.cost_chunk, args.seed))  # warm-up
        reference = TransformersReFeed(Path(directory), policy, device, dtype)
        rows = refeed_updates(reference, speech(args.cost_seconds, args.seed))
    del reference
    release(device)
    late = next((row["audio_s"] for row in rows if row["ms"] >= args.cost_chunk * MS_PER_S), None)
    return {
        "chunk_s": args.cost_chunk,
        "fixed_tokens": policy.fixed_tokens,
        "dtype": str(dtype).removeprefix("torch."),
        "first_partial_ms": rows[0]["ms"],
        "real_time_until_s": late,  # the audio at the first update that took a chunk or longer; None: never
        "updates": rows,
    }


def describe_model(model: object, args: argparse.Namespace, dtype: torch.dtype) -> dict:
    family = "Phi-4-multimodal" if is_phi4mm(args.model) else "Qwen3-ASR"
    parts = model.prompt("", None)
    prompt = f"head {len(parts.head)}, tail {len(parts.tail)} tokens"
    modules = (model.encoder, model.projector, model.lm)
    parameters = {p.data_ptr(): p.numel() for module in modules for p in module.parameters()}
    lm = {k: v for k, v in dataclasses.asdict(model.lm.config).items() if k != "inv_freq"}
    return {
        "size": args.model,
        "weights": "random: normal(0, 0.02) matrices, zero biases (no checkpoint)",
        "parameters": sum(parameters.values()),
        "encoder": dataclasses.asdict(model.encoder.config),
        "projector": [[m.in_features, m.out_features] for m in model.projector.modules() if hasattr(m, "in_features")],
        "lm": lm | {"rope_theta": SIZES[args.model]["text"]["rope_parameters"]["rope_theta"]},
        "dtype": str(dtype).removeprefix("torch."),
        "tokenizer": f"bench.llm_checkpoints.byte_tokenizer: a byte-level BPE of the model's {len(model.tokenizer)} "
        f"ids (words of letters); answers re-encode to their ids; {family}'s chat template ({prompt})",
    }


def summarize(report: dict) -> dict:
    summary: dict = {}
    for section in ("capacity", "anchor"):
        for chunk, entry in report.get(section, {}).items():
            summary[f"{section}_{chunk}"] = {
                "max_streams": entry["max_streams"],
                "limit": entry["limit"],
                "first_partial_ms_p50": entry["first_partial_ms"]["p50"],
            }
    recipe = report.get("transformers")
    if recipe:
        summary["transformers_one_stream"] = {
            "first_partial_ms": recipe["first_partial_ms"],
            "last_update_ms": recipe["updates"][-1]["ms"],
            "last_update_audio_s": recipe["updates"][-1]["audio_s"],
            "real_time_until_s": recipe["real_time_until_s"],
        }
    cost = report.get("cost")
    if cost:
        labels = [label for label in ("incremental", "refeed") if label in cost]
        for label in labels:
            summary[f"one_stream_{label}_ms"] = percentiles([row["host_ms"] for row in cost[label]])
        last = {label: cost[label][-1] for label in labels}
        fields = ("host_ms", "encoder_ms", "decoder_ms", "encoder_frames", "prefill_tokens")
        summary["cost_last_update"] = {
            "audio_s": last[labels[0]]["audio_s"],
            **{f"{label}_{field}": row[field] for label, row in last.items() for field in fields if field in row},
        }
    return summary


def plot(report: dict, path: Path) -> Path | None:
    """p99 latency against streams (capacity, anchor); one stream's time and work per update (cost).

    ``None`` where matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter, ScalarFormatter
    except ImportError:
        return None
    figure, (levels_axes, time_axes, work_axes) = plt.subplots(1, 3, figsize=(15.0, 4.2))
    for section, style in (("capacity", "-"), ("anchor", "--")):
        for chunk, entry in report.get(section, {}).items():
            rows = sorted((r for r in entry["levels"] if "latency_ms" in r), key=lambda r: r["streams"])
            label = f"{'incremental' if section == 'capacity' else 're-feed'} {chunk}"
            x, y = [r["streams"] for r in rows], [r["latency_ms"]["p99"] for r in rows]
            levels_axes.plot(x, y, style, marker="o", label=label)
            levels_axes.axhline(entry["chunk_s"] * MS_PER_S, color="grey", linewidth=0.5)
    levels_axes.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="p99 partial latency (ms)")
    levels_axes.xaxis.set_major_formatter(ScalarFormatter())
    levels_axes.xaxis.set_minor_formatter(NullFormatter())
    for label, style in (("incremental", "-"), ("refeed", "--")):
        rows = report.get("cost", {}).get(label, [])
        x = [row["audio_s"] for row in rows]
        if rows and "encoder_ms" not in rows[0]:  # timed on the host only (a Phi-4-multimodal)
            time_axes.plot(x, [r["host_ms"] for r in rows], style, label=f"{label}: chunk fed -> partial")
            continue
        time_axes.plot(x, [r["encoder_ms"] + r["decoder_ms"] for r in rows], style, label=f"{label}: total")
        time_axes.plot(x, [r["encoder_ms"] for r in rows], style, label=f"{label}: encoder")
        work_axes.plot(x, [r["prefill_tokens"] for r in rows], style, label=f"{label}: prefill tokens")
        work_axes.plot(x, [r["encoder_frames"] / 10 for r in rows], style, label=f"{label}: encoder frames / 10")
    recipe = report.get("transformers", {}).get("updates", [])
    if recipe:
        x = [row["audio_s"] for row in recipe]
        time_axes.plot(x, [row["ms"] for row in recipe], ":", label="re-feed through transformers: wall")
    time_axes.set(xlabel="audio in the utterance (s)", ylabel="ms per update, one stream", ylim=(0, None))
    work_axes.set(xlabel="audio in the utterance (s)", ylabel="work per update, one stream", ylim=(0, None))
    for axes in (levels_axes, time_axes, work_axes):
        if axes.lines:
            axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if "tiny" in args.model:
        torch.set_num_threads(1)  # a toy model gains nothing from threads, whose spinning slows a shared CPU
    report: dict = {"environment": capture_environment([sys.argv[0], *argv])}
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report["settings"] = settings | {"segment_windows": SEGMENT_WINDOWS, "finals": "not run"}
    log(f"building {args.model} (random weights) on {device} in {dtype}")
    model = build_model(args.model, device, dtype, seed=args.seed)
    report["model"] = describe_model(model, args, dtype)
    log(f"{report['model']['parameters'] / 1e6:.0f}M parameters")
    streams = ReFeedStreams if is_phi4mm(args.model) else BenchStreams  # how the model streams
    warmup = policy_for(args.cost_chunk)
    one_stream(streams(model, 1, policy=warmup), WARMUP_CHUNKS * warmup.chunk_s, seed=args.seed)
    sections = {
        "capacity": lambda: streams_section(model, streams, args.chunks, args),
        "anchor": lambda: streams_section(model, ReFeedStreams, args.anchor_chunks, args),
        "cost": lambda: cost_section(model, args),
        "transformers": lambda: transformers_section(args, str(device), dtype),
    }
    for name, run in sections.items():
        if name in args.sections:
            report[name] = run()
            report["summary"] = summarize(report)
            write_result(args.out, report)  # after each section: a run cut short keeps those done
    if not args.no_plot:
        written = plot(report, args.out.with_suffix(".png"))
        log(f"wrote {written}" if written else "no plot: matplotlib is not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
