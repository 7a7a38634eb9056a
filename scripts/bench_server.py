#!/usr/bin/env python3
"""Load benchmark of ``audiomask serve``: N concurrent WebSocket clients over loopback, the partials' latency.

Usage: python3 scripts/bench_server.py --clients 64 --realtime --out bench/results/server_cpu.json
       python3 scripts/bench_server.py --model llm_0.6b --fixed-tokens 13 --device cuda --clients 1000 --realtime
       python3 scripts/bench_server.py --url ws://127.0.0.1:6006 --clients 2000 --processes 16 --realtime

Each client streams a sample file (``samples/*.wav``, in turn) in messages of
``--message-ms`` over the sherpa-onnx route (``--route wenet``: WeNet's;
``realtime``: OpenAI's Realtime API, 24 kHz PCM16 under server VAD; ``both``:
sherpa-onnx and WeNet, every other client), at real time with ``--realtime`` (else as fast
as the server takes them), starting one after another over ``--ramp-s``; the
clients run as asyncio tasks in ``--processes`` processes. Without ``--url``
the script starts the server (``python -m audiomask serve``, the shipped model
or ``--model``, ``--max-connections`` = the clients) on a free loopback port
and stops it. Several counts (``--clients 1500 1750 2000``, ascending) run
one after another against the same server, each once the previous one's
connections have closed, up to the first that does not *hold*: every final
right and the partials' p99 under one chunk (each count's ``holds``; the
report's ``levels`` and ``most_clients_holding``).

What it checks and measures:

- every final text equals the text the same model gives the file alone (a
  single-stream :class:`~audiomask.asr.recognizer.StreamingRecognizer` with
  the server's chunk settings, on the CPU in float32; with
  ``--reference-on-device``, on the server's device in its dtype with as many
  slots as clients: the server's kernels, for random weights, whose near
  ties may still flip between one stream's steps and the server's);
  a client that got no final result is *lost*. An LLM recogniser (``--model``
  a checkpoint directory, or ``llm_0.6b`` / ``llm_1.7b``: random weights at
  Qwen3-ASR's sizes, bfloat16 on CUDA) has no such reference: its final is
  correct when not empty; run it with ``--fixed-tokens`` (random weights
  never say the end token: ``5 + 4 * chunk seconds`` is what speech gives);
- the latency of each partial result: its arrival time minus the time the
  client sent the message holding the last sample of the chunk that produced
  it. On the sherpa-onnx route that is the chunk in which the partial's
  newest token starts (its token times: the server's own account); on the
  WeNet route, which sends none, the first message after which the
  single-stream reference's text equals it (a text the reference never shows
  is *unmatched*, not timed); an LLM recogniser's k-th partial, from its
  k-th chunk (it sends one every update, its text changed or not). A CTC
  partial that repeats the previous one's text (a segment's end) is not timed;
- the final latency: the final result's arrival minus the end message's sending;
- the started server's CPU seconds (user + system, all its threads) while the
  clients ran, and per second of audio they sent: what a real-time stream
  costs the server's host, the encoder steps included; the same for all the
  server's processes (its WebSocket workers and front-end processes too), and
  the busiest one's cores (near 1: one event loop or interpreter lock bounds it);
- the server's ``/health`` once a second while the clients run (connections,
  streams, steps run, the recent steps' timings): how its steps evolve; and
  the partials' latency per second of the run, by arrival.

The report (``--out``) records the command, date, versions and machine
(:func:`audiomask.bench.environment.capture_environment`), the settings, the
counts, and p50/p90/p99/max of both latencies in milliseconds. Exit status:
0 when every client of every count run got its correct text, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench/ is not installed

from audiomask.constants import SAMPLE_RATE
from bench.gpu_busy import gpu_busy, means_per_span
from bench.server_process import References, cpu_seconds, running_server, single_stream_references, tree_cpu_seconds
from bench.server_process import health as server_health

REPOSITORY = Path(__file__).resolve().parents[1]
MS_PER_S = 1000
PERCENTILES = (50, 90, 99, 100)
ROUTES = {"sherpa": "/", "wenet": "/wenet", "realtime": "/v1/realtime"}
HEALTH_SAMPLE_S = 1.0  # seconds between the server's /health samples while the clients run
# Between counts of clients: the server is idle once IDLE_SAMPLES answers in a row, IDLE_POLL_S apart (a replica
# each, with several), report no connection; IDLE_TIMEOUT_S bounds the wait.
IDLE_SAMPLES, IDLE_POLL_S, IDLE_TIMEOUT_S = 8, 0.25, 120.0
SUMMARY = (
    "clients",
    "most_clients_at_once",
    "correct",
    "lost",
    "wrong",
    "server_cpu_per_audio_s",
    "server_processes_cpu_per_audio_s",
    "partial_latency_ms",
    "final_latency_ms",
    "holds",
)  # what the script prints of each count's run
CLIENT_START_S = 3.0  # seconds the client processes get to start before the first client connects
# --model's random models: the latency benchmark's two full-size ones, and shipped_tiny, the shipped model's
# architecture at tiny widths, whose steps cost next to nothing: a run with it measures the server's own work.
RANDOM_MODELS = ("phi4mm_full", "qwen3_asr_0.6b", "shipped_tiny")


def _arguments(argv: list[str]) -> argparse.Namespace:
    from bench.llm_checkpoints import RANDOM_LLMS  # imports torch: not in the client processes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=[64],
        help="concurrent clients (default 64); several, ascending: one run of each against the same server, "
        "up to the first that does not hold",
    )
    parser.add_argument("--realtime", action="store_true", help="send at real time (default: as fast as taken)")
    parser.add_argument("--url", help="a running server (ws://HOST:PORT); default: start one on loopback")
    parser.add_argument("--route", choices=[*ROUTES, "both"], default="sherpa", help="protocol (default sherpa)")
    parser.add_argument("--processes", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--message-ms", type=int, default=100, help="audio per message, ms (default 100)")
    parser.add_argument("--ramp-s", type=float, default=2.0, help="clients start over this many seconds")
    parser.add_argument("--chunk-ms", type=int, help="the server's chunk (default: the model's)")
    parser.add_argument("--left-chunks", type=int, help="the server's left chunks (default: the model's)")
    parser.add_argument("--device", default="cpu", help="the started server's device (default cpu)")
    parser.add_argument(
        "--model",
        help="the started server's model: a file, an LLM checkpoint directory, a random model of the latency "
        f"benchmark ({', '.join(RANDOM_MODELS)}: saved to a temporary file first; shipped_tiny's steps cost next "
        f"to nothing: the server's own work is measured) or a random LLM recogniser ({', '.join(RANDOM_LLMS)}: "
        "Qwen3-ASR's sizes, saved to a temporary directory; run with --fixed-tokens, as random weights never say "
        "the end token); default: the shipped model",
    )
    parser.add_argument(
        "--fixed-tokens", type=int, help="the started server's --fixed-tokens (an LLM checkpoint's tokens per update)"
    )
    parser.add_argument("--dtype", default="float32", help="the started server's --dtype (default float32)")
    parser.add_argument("--ws-workers", type=int, help="the started server's --ws-workers")
    parser.add_argument("--replicas", type=int, help="the started server's --replicas")
    parser.add_argument(
        "--reference-on-device",
        action="store_true",
        help="compute the reference texts on the server's --device in its --dtype with its slots (its "
        "kernels: for random weights) instead of one CPU stream in float32",
    )
    parser.add_argument("--frontend-workers", type=int, help="the started server's --frontend-workers")
    parser.add_argument("--max-wait-ms", type=int, help="the started server's --max-wait-ms")
    parser.add_argument(
        "--endpoint-silence-s",
        type=float,
        help="the started server's --endpoint-silence-s (0: one segment per connection, as the references are)",
    )
    parser.add_argument(
        "--max-segment-s",
        type=float,
        help="the started server's --max-segment-s (its longest segment: with an LLM, each cut is a final pass; "
        "longer than the streams, no cut)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="each client streams its file this many times over (default 1)"
    )
    parser.add_argument("--token", help="the server's token")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="bound on one client's exchange")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    for name in ("processes", "message_ms", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.clients) < 1 or sorted(set(args.clients)) != args.clients:
        parser.error(f"--clients must be ascending counts >= 1, got {args.clients}")
    return args


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, subprocess.Popen | None]]:
    """``(ws URL, None)`` of ``--url``, or ``(URL, process)`` of a server started here, stopped after."""
    if args.url:
        yield args.url.rstrip("/"), None
        return
    options = {
        "--device": args.device,
        "--max-connections": max(args.clients),
        "--idle-timeout-s": args.timeout_s,
        "--model": args.model,
        "--chunk-ms": args.chunk_ms,
        "--left-chunks": args.left_chunks,
        "--frontend-workers": args.frontend_workers,
        "--ws-workers": args.ws_workers,
        "--replicas": args.replicas,
        "--dtype": None if args.llm else args.dtype,
        "--fixed-tokens": args.fixed_tokens,
        "--max-wait-ms": args.max_wait_ms,
        "--endpoint-silence-s": args.endpoint_silence_s,
        "--max-segment-s": args.max_segment_s,
        "--token": args.token,
    }
    with running_server(options) as served:
        yield served.ws_url, served.process


def _run_clients(audio: dict[str, np.ndarray], jobs: list[dict]) -> list[dict]:
    """Run ``jobs`` (one client each, streaming ``audio[job["name"]]``) as asyncio tasks in this process; their
    outcomes, JSON-ready. Each client process gets the clips once, not once per client, and converts them once
    for the realtime route (at 24 kHz)."""
    from audiomask.constants import SAMPLE_RATE
    from audiomask.serve.client import REALTIME_RATE, stream_audio, to_realtime_rate

    over_realtime = any(job["protocol"] == "realtime" for job in jobs)
    at_24khz = {name: to_realtime_rate(samples) for name, samples in audio.items()} if over_realtime else {}

    async def client(job: dict) -> dict:
        await asyncio.sleep(max(0.0, job["start_at"] - time.time()))
        try:
            result = await stream_audio(
                job["url"],
                at_24khz[job["name"]] if job["protocol"] == "realtime" else audio[job["name"]],
                protocol=job["protocol"],
                message_samples=job["message_samples"],
                realtime=job["realtime"],
                token=job["token"],
                timeout_s=job["timeout_s"],
                sample_rate=REALTIME_RATE if job["protocol"] == "realtime" else SAMPLE_RATE,
            )
        except Exception as error:  # noqa: BLE001 - a lost client is counted and reported, not fatal
            return {"index": job["index"], "error": f"{type(error).__name__}: {error}"}
        return {
            "index": job["index"],
            "text": result.text,
            "partials": result.partials,
            "partial_token_s": result.partial_token_s,
            "partial_segments": result.partial_segments,
            "sent_at": result.sent_at,
            "final_at": result.final_at,
            "latency_final_s": result.final_at - result.done_at,
        }

    async def run_all() -> list[dict]:
        return await asyncio.gather(*(client(job) for job in jobs))

    return asyncio.run(run_all())


def _percentiles(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/max of ``values`` (seconds) in milliseconds; ``None`` without values."""
    if not values:
        return {f"p{p}" if p < 100 else "max": None for p in PERCENTILES}
    points = np.percentile(np.asarray(values) * MS_PER_S, PERCENTILES)
    return {f"p{p}" if p < 100 else "max": round(float(v), 2) for p, v in zip(PERCENTILES, points)}


