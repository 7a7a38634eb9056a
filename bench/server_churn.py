"""Connection churn of ``audiomask serve``: thousands of short connections, the server's memory before and after.

A server's memory per connection must be bounded and freed when the
connection ends, however it ends. :func:`run_churn` runs ``cycles``
connections against a running server, ``concurrency`` at a time, each of a
kind drawn with a fixed seed (:data:`KINDS`, equally often):

- ``final``: the sherpa-onnx route ``/``: a clip in 100 ms float32 messages as
  fast as the server takes them, ``Done``, the final result read;
- ``wenet``: the WeNet route ``/wenet``: start signal, the clip as int16 PCM, end signal, the final result read;
- ``close_at_once``: connect, then a close frame at once;
- ``abort``: connect, send the clip, wait a drawn pause (so that the stream is
  sometimes open and fed, sometimes not yet), then drop the TCP connection
  without a close frame;
- ``bad_text``: send one message of audio, then the text ``hello`` (not
  ``Done``): the server must answer with an error and close code 1003.

The clips (:func:`churn_clips`) are the first 0.3, 0.5 and 0.8 s of each
sample file, on int16 levels, so that both routes carry the same samples.
Every final text must equal the clip's reference: the text one recognizer
gives the clip alone (:func:`~bench.server_process.single_stream_references`).

Measured: the server process's RSS, peak RSS (``VmHWM``), threads and open
file descriptors, and its child processes' RSS, from ``/proc`` about every
:data:`SAMPLE_INTERVAL_S` seconds (and, when ``/health`` names a CUDA device,
the memory in use on the GPU of that index, from ``nvidia-smi``, which
numbers the GPUs as ``CUDA_VISIBLE_DEVICES`` does not); the baseline is the
sample taken when the first :data:`WARMUP_FRACTION` of the cycles are done,
the end sample is taken once ``/health`` reports no connection and no stream.
The report gives each figure's growth from the baseline to the end and its
largest rise above the baseline, RSS's slope per 1,000 cycles, the
connections and streams ``/health`` reports at the end (0 and 0 unless a
connection leaked), and per kind the cycles that went as they should, the
wrong finals and the errors (with examples).

:func:`main` is the command line (``scripts/soak_server.py``): it starts the
server (the shipped model) as a subprocess, computes the references, runs
the churn and writes the report; exit status 1 on any wrong final, error,
or connection or stream left::

    python scripts/soak_server.py --cycles 10000 --out bench/results/server_churn_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from audiomask.audio import load
from audiomask.bench.environment import capture_environment, command_output, write_result
from audiomask.bench.timing import MS_PER_S, log, percentiles
from audiomask.checks import check_int
from audiomask.constants import SAMPLE_RATE
from audiomask.serve.client import DEFAULT_MESSAGE_SAMPLES, stream_audio
from audiomask.serve.session import CLOSE_UNSUPPORTED
from bench.server_process import REPOSITORY, health, process_memory, running_server, single_stream_references

__all__ = [
    "CLIP_SECONDS",
    "KINDS",
    "CyclePlan",
    "UnexpectedReplyError",
    "churn_clips",
    "main",
    "plan_cycles",
    "run_churn",
]

SAMPLES = REPOSITORY / "samples"  # the sample files the clips are cut from
KINDS = ("final", "wenet", "close_at_once", "abort", "bad_text")
FINAL_KINDS = frozenset({"final", "wenet"})  # the kinds that end with a final text to check
ROUTES = {"final": "/", "wenet": "/wenet", "close_at_once": "/", "abort": "/", "bad_text": "/"}
CLIP_SECONDS = (0.3, 0.5, 0.8)  # each sample file's first this many seconds is a clip
INT16_FULL_SCALE = 32768  # the clips are rounded to int16 levels: the WeNet route carries them exactly
MESSAGE_SAMPLES = DEFAULT_MESSAGE_SAMPLES  # 100 ms of audio per binary message
ABORT_PAUSE_S = (0.0, 0.2)  # an abort's pause between its last message and the drop, uniformly drawn
BAD_TEXT = "hello"  # a text frame the sherpa-onnx route does not take (only "Done")
WARMUP_FRACTION = 0.1  # of the cycles done when the memory baseline is taken
SAMPLE_INTERVAL_S = 0.5  # between memory samples
CYCLE_TIMEOUT_S = 60.0  # bound on one cycle: a connection that hangs is an error, not a stall
SETTLE_TIMEOUT_S = 30.0  # the server must report no connection and no stream within this after the last cycle
SETTLE_POLL_S = 0.1
DEFAULT_CONCURRENCY = 16
EXAMPLES_KEPT = 10  # wrong finals and errors kept in the report
LOG_EVERY_CYCLES = 1000
CYCLES_PER_SLOPE = 1000  # RSS's slope is reported in bytes per this many cycles
MIB = 2**20  # nvidia-smi reports MiB; the summary prints MiB
# The figures sampled whose growth is reported (gpu_used_bytes only when the server runs on a GPU).
GROWTH_KEYS = ("rss_bytes", "hwm_bytes", "threads", "fds", "children_rss_bytes", "gpu_used_bytes")


@dataclass(frozen=True)
class CyclePlan:
    """One connection of the churn: its index, kind (one of :data:`KINDS`), clip name and abort pause (s)."""

    index: int
    kind: str
    clip: str
    pause_s: float


def churn_clips(paths: Sequence[Path] | None = None) -> dict[str, np.ndarray]:
    """The clips: the first :data:`CLIP_SECONDS` of each file (default ``samples/*.wav``), ``(n,)`` float32 at
    16 kHz on int16 levels, by name (``"hello_world.wav[:0.5s]"``)."""
    paths = sorted(SAMPLES.glob("*.wav")) if paths is None else list(paths)
    if not paths:
        raise ValueError(f"no sample files to cut clips from (looked for *.wav in {SAMPLES})")
    clips = {}
    for path in paths:
        samples = load(path)[0]
        levels = np.clip(np.rint(samples * INT16_FULL_SCALE), -INT16_FULL_SCALE, INT16_FULL_SCALE - 1)
        for seconds in CLIP_SECONDS:
            clips[f"{path.name}[:{seconds:g}s]"] = (levels[: round(seconds * SAMPLE_RATE)] / INT16_FULL_SCALE).astype(
                np.float32
            )
    return clips


def plan_cycles(cycles: int, clip_names: Sequence[str], seed: int = 0) -> list[CyclePlan]:
    """``cycles`` plans: kinds and clips drawn uniformly with ``seed``, and each abort's pause.

    >>> [(plan.kind, plan.clip) for plan in plan_cycles(3, ["a", "b"], seed=1)]
    [('close_at_once', 'b'), ('close_at_once', 'a'), ('abort', 'a')]
    """
    cycles = check_int("cycles", cycles, minimum=1)
    if not clip_names:
        raise ValueError("clip_names must name at least one clip, got none")
    rng = np.random.default_rng(seed)
    kinds = rng.integers(0, len(KINDS), size=cycles)
    clips = rng.integers(0, len(clip_names), size=cycles)
    pauses = rng.uniform(*ABORT_PAUSE_S, size=cycles)
    return [
        CyclePlan(index, KINDS[kind], clip_names[clip], float(pause))
        for index, (kind, clip, pause) in enumerate(zip(kinds, clips, pauses))
    ]


class UnexpectedReplyError(Exception):
    """The server answered a cycle otherwise than its protocol says it must."""


def _float32_messages(samples: np.ndarray) -> list[bytes]:
    """``samples`` ``(n,)`` float32 as the sherpa-onnx route's binary messages of :data:`MESSAGE_SAMPLES`."""
    return [
        np.ascontiguousarray(samples[start : start + MESSAGE_SAMPLES], "<f4").tobytes()
        for start in range(0, len(samples), MESSAGE_SAMPLES)
    ]


async def _cycle(plan: CyclePlan, ws_url: str, samples: np.ndarray) -> str | None:
    """Run ``plan`` on a new connection; the final text of :data:`FINAL_KINDS`, else ``None``.

    Raises whatever went wrong: the connection refused or cut, or :class:`UnexpectedReplyError`.
    """
    url = ws_url + ROUTES[plan.kind]
    if plan.kind in FINAL_KINDS:
        protocol = "wenet" if plan.kind == "wenet" else "sherpa"
        result = await stream_audio(url, samples, protocol=protocol, message_samples=MESSAGE_SAMPLES)
        return result.text
    async with connect(url, proxy=None) as connection:
        if plan.kind == "abort":
            for message in _float32_messages(samples):
                await connection.send(message)
            await asyncio.sleep(plan.pause_s)
            connection.transport.abort()
        elif plan.kind == "bad_text":
            await connection.send(_float32_messages(samples)[0])
            await connection.send(BAD_TEXT)
            replies = []
            with contextlib.suppress(ConnectionClosed):  # closed with an error code: checked below
                async for reply in connection:
                    replies.append(reply)
            if connection.close_code != CLOSE_UNSUPPORTED or not replies or "error" not in json.loads(replies[-1]):
                raise UnexpectedReplyError(
                    f"a text frame {BAD_TEXT!r} got {replies[-1:]} and close code {connection.close_code} "
                    f"(expected an error and {CLOSE_UNSUPPORTED})"
                )
    return None


class _Tally:
    """Per kind: cycles planned, gone as they should, with a wrong final, failed; examples; each cycle's seconds."""

    def __init__(self, plans: Sequence[CyclePlan], expected: Mapping[str, str]) -> None:
        self.expected = expected
        self.kinds = {kind: dict.fromkeys(("planned", "ok", "wrong", "errors"), 0) for kind in KINDS}
        for plan in plans:
            self.kinds[plan.kind]["planned"] += 1
        self.seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.wrong_examples: list[dict] = []
        self.error_examples: list[dict] = []
        self.done = 0

    def completed(self, plan: CyclePlan, text: str | None, seconds: float) -> None:
        self.done += 1
        self.seconds[plan.kind].append(seconds)
        if plan.kind in FINAL_KINDS and text != self.expected[plan.clip]:
            self.kinds[plan.kind]["wrong"] += 1
            if len(self.wrong_examples) < EXAMPLES_KEPT:
                example = {"cycle": plan.index, "kind": plan.kind, "clip": plan.clip, "text": text}
                self.wrong_examples.append(example | {"expected": self.expected[plan.clip]})
            return
        self.kinds[plan.kind]["ok"] += 1

    def failed(self, plan: CyclePlan, error: BaseException) -> None:
        self.done += 1
        self.kinds[plan.kind]["errors"] += 1
        if len(self.error_examples) < EXAMPLES_KEPT:
            message = f"{type(error).__name__}: {error}"
            self.error_examples.append({"cycle": plan.index, "kind": plan.kind, "clip": plan.clip, "error": message})

    def count(self, field: str, kinds: Sequence[str] = KINDS) -> int:
        return sum(self.kinds[kind][field] for kind in kinds)


def _gpu_index(device: object) -> int | None:
    """The GPU index of a ``/health`` device (``"cuda"``, ``"cuda:1"``), or ``None`` for any other device.

    >>> _gpu_index("cuda:1"), _gpu_index("cuda"), _gpu_index("cpu")
    (1, 0, None)
    """
    kind, _, index = str(device).partition(":")
    return (int(index) if index else 0) if kind == "cuda" else None


def _sample(pid: int, gpu: int | None, done: int, started: float) -> dict:
    """The server's :func:`~bench.server_process.process_memory` now (and GPU ``gpu``'s memory in
    use), with the cycles done and the seconds since ``started``; ``RuntimeError`` once the server is gone."""
    memory = process_memory(pid)
    if memory is None:
        raise RuntimeError(f"the server process {pid} has exited")
    sample = {"elapsed_s": round(time.perf_counter() - started, 3), "cycles_done": done, **memory}
    if gpu is not None:
        used_mib = command_output(
            ["nvidia-smi", f"--id={gpu}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        )
        sample["gpu_used_bytes"] = None if used_mib is None else int(used_mib) * MIB
    return sample


async def _settle(http_url: str) -> tuple[dict, float]:
    """``/health``'s body once it reports no connection and no stream, or at :data:`SETTLE_TIMEOUT_S`; and the
    seconds it took."""
    started = time.perf_counter()
    while True:
        body = (await asyncio.to_thread(health, http_url))[1]
        idle = body.get("connections") == 0 and body.get("streams") == 0
        if idle or time.perf_counter() - started > SETTLE_TIMEOUT_S:
            return body, time.perf_counter() - started
        await asyncio.sleep(SETTLE_POLL_S)


def _memory_report(before: dict, warm: dict, end: dict, samples: Sequence[dict]) -> dict:
    """The samples before the churn, at the baseline and at the end; per figure its growth and its largest rise
    above the baseline; RSS's slope over the samples from the baseline on."""
    later = [sample for sample in samples if sample["cycles_done"] >= warm["cycles_done"]] + [end]
    figures = [key for key in GROWTH_KEYS if warm.get(key) is not None and end.get(key) is not None]
    cycles = np.array([sample["cycles_done"] for sample in later], np.float64)
    rss = np.array([sample["rss_bytes"] for sample in later], np.float64)
    slope = float(np.polyfit(cycles, rss, 1)[0]) * CYCLES_PER_SLOPE if np.ptp(cycles) > 0 else None
    return {
        "before": before,
        "after_warmup": warm,
        "end": end,
        "growth_after_warmup": {key: end[key] - warm[key] for key in figures},
        "max_rise_after_warmup": {
            key: max(sample[key] for sample in later if sample.get(key) is not None) - warm[key] for key in figures
        },
        f"rss_slope_bytes_per_{CYCLES_PER_SLOPE}_cycles": None if slope is None else round(slope),
    }


async def _churn(
    ws_url: str,
    pid: int,
    plans: Sequence[CyclePlan],
    audio: Mapping[str, np.ndarray],
    tally: _Tally,
    concurrency: int,
    timeout_s: float,
    warmup_cycles: int,
) -> dict:
    """Run ``plans`` with ``concurrency`` tasks while the memory is sampled; the report's memory and health parts."""
    http_url = ws_url.replace("ws", "http", 1)
    gpu = _gpu_index((await asyncio.to_thread(health, http_url))[1].get("device"))
    started = time.perf_counter()
    before = await asyncio.to_thread(_sample, pid, gpu, 0, started)
    samples: list[dict] = []
    baseline: list[dict] = []
    pending = iter(plans)  # shared by the tasks: each takes the next plan

    async def worker() -> None:
        for plan in pending:
            begun = time.perf_counter()
            try:
                text = await asyncio.wait_for(_cycle(plan, ws_url, audio[plan.clip]), timeout_s)
            except Exception as error:  # noqa: BLE001 - every failed cycle is counted and reported, with its kind
                tally.failed(plan, error)
            else:
                tally.completed(plan, text, time.perf_counter() - begun)
            if tally.done == warmup_cycles:
                baseline.append(await asyncio.to_thread(_sample, pid, gpu, tally.done, started))
            if tally.done % LOG_EVERY_CYCLES == 0:
                log(f"{tally.done}/{len(plans)} cycles, {tally.count('wrong')} wrong, {tally.count('errors')} errors")

    async def sampler() -> None:
        while True:
            samples.append(await asyncio.to_thread(_sample, pid, gpu, tally.done, started))
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    sampling = asyncio.create_task(sampler())
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
    seconds = time.perf_counter() - started
    end_health, settle_s = await _settle(http_url)
    end = await asyncio.to_thread(_sample, pid, gpu, tally.done, started)
    return {
        "seconds": round(seconds, 2),
        "cycles_per_s": round(len(plans) / seconds, 1),
        "health_end": end_health,
        "connections_left": end_health.get("connections"),
        "streams_left": end_health.get("streams"),
        "settle_s": round(settle_s, 2),
        "warmup_cycles": warmup_cycles,
        "memory": _memory_report(before, baseline[0] if baseline else end, end, samples),
        "samples": samples,
    }


def run_churn(
    ws_url: str,
    pid: int,
    audio: Mapping[str, np.ndarray],
    expected: Mapping[str, str],
    cycles: int = 10_000,
    concurrency: int = DEFAULT_CONCURRENCY,
    seed: int = 0,
    *,
    timeout_s: float = CYCLE_TIMEOUT_S,
    warmup_cycles: int | None = None,
) -> dict:
    """Run the churn (the module docstring) against the server at ``ws_url`` (``ws://HOST:PORT``), process ``pid``.

    Args:
        audio: clip name -> ``(n,)`` float32 samples at 16 kHz, on int16 levels (:func:`churn_clips`).
        expected: clip name -> its reference text.
        cycles: connections in all; ``concurrency``: connections at once.
        seed: draws the kinds, clips and pauses (:func:`plan_cycles`).
        timeout_s: bound on one cycle, seconds.
        warmup_cycles: cycles done when the memory baseline is taken (default :data:`WARMUP_FRACTION` of
            ``cycles``, at least 1).

    Returns:
        The report, JSON-ready: per kind ``planned`` / ``ok`` / ``wrong`` / ``errors``, ``finals`` and
        ``correct_finals``, ``connections_left`` and ``streams_left`` (from ``/health`` at the end),
        ``memory`` (before, baseline, end, growth, largest rise, RSS slope), every sample, examples.
    """
    concurrency = check_int("concurrency", concurrency, minimum=1)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    missing = sorted(set(audio) - set(expected))
    if missing:
        raise ValueError(f"expected must hold a text for every clip of audio; missing: {missing}")
    plans = plan_cycles(cycles, sorted(audio), seed)
    if warmup_cycles is None:
        warmup_cycles = max(1, round(WARMUP_FRACTION * len(plans)))
    warmup_cycles = check_int("warmup_cycles", warmup_cycles, minimum=1, maximum=len(plans))
    tally = _Tally(plans, expected)
    churn = _churn(ws_url.rstrip("/"), pid, plans, audio, tally, concurrency, timeout_s, warmup_cycles)
    measured = asyncio.run(churn)
    return {
        "cycles": len(plans),
        "concurrency": concurrency,
        "seed": seed,
        "clips": {name: round(len(samples) / SAMPLE_RATE, 3) for name, samples in audio.items()},
        "expected": dict(expected),
        "message_ms": MESSAGE_SAMPLES * MS_PER_S // SAMPLE_RATE,
        "kinds": tally.kinds,
        "finals": tally.count("ok", FINAL_KINDS) + tally.count("wrong", FINAL_KINDS),
        "correct_finals": tally.count("ok", FINAL_KINDS),
        "wrong": tally.count("wrong"),
        "errors": tally.count("errors"),
        "cycle_s": {kind: percentiles(seconds) for kind, seconds in tally.seconds.items() if seconds},
        "wrong_examples": tally.wrong_examples,
        "error_examples": tally.error_examples,
        **measured,
    }


def _summary(report: dict) -> str:
    """The report's figures in a few lines: counts, what is left, memory in MiB."""
    memory = report["memory"]
    warm, end = memory["after_warmup"], memory["end"]
    lines = [
        f"cycles {report['cycles']} in {report['seconds']} s; per kind: {report['kinds']}",
        f"finals {report['correct_finals']}/{report['finals']} correct; {report['errors']} errors",
        f"left at the end: {report['connections_left']} connections, {report['streams_left']} streams",
        f"RSS after {report['warmup_cycles']} cycles {warm['rss_bytes'] / MIB:.1f} MiB -> end "
        f"{end['rss_bytes'] / MIB:.1f} MiB (largest rise {memory['max_rise_after_warmup']['rss_bytes'] / MIB:+.1f} "
        f"MiB, peak {end['hwm_bytes'] / MIB:.1f} MiB); threads {warm['threads']} -> {end['threads']}, "
        f"fds {warm['fds']} -> {end['fds']}",
    ]
    if "gpu_used_bytes" in memory["growth_after_warmup"]:
        lines.append(f"GPU memory in use: {memory['growth_after_warmup']['gpu_used_bytes'] / MIB:+.1f} MiB")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``argv`` without the program name); 1 on a wrong final, an error, or anything left."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10_000, help="connections in all (default 10000)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"connections at once (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument("--seed", type=int, default=0, help="draws the kinds, clips and pauses (default 0)")
    parser.add_argument("--device", default="cpu", help="the server's device (default cpu)")
    parser.add_argument("--model", help="the server's model file (default: the shipped model)")
    parser.add_argument("--chunk-ms", type=int, help="the server's chunk (default: the model's)")
    parser.add_argument("--left-chunks", type=int, help="the server's left chunks (default: the model's)")
    parser.add_argument("--max-connections", type=int, help="the server's connection limit (default: 2 x concurrency)")
    parser.add_argument("--timeout-s", type=float, default=CYCLE_TIMEOUT_S, help="bound on one cycle, seconds")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    for name in ("cycles", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    # Room for connections the server has not yet seen end: a client's next connection may come first.
    max_connections = args.max_connections or 2 * args.concurrency
    audio = churn_clips()
    expected = single_stream_references(audio, args.model, args.chunk_ms, args.left_chunks, MESSAGE_SAMPLES).finals
    options = {
        "--device": args.device,
        "--model": args.model,
        "--chunk-ms": args.chunk_ms,
        "--left-chunks": args.left_chunks,
        "--max-connections": max_connections,
    }
    with running_server(options) as served:
        log(f"server ready at {served.ws_url} (pid {served.pid}); {args.cycles} cycles, {args.concurrency} at once")
        report = run_churn(
            served.ws_url,
            served.pid,
            audio,
            expected,
            args.cycles,
            args.concurrency,
            args.seed,
            timeout_s=args.timeout_s,
        )
    report = {"device": args.device, "model": args.model, "max_connections": max_connections, **report}
    print(_summary(report))
    if args.out is not None:
        write_result(args.out, capture_environment(sys.argv) | report)
    leftover = report["connections_left"] != 0 or report["streams_left"] != 0
    return 1 if report["wrong"] or report["errors"] or leftover else 0