def _partial_latencies(
    outcome: dict, references: References, name: str, message_samples: int
) -> tuple[list[tuple[float, float, bool]], int, int]:
    """Each timed partial's ``(arrival time, latency, from the last message)`` (s), and the counts of partials
    not timed: in all, and of those because the reference never shows their text.

    A partial is timed from the message holding the last sample of the chunk that produced it. With token
    times (the sherpa-onnx route) that is the chunk in which its newest token starts: the server's own
    account, whatever the reference's tokens (random weights' near ties can move a token by a chunk).
    Without (WeNet) it is the first message after which the single-stream reference shows the partial's
    text. Without a reference (an LLM recogniser: a partial every update, its text changed or not, in order)
    the k-th partial of a segment is timed from the last sample of the segment's chunk k (from the segment's
    start, which the server reports; its final text, an endpoint's, is not a partial and is not timed): exact
    unless two updates of a stream come between two of the server's sweeps (one message for both: later ones
    are then timed from earlier chunks, longer than the truth). A CTC partial whose text is the previous one's
    (a segment's end) is not timed. One timed from the client's last message is its stream's last chunk's (or
    the one before, when it ends in that message): the last, padded chunk can only follow the step of the chunk
    before, so it may wait for two steps.
    """
    first_message: dict[str, int] = {}
    for index, text in enumerate(references.partials[name] if references.partials is not None else ()):
        first_message.setdefault(text, index)
    sent_at = outcome["sent_at"]
    latencies, untimed, unmatched, previous = [], 0, 0, ""
    updates: dict[int, int] = {}  # an LLM's partials so far, per segment
    places = outcome.get("partial_segments") or [None] * len(outcome["partials"])
    for (arrived, text), token_s, place in zip(outcome["partials"], outcome["partial_token_s"], places):
        if text == previous and references.partials is not None:
            untimed += 1
            continue
        previous = text
        if references.partials is None:
            segment, start_s, ends = place if place is not None else (0, 0.0, False)
            if ends:
                untimed += 1
                continue
            chunk = updates[segment] = updates.get(segment, -1) + 1
            last_sample = round((start_s or 0.0) * SAMPLE_RATE) + references.first_block + chunk * references.block - 1
            index = min(last_sample // message_samples, len(sent_at) - 1)
        elif token_s is not None:
            chunk = round(token_s * MS_PER_S) // references.chunk_ms
            last_sample = references.first_block + chunk * references.block - 1
            index = min(last_sample // message_samples, len(sent_at) - 1)  # the last chunk ends in the last one
        else:
            index = first_message.get(text, len(sent_at))
        if index >= len(sent_at):
            untimed, unmatched = untimed + 1, unmatched + 1
        else:
            latencies.append((arrived, arrived - sent_at[index], index == len(sent_at) - 1))
    return latencies, untimed, unmatched


def _latency_by_second(timed: list[tuple[float, float, bool]], outcomes: list[dict]) -> list[dict]:
    """The partials' latency per second of the run (by arrival, from the first message sent; the clients' clock
    is ``time.perf_counter``, one for the whole host): where the tail is (the ramp, steady load, the ends of
    utterances, or periodic stalls)."""
    begin = min((o["sent_at"][0] for o in outcomes if o.get("sent_at")), default=0.0)
    seconds: dict[int, list[float]] = {}
    for arrived, latency, _ in timed:
        seconds.setdefault(int(arrived - begin), []).append(latency)
    return [{"t_s": t, "partials": len(seconds[t]), **_percentiles(seconds[t])} for t in sorted(seconds)]


@contextlib.contextmanager
def _health_samples(url: str) -> Iterator[list[dict]]:
    """A list that fills with the server's ``/health`` every :data:`HEALTH_SAMPLE_S` while the block runs."""
    samples: list[dict] = []
    stop = threading.Event()
    started = time.perf_counter()

    def sample() -> None:
        while not stop.wait(HEALTH_SAMPLE_S):
            body = server_health(url.replace("ws", "http", 1))[1]
            keys = (
                "replica",
                "connections",
                "streams",
                "cycles",
                "chunks",
                "recent_cycles",
            )  # the replica that answered
            samples.append({"t_s": round(time.perf_counter() - started, 2)} | {k: body.get(k) for k in keys})

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def _most_at_once(outcomes: list[dict]) -> int:
    """The most clients streaming at the same time: from each one's first message to its final result."""
    events = sorted(
        (moment, step)
        for outcome in outcomes
        if "error" not in outcome and outcome["sent_at"]
        for moment, step in ((outcome["sent_at"][0], 1), (outcome["final_at"], -1))
    )
    return int(np.cumsum([step for _, step in events]).max(initial=0))


def main(argv: list[str]) -> int:
    args = _arguments(argv)
    from audiomask.audio import load
    from audiomask.llm.checkpoint import is_llm_checkpoint
    from audiomask.serve.client import heard_over_realtime
    from bench.llm_checkpoints import RANDOM_LLMS, random_llm_directory

    audio = {path.name: np.tile(load(path)[0], args.repeat) for path in sorted((REPOSITORY / "samples").glob("*.wav"))}
    message_samples = args.message_ms * SAMPLE_RATE // MS_PER_S
    with contextlib.ExitStack() as stack:
        if args.model in RANDOM_MODELS:
            args.model_name, args.model = args.model, _save_random_model(args.model, args.dtype, stack)
        elif args.model in RANDOM_LLMS:
            args.model_name, args.model = args.model, random_llm_directory(args.model, args.device, stack)
        args.llm = args.model is not None and is_llm_checkpoint(args.model)
        if args.llm:
            from audiomask.llm.policy import DEFAULT_CHUNK_S  # the server's chunk without --chunk-ms

            references = _update_clock(args.chunk_ms or round(DEFAULT_CHUNK_S * MS_PER_S))
        else:
            on_device = {"device": args.device, "dtype": args.dtype, "max_streams": max(args.clients)}
            # Over realtime the server hears the audio resampled to 24 kHz, as int16, and back.
            heard = {name: heard_over_realtime(a) for name, a in audio.items()} if args.route == "realtime" else audio
            references = single_stream_references(
                heard,
                args.model,
                args.chunk_ms,
                args.left_chunks,
                message_samples,
                **(on_device if args.reference_on_device else {}),
            )
        return _measure(args, audio, message_samples, references, argv)


def _update_clock(chunk_ms: int) -> References:
    """An LLM recogniser's :class:`References`: no texts (random weights in bfloat16 have no single-stream
    reference to equal), only when its chunks are complete (a partial per chunk of ``chunk_ms``)."""
    chunk = chunk_ms * SAMPLE_RATE // MS_PER_S
    return References(partials=None, finals=None, chunk_ms=chunk_ms, first_block=chunk, block=chunk)


def _save_random_model(name: str, dtype: str, stack: contextlib.ExitStack) -> str:
    """A file of the latency benchmark's random model ``name``, stored in ``dtype``, removed with ``stack``."""
    import tempfile

    import torch

    from audiomask.asr.checkpoint import save_model
    from audiomask.bench.models import build_model, tiny_shipped_model

    directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="audiomask-bench-model-"))
    path = os.path.join(directory, f"{name}.safetensors")
    model = tiny_shipped_model() if name == "shipped_tiny" else build_model(name, torch.device("cpu")).asr
    save_model(model, path, dtype=getattr(torch, dtype))
    return path


def _measure(args, audio, message_samples, references: References, argv) -> int:
    """Run each count of clients against one server, up to the first that does not hold, and write the report
    (one count: its report; several: each one's under ``levels``); the exit status."""
    from audiomask.bench.environment import capture_environment, write_result

    levels: list[dict] = []
    with _server(args) as (url, server):
        for clients in args.clients:
            if levels:
                _wait_idle(url)
            levels.append(_level(args, clients, url, server, audio, message_samples, references))
            print(json.dumps({key: levels[-1][key] for key in SUMMARY}))
            if not levels[-1]["holds"]:
                break
    report = capture_environment([Path(sys.argv[0]).as_posix(), *argv])
    if len(args.clients) == 1:
        report |= levels[0]
    else:
        holding = [level["clients"] for level in levels if level["holds"]]
        report |= {"levels": levels, "most_clients_holding": max(holding, default=None)}
    if args.out:
        write_result(args.out, report)
    return 0 if all(level["correct"] == level["clients"] for level in levels) else 1


def _wait_idle(url: str) -> None:
    """Wait until the server reports no connection in :data:`IDLE_SAMPLES` answers in a row (each replica's,
    with several), at most :data:`IDLE_TIMEOUT_S`; ``RuntimeError`` past it."""
    deadline, quiet = time.monotonic() + IDLE_TIMEOUT_S, 0
    while quiet < IDLE_SAMPLES:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server still had connections {IDLE_TIMEOUT_S:g} s after the clients ended")
        quiet = quiet + 1 if server_health(url.replace("ws", "http", 1))[1].get("connections") == 0 else 0
        time.sleep(IDLE_POLL_S)


def _level(args, clients: int, url: str, server, audio, message_samples, references: References) -> dict:
    """``clients`` clients against the server at ``url``: the report of their run (settings, counts, latencies,
    the server's CPU and health), ``holds`` when every text is right and the partials' p99 is under a chunk."""
    names = sorted(audio)
    load_average_1m = os.getloadavg()[0]
    protocols = ["sherpa", "wenet"] if args.route == "both" else [args.route]
    begin = time.time() + CLIENT_START_S  # the client processes start first
    jobs = [
        {
            "index": index,
            "name": names[index % len(names)],
            "protocol": protocols[index % len(protocols)],
            "url": url + ROUTES[protocols[index % len(protocols)]],
            "message_samples": message_samples,
            "realtime": args.realtime,
            "token": args.token,
            "timeout_s": args.timeout_s,
            "start_at": begin + index * args.ramp_s / clients,
        }
        for index in range(clients)
    ]
    started = time.perf_counter()
    cpu_before_s = None if server is None else cpu_seconds(server.pid)
    tree_before = None if server is None else tree_cpu_seconds(server.pid)
    spawn = multiprocessing.get_context("spawn")
    clients_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The started server's GPU (its first with several replicas), sampled while the clients run.
    gpu = None if server is None or not args.device.startswith("cuda") else int(args.device.partition(":")[2] or 0)
    with (
        ProcessPoolExecutor(args.processes, mp_context=spawn) as pool,
        _health_samples(url) as samples,
        gpu_busy(gpu) as busy,
    ):
        shares = [jobs[worker :: args.processes] for worker in range(args.processes)]
        done = pool.map(_run_clients, [audio] * len(shares), shares)
        outcomes = [outcome for share in done for outcome in share]
    clients_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool's processes have been reaped
    clients_cpu_s = sum(getattr(clients_after, f) - getattr(clients_before, f) for f in ("ru_utime", "ru_stime"))
    wall_s = time.perf_counter() - started
    health = server_health(url.replace("ws", "http", 1))[1]
    server_cpu_s = None if server is None else cpu_seconds(server.pid) - cpu_before_s
    after = None if server is None else tree_cpu_seconds(server.pid)
    used = None if after is None else {pid: cpu_s - tree_before.get(pid, 0.0) for pid, cpu_s in after.items()}
    tree_cpu_s = None if used is None else sum(used.values())

    lost = [outcome for outcome in outcomes if "error" in outcome]
    audio_s = sum(len(audio[job["name"]]) for job in jobs) / SAMPLE_RATE
    # Without a reference (random LLM weights in bfloat16) a client is correct when its final text is not empty.
    expected = references.finals or {name: "(any text)" for name in names}
    wrong = [
        o
        for o in outcomes
        if "error" not in o
        and (o["text"] != expected[jobs[o["index"]]["name"]] if references.finals else not o["text"])
    ]
    timed_partials, untimed, unmatched, partial_count = [], 0, 0, 0
    for outcome in outcomes:
        if "error" in outcome:
            continue
        name = jobs[outcome["index"]]["name"]
        latencies, not_timed, missing = _partial_latencies(outcome, references, name, message_samples)
        timed_partials += latencies
        untimed, unmatched = untimed + not_timed, unmatched + missing
        partial_count += len(outcome["partials"])
    partial_latency_ms = _percentiles([latency for _, latency, _ in timed_partials])
    correct = clients - len(lost) - len(wrong)
    return {
        "url": args.url,
        "server_health": health,
        # The started server's CPU seconds while the clients ran (its start-up left out), and per second
        # of audio the clients sent: what one real-time stream costs the server's host. With --replicas the
        # started process only watches its replicas: their CPU is in server_processes_cpu_s.
        "server_cpu_s": None if server_cpu_s is None else round(server_cpu_s, 2),
        "audio_s": round(audio_s, 2),
        "server_cpu_per_audio_s": None if server_cpu_s is None else round(server_cpu_s / audio_s, 5),
        # The same with every process of the server: WebSocket workers and front-end processes.
        "server_processes_cpu_s": None if tree_cpu_s is None else round(tree_cpu_s, 2),
        "server_processes_cpu_per_audio_s": None if tree_cpu_s is None else round(tree_cpu_s / audio_s, 5),
        # The most one of those processes used, in cores: near 1, its event loop or interpreter lock is the wall.
        "server_busiest_process_cores": None if used is None else round(max(used.values()) / wall_s, 2),
        "load_average_1m": load_average_1m,  # the machine's load before the run (other work shares the cores)
        # The client processes' CPU seconds (on the same host: what they take, the server cannot use).
        "clients_cpu_s": round(clients_cpu_s, 2),
        "model": getattr(args, "model_name", args.model),
        "fixed_tokens": args.fixed_tokens,
        "reference": "single-stream texts" if references.finals else "none: a final is correct when not empty",
        # An LLM checkpoint's server picks its own: bfloat16 on CUDA, float32 on the CPU.
        "dtype": ("bfloat16" if args.device.startswith("cuda") else "float32") if args.llm else args.dtype,
        "reference_on_device": args.reference_on_device,
        "frontend_workers": args.frontend_workers,
        "ws_workers": args.ws_workers,
        "replicas": args.replicas,
        "clients": clients,
        "processes": args.processes,
        "route": args.route,
        "realtime": args.realtime,
        "message_ms": args.message_ms,
        "ramp_s": args.ramp_s,
        "repeat": args.repeat,
        "max_wait_ms": args.max_wait_ms,
        "endpoint_silence_s": args.endpoint_silence_s,
        "max_segment_s": args.max_segment_s,
        "most_clients_at_once": _most_at_once(outcomes),
        "chunk_ms": references.chunk_ms,
        "samples": {name: round(len(samples) / SAMPLE_RATE, 3) for name, samples in audio.items()},
        "wall_s": round(wall_s, 2),
        "correct": correct,
        "lost": len(lost),
        "wrong": len(wrong),
        "errors": sorted({outcome["error"] for outcome in lost})[:10],
        "wrong_texts": [
            {"file": jobs[o["index"]]["name"], "text": o["text"], "expected": expected[jobs[o["index"]]["name"]]}
            for o in wrong
        ][:10],
        "partials": partial_count,
        # An LLM recogniser's updates (one a whole chunk): a partial each, unless its text did not change or
        # the stream's end came first (its final replaces it); fewer partials than updates time later ones
        # from earlier chunks (see _partial_latencies).
        "updates": None
        if references.finals
        else sum(len(audio[jobs[o["index"]]["name"]]) // references.block for o in outcomes if "error" not in o),
        "partials_untimed": untimed,  # a segment's end (the text unchanged), or unmatched
        "partials_unmatched": unmatched,  # timed by the reference's texts (no token times), which never show it
        "partial_latency_ms": partial_latency_ms,
        # Split by where a partial's chunk ends: before the client's last message, or in it (an utterance's
        # last chunks: the last, padded one may wait for the step of the one before).
        "partials_last_message": sum(last for _, _, last in timed_partials),
        "partial_latency_ms_mid_stream": _percentiles([lat for _, lat, last in timed_partials if not last]),
        "partial_latency_ms_last_message": _percentiles([lat for _, lat, last in timed_partials if last]),
        "partial_latency_ms_by_second": _latency_by_second(timed_partials, outcomes),
        # /health every HEALTH_SAMPLE_S while the clients ran: connections, streams, steps run, and the
        # recent steps' timings (how the server's steps evolve under the load).
        "health_samples": samples,
        # nvidia-smi's utilisation of the server's GPU while the clients ran, the mean of each 10 s.
        "gpu_busy_percent": means_per_span(busy) if gpu is not None else None,
        "final_latency_ms": _percentiles([o["latency_final_s"] for o in outcomes if "error" not in o]),
        # Every text right and the partials' p99 under one chunk.
        "holds": correct == clients and (partial_latency_ms["p99"] or math.inf) < references.chunk_ms,
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
