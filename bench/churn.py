"""Churn soak of :class:`~audiomask.asr.recognizer.StreamingRecognizer`: thousands of streams, several threads.

One recognizer (the shipped model, :func:`~audiomask.asr.checkpoint.load_model`)
serves ``streams`` streams opened in a random order by ``threads`` threads.
Each thread keeps up to ``open_per_thread`` of its streams open at once and
advances one of them, chosen at random, a step at a time (open, one
``accept``, ``input_finished``, ``finish``), so that opening, feeding and
finishing of many streams interleave within and across threads. By default
the threads keep at most ``max_streams`` streams open in all (or one each):
a thread blocked in ``finish()`` of a stream that waits for a free slot
while its own other streams hold slots would wait for itself, so more open
streams than slots, several per thread, can stall until ``finish`` times out
whatever the recognizer does. Each stream has a kind, drawn with a fixed
seed (:data:`KINDS`):

- ``normal``: the clip fed in random piece sizes at full speed, then ``finish``;
- ``slow``: fed in small pieces with short sleeps between them, then ``finish``;
- ``never_fed_finish``: opened, then finished without audio;
- ``never_fed_drop``: opened, then its handle deleted;
- ``dropped``: part of the clip fed, then its handle deleted mid-utterance;
- ``input_finished``: fed at full speed, ``input_finished()``, then ``finish``.

The audio is :data:`CLIPS` synthetic speech-like clips
(:func:`~audiomask.bench.signals.speech_like`, 0.3-2 s), reused, so that
the reference texts are cheap: each clip transcribed alone by a fresh
recognizer of the same settings, one stream at a time. Every finished
stream's text must equal its clip's reference (a stream finished without
audio: the text of an empty stream), and every ``partial()`` taken on the
way must be a prefix of it.

Recorded: streams per kind and what became of them, mismatches, errors (with
examples), the wall time of every ``finish`` and its excess over the same
clip's finish alone (a stream that waited for another stream's audio shows
up there; the slowest finishes are listed with their kind and when they
came), and the memory: RSS, and on CUDA ``torch.cuda.memory_allocated`` and
the pinned host allocator's bytes, sampled about once a second and at the
end, beside the handles the threads hold and the handles still alive (more
alive than held: something keeps dropped or finished streams); the growth
is measured from the moment the first :data:`WARMUP_FRACTION` of the
streams are done.

:func:`run_churn` returns the report; :func:`main` is the command line
(``scripts/soak_streams.py``), which exits 1 on any mismatch or error::

    python scripts/soak_streams.py --streams 10000 --threads 8 --out bench/results/churn_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from audiomask.asr.checkpoint import load_model
from audiomask.asr.recognizer import RecognizerStream, StreamingRecognizer
from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.signals import speech_like
from audiomask.bench.timing import MS_PER_S, log, percentiles
from audiomask.checks import check_int
from audiomask.constants import SAMPLE_RATE
from bench.soak import rss_bytes

__all__ = ["KINDS", "StreamPlan", "main", "memory_snapshot", "plan_streams", "reference_texts", "run_churn"]

KINDS = ("normal", "slow", "never_fed_finish", "never_fed_drop", "dropped", "input_finished")
KIND_WEIGHTS = (0.35, 0.15, 0.1, 0.1, 0.15, 0.15)  # how often each kind is drawn, in the order of KINDS
FED_KINDS = frozenset({"normal", "slow", "dropped", "input_finished"})
DROPPED_KINDS = frozenset({"never_fed_drop", "dropped"})  # their handles are deleted, never finished
CLIPS = 12  # distinct clips, reused by every stream
CLIP_SECONDS = (0.3, 2.0)  # the clips' durations, evenly spaced over this range
PIECE_MS = (5.0, 500.0)  # audio per accept() at full speed, uniformly drawn
SLOW_PIECE_MS = (20.0, 100.0)  # audio per accept() of a slow stream
SLOW_PAUSE_S = (0.005, 0.05)  # a slow stream's sleep after each piece: about twice real time
DROP_FRACTION = (0.1, 0.9)  # of its clip a dropped stream is fed before its handle goes
PARTIAL_PROBABILITY = 0.2  # after each piece, partial() is read with this probability
WARMUP_FRACTION = 0.1  # of the streams done before the memory baseline is taken
SAMPLE_INTERVAL_S = 1.0  # between memory samples
FINISH_TIMEOUT_S = 60.0  # finish(timeout=...): a stream that cannot finish is an error, not a hang
MAX_ERRORS = 50  # after this many errors no more streams are opened (the run is reported as aborted)
REFERENCE_REPEATS = 3  # each clip's finish alone is timed this often; the fastest is its reference
EXAMPLES_KEPT = 10  # error and mismatch examples in the report
JOIN_POLL_S = 1.0  # how often the main thread checks on the workers
LOG_EVERY_S = 10.0  # between progress lines
PIECES_KEY, CHOICES_KEY = 0, 1  # seed keys: a stream's piece sizes and sleeps, a thread's choice of stream


@dataclasses.dataclass(frozen=True)
class StreamPlan:
    """One stream of the soak: its position in the draw, its kind (one of :data:`KINDS`), its clip's index."""

    index: int
    kind: str
    clip: int


def plan_streams(streams: int, seed: int = 0, kinds: Sequence[str] = KINDS) -> list[StreamPlan]:
    """``streams`` plans, kinds drawn from ``kinds`` (weighted as in :data:`KIND_WEIGHTS`) and clips uniformly.

    >>> [(plan.kind, plan.clip) for plan in plan_streams(3, seed=1)]
    [('never_fed_finish', 9), ('input_finished', 11), ('normal', 2)]
    >>> {plan.kind for plan in plan_streams(5, kinds=("slow",))}
    {'slow'}
    """
    streams = check_int("streams", streams, minimum=1)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {tuple(kinds)!r}")
    weights = np.array([KIND_WEIGHTS[KINDS.index(kind)] for kind in kinds])
    rng = np.random.default_rng(seed)
    drawn = rng.choice(len(kinds), size=streams, p=weights / weights.sum())
    clip_indices = rng.integers(0, CLIPS, size=streams)
    return [StreamPlan(index, kinds[kind], int(clip)) for index, (kind, clip) in enumerate(zip(drawn, clip_indices))]


def clips() -> list[np.ndarray]:
    """The :data:`CLIPS` ``(n,)`` float32 16 kHz clips, clip ``i`` of seed ``i``, durations spread over CLIP_SECONDS."""
    return [speech_like(seconds, seed=index) for index, seconds in enumerate(np.linspace(*CLIP_SECONDS, CLIPS))]


def _recognizer(device: str, max_streams: int) -> StreamingRecognizer:
    return StreamingRecognizer(load_model(), device, max_streams=max_streams)


def reference_texts(audio: Sequence[np.ndarray], device: str, max_streams: int) -> tuple[list[str], str, list[float]]:
    """``(texts, empty_text, finish_s)``: each clip transcribed alone, one stream at a time, by a fresh recognizer.

    ``finish_s[i]``: seconds ``finish()`` took for clip ``i`` fed whole at full speed, with no other stream
    (the fastest of :data:`REFERENCE_REPEATS`); ``empty_text``: the text of a stream finished without audio.
    """
    with _recognizer(device, max_streams) as recognizer:
        texts, finish_s = [], []
        for clip in audio:
            times = []
            for _ in range(REFERENCE_REPEATS):
                stream = recognizer.open_stream()
                stream.accept(clip)
                started = time.perf_counter()
                text = stream.finish()
                times.append(time.perf_counter() - started)
            texts.append(text)
            finish_s.append(min(times))
        empty_text = recognizer.open_stream().finish()
    return texts, empty_text, finish_s


def memory_snapshot(device: torch.device) -> dict:
    """RSS in bytes, the interpreter's allocated blocks (objects and other small allocations: a leak of Python
    objects grows them, allocator fragmentation does not) and, on CUDA, the device's allocated bytes and the
    pinned host allocator's bytes."""
    snapshot = {"rss_bytes": rss_bytes(), "python_blocks": sys.getallocatedblocks()}
    if device.type == "cuda":
        snapshot["cuda_allocated_bytes"] = torch.cuda.memory_allocated(device)
        if hasattr(torch.cuda, "host_memory_stats"):  # torch >= 2.6
            snapshot["pinned_bytes"] = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    return snapshot


@dataclasses.dataclass
class _Outcome:
    """What one stream did: the call in progress, the partial texts read, the final text and its finish time."""

    plan: StreamPlan
    call: str = "open_stream"  # until the stream is open
    partials: list[str] = dataclasses.field(default_factory=list)
    text: str | None = None
    finish_s: float | None = None
    finished_at: float | None = None  # time.perf_counter() when finish() was called


def _script(
    plan: StreamPlan,
    recognizer: StreamingRecognizer,
    clip: np.ndarray,
    timeout_s: float,
    outcome: _Outcome,
    rng: np.random.Generator,
    opened: Callable[[RecognizerStream], None],
) -> Iterator[float]:
    """Run ``plan`` a step at a time; each step yields the ``time.monotonic()`` at which the next may run.

    The stream's handle lives in this generator's frame only (``opened(handle)`` may refer to it weakly): a
    dropped stream's handle goes when the generator returns, unless something else still holds it.
    """
    stream = recognizer.open_stream(f"{plan.kind}-{plan.index}")
    opened(stream)
    yield time.monotonic()
    if plan.kind in FED_KINDS:
        slow = plan.kind == "slow"
        fed = round(rng.uniform(*DROP_FRACTION) * len(clip)) if plan.kind == "dropped" else len(clip)
        start = 0
        while start < fed:
            piece = max(1, round(rng.uniform(*(SLOW_PIECE_MS if slow else PIECE_MS)) * SAMPLE_RATE / MS_PER_S))
            outcome.call = "accept"
            stream.accept(clip[start : min(fed, start + piece)])
            start += piece
            if rng.random() < PARTIAL_PROBABILITY:
                outcome.call = "partial"
                outcome.partials.append(stream.partial())
            yield time.monotonic() + (rng.uniform(*SLOW_PAUSE_S) if slow else 0.0)
    if plan.kind in DROPPED_KINDS:
        return
    if plan.kind == "input_finished":
        outcome.call = "input_finished"
        stream.input_finished()
        yield time.monotonic()
    outcome.call = "finish"
    started = time.perf_counter()
    outcome.text = stream.finish(timeout=timeout_s)
    outcome.finish_s = time.perf_counter() - started
    outcome.finished_at = started


class _Tally:
    """The soak's counts, shared by the worker threads (every method takes the lock)."""

    def __init__(
        self, plans: Sequence[StreamPlan], expected: Sequence[str], empty_text: str, max_errors: int, started: float
    ) -> None:
        self.expected, self.empty_text, self.max_errors, self.started = expected, empty_text, max_errors, started
        self.kinds = {
            kind: dict.fromkeys(("planned", "finished", "dropped", "mismatches", "errors"), 0) for kind in KINDS
        }
        for plan in plans:
            self.kinds[plan.kind]["planned"] += 1
        # Seconds of each stream's finish (NaN: not finished), and its clip: arrays, so that the soak's own
        # bookkeeping allocates no Python objects per stream (the interpreter's block count stays the recognizer's).
        self.finish_s = np.full(len(plans), np.nan)
        self.clips = np.array([plan.clip for plan in plans])
        self.slowest: list[dict] = []  # the EXAMPLES_KEPT longest finishes, longest first
        self.errors: list[dict] = []
        self.mismatches: list[dict] = []
        self.error_count = self.mismatch_count = self.done = 0
        self.held = 0  # streams open whose scripts have neither completed nor failed
        self.abort = threading.Event()  # set: no more streams are opened
        self.abort_reason: str | None = None
        self._lock = threading.RLock()  # failed() stops the run while holding it

    def opened(self) -> None:
        with self._lock:
            self.held += 1

    def completed(self, outcome: _Outcome) -> None:
        plan = outcome.plan
        with self._lock:
            self.done += 1
            self.held -= 1
            counts = self.kinds[plan.kind]
            if outcome.text is None:
                counts["dropped"] += 1
                return
            counts["finished"] += 1
            self.finish_s[plan.index] = outcome.finish_s
            at_s = round(outcome.finished_at - self.started, 3)
            slow = {
                "stream": plan.index,
                "kind": plan.kind,
                "clip": plan.clip,
                "at_s": at_s,
                "finish_s": outcome.finish_s,
            }
            self.slowest = sorted([*self.slowest, slow], key=lambda finish: -finish["finish_s"])[:EXAMPLES_KEPT]
            expected = self.empty_text if plan.kind == "never_fed_finish" else self.expected[plan.clip]
            wrong = [p for p in outcome.partials if not expected.startswith(p)]
            if outcome.text != expected or wrong:
                counts["mismatches"] += 1
                self.mismatch_count += 1
                if len(self.mismatches) < EXAMPLES_KEPT:
                    got = {"text": outcome.text, "partials_not_prefix": wrong}
                    self.mismatches.append({"stream": plan.index, "kind": plan.kind, "expected": expected, **got})

    def failed(self, outcome: _Outcome, error: Exception) -> None:
        plan = outcome.plan
        with self._lock:
            self.done += 1
            self.held -= outcome.call != "open_stream"
            self.kinds[plan.kind]["errors"] += 1
            self.error_count += 1
            if len(self.errors) < EXAMPLES_KEPT:
                message = f"{type(error).__name__}: {error}"
                self.errors.append({"stream": plan.index, "kind": plan.kind, "call": outcome.call, "error": message})
            if self.error_count >= self.max_errors:
                self.stop(f"{self.error_count} errors (max_errors)")

    def stop(self, reason: str) -> None:
        """Open no more streams; the first reason given is the one reported."""
        with self._lock:
            if not self.abort.is_set():
                self.abort_reason = reason
                self.abort.set()

    def report(self) -> dict:
        """Per kind: streams planned, finished, dropped, with a wrong text, failed, and not run (after a stop)."""
        with self._lock:
            return {
                kind: {
                    **counts,
                    "not_run": counts["planned"] - counts["finished"] - counts["dropped"] - counts["errors"],
                }
                for kind, counts in self.kinds.items()
            }


@dataclasses.dataclass
class _Run:
    """What the worker threads share: the plans still to open (under ``plans_lock``), the recognizer, the counts."""

    plans: Iterator[StreamPlan]
    plans_lock: threading.Lock
    recognizer: StreamingRecognizer
    audio: Sequence[np.ndarray]
    tally: _Tally
    open_per_thread: int
    finish_timeout_s: float
    seed: int
    handles: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet)  # every handle still alive

    def next_plan(self) -> StreamPlan | None:
        with self.plans_lock:
            return next(self.plans, None)

    def script(self, plan: StreamPlan, outcome: _Outcome) -> Iterator[float]:
        rng = np.random.default_rng([self.seed, PIECES_KEY, plan.index])
        clip = self.audio[plan.clip]
        return _script(plan, self.recognizer, clip, self.finish_timeout_s, outcome, rng, self._opened)

    def _opened(self, stream: RecognizerStream) -> None:
        self.handles.add(stream)
        self.tally.opened()

    def snapshot(self) -> dict:
        """Streams done, handles the workers hold and handles still alive (held, or kept by something else), and
        :func:`memory_snapshot`."""
        tally = self.tally
        held = {"streams_done": tally.done, "handles_held": tally.held, "handles_alive": len(self.handles)}
        return {**held, **memory_snapshot(self.recognizer.device)}


def _worker(run: _Run, thread: int) -> None:
    """Open the next plans as room allows and advance a random ready stream of this thread, until none are left."""
    rng = np.random.default_rng([run.seed, CHOICES_KEY, thread])
    tally = run.tally
    active: list[list] = []  # [due time, script, outcome] per open stream
    while True:
        while len(active) < run.open_per_thread and not tally.abort.is_set() and (plan := run.next_plan()):
            outcome = _Outcome(plan)
            active.append([time.monotonic(), run.script(plan, outcome), outcome])
        if tally.abort.is_set():
            active.clear()  # the scripts' frames go, and their handles with them: abandoned, neither done nor failed
        if not active:
            return
        now = time.monotonic()
        ready = [entry for entry in active if entry[0] <= now]
        if not ready:
            time.sleep(min(entry[0] for entry in active) - now)
            continue
        entry = ready[rng.integers(len(ready))]
        try:
            entry[0] = next(entry[1])
        except StopIteration:
            active.remove(entry)
            tally.completed(entry[2])
        except Exception as error:  # noqa: BLE001 - every failure of the recognizer is counted, with its stream
            active.remove(entry)
            tally.failed(entry[2], error)


def run_churn(
    streams: int = 10_000,
    threads: int = 8,
    max_streams: int = 64,
    device: str = "cpu",
    seed: int = 0,
    *,
    kinds: Sequence[str] = KINDS,
    open_per_thread: int | None = None,
    finish_timeout_s: float = FINISH_TIMEOUT_S,
    max_errors: int = MAX_ERRORS,
    deadline_s: float | None = None,
) -> dict:
    """Run the soak (the module docstring); the report, JSON-ready.

    ``open_per_thread``: streams each thread keeps open at once (default ``max_streams // threads``, at least 1).

    ``deadline_s``: seconds after which no more streams are opened and the workers are waited for no longer
    (``None``: no limit); a run cut short by it or by ``max_errors`` errors is reported ``aborted``.
    """
    threads = check_int("threads", threads, minimum=1)
    max_streams = check_int("max_streams", max_streams, minimum=1)
    if open_per_thread is None:
        open_per_thread = max(1, max_streams // threads)
    open_per_thread = check_int("open_per_thread", open_per_thread, minimum=1)
    max_errors = check_int("max_errors", max_errors, minimum=1)
    if not finish_timeout_s > 0:
        raise ValueError(f"finish_timeout_s must be > 0 seconds, got {finish_timeout_s!r}")
    plans = plan_streams(streams, seed, kinds)
    audio = clips()
    expected, empty_text, reference_finish_s = reference_texts(audio, device, max_streams)
    recognizer = _recognizer(device, max_streams)
    target = recognizer.device
    started = time.perf_counter()
    tally = _Tally(plans, expected, empty_text, max_errors, started)
    warmup_streams = max(1, round(WARMUP_FRACTION * len(plans)))
    snapshots = {"start": memory_snapshot(target)}
    samples: list[dict] = []
    run = _Run(iter(plans), threading.Lock(), recognizer, audio, tally, open_per_thread, finish_timeout_s, seed)
    workers = [
        threading.Thread(
            target=_worker,
            args=(run, index),
            name=f"churn-{index}",
            daemon=True,  # a worker stuck inside the recognizer past the deadline must not keep the process alive
        )
        for index in range(threads)
    ]
    for worker in workers:
        worker.start()
    next_sample = logged = 0.0
    while alive := [worker for worker in workers if worker.is_alive()]:
        elapsed = time.perf_counter() - started
        if deadline_s is not None and elapsed > deadline_s and not tally.abort.is_set():
            tally.stop(f"deadline of {deadline_s:g} s (deadline_s)")
        if elapsed >= next_sample:
            samples.append({"elapsed_s": round(elapsed, 3), **run.snapshot()})
            next_sample += SAMPLE_INTERVAL_S
        if "after_warmup" not in snapshots and tally.done >= warmup_streams:
            snapshots["after_warmup"] = run.snapshot()
        if elapsed - logged >= LOG_EVERY_S:
            logged = elapsed
            log(
                f"{tally.done}/{len(plans)} streams done, {tally.error_count} errors, {tally.mismatch_count} mismatches"
            )
        alive[0].join(min(JOIN_POLL_S, SAMPLE_INTERVAL_S))
        if deadline_s is not None and elapsed > deadline_s + finish_timeout_s:
            break  # workers still inside a call: reported as hung
    seconds = time.perf_counter() - started
    hung = sum(worker.is_alive() for worker in workers)
    gc.collect()  # handles dropped in reference cycles, if any, are gone before the last figure
    snapshots["end"] = run.snapshot()
    snapshots.setdefault("after_warmup", snapshots["end"])
    stats = recognizer.stats
    if not hung:
        recognizer.close()
    finished = ~np.isnan(tally.finish_s)
    finish_wall = tally.finish_s[finished]
    excess = finish_wall - np.asarray(reference_finish_s)[tally.clips[finished]]
    return {
        "device": str(target),
        "streams": len(plans),
        "threads": threads,
        "open_per_thread": open_per_thread,
        "max_streams": recognizer.max_streams,
        "chunk_ms": recognizer.chunk_ms,
        "left_chunks": recognizer.left_chunks,
        "seed": seed,
        "kinds_drawn": list(kinds),
        "clip_seconds": [round(len(clip) / SAMPLE_RATE, 3) for clip in audio],
        "finish_timeout_s": finish_timeout_s,
        "seconds": seconds,
        "streams_done": tally.done,
        "streams_per_s": tally.done / seconds,
        "cycles": stats.count,
        "stream_chunks": stats.chunks,
        "aborted": tally.abort_reason,
        "hung_threads": hung,
        "kinds": tally.report(),
        "finished": sum(counts["finished"] for counts in tally.kinds.values()),
        "mismatches": tally.mismatch_count,
        "errors": tally.error_count,
        "mismatch_examples": tally.mismatches,
        "error_examples": tally.errors,
        "finish_s": percentiles(finish_wall) if finished.any() else None,
        "finish_excess_s": percentiles(excess) if finished.any() else None,
        "slowest_finishes": tally.slowest,
        "reference_finish_s": percentiles(reference_finish_s),
        "warmup_streams": warmup_streams,
        "memory": _memory_report(snapshots, samples),
        "samples": samples,
    }


def _memory_report(snapshots: dict, samples: Sequence[dict]) -> dict:
    """The snapshots, and for each figure its growth from after the warm-up to the end and to its highest sample."""
    warm, end = snapshots["after_warmup"], snapshots["end"]
    later = [sample for sample in samples if sample["streams_done"] >= warm["streams_done"]] + [end]
    figures = [key for key in warm if key.endswith(("_bytes", "_blocks"))]
    return {
        **snapshots,
        "growth_after_warmup": {key: end[key] - warm[key] for key in figures},
        "max_growth_after_warmup": {key: max(s[key] for s in later) - warm[key] for key in figures},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``argv`` without the program name); 1 on any mismatch, error or abort."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000, help="streams to open (default 10000)")
    parser.add_argument("--threads", type=int, default=8, help="threads that open, feed and finish them (default 8)")
    parser.add_argument("--max-streams", type=int, default=64, help="the recognizer's encoder slots (default 64)")
    parser.add_argument(
        "--open-per-thread", type=int, default=None, help="streams a thread keeps open (default: max-streams / threads)"
    )
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--finish-timeout", type=float, default=FINISH_TIMEOUT_S, help="seconds a finish may wait")
    parser.add_argument("--max-errors", type=int, default=MAX_ERRORS, help="stop opening streams after this many")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads (default 1: a small model)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine")
    torch.set_num_threads(args.torch_threads)
    report = run_churn(
        args.streams,
        args.threads,
        args.max_streams,
        args.device,
        args.seed,
        kinds=args.kinds.split(","),
        open_per_thread=args.open_per_thread,
        finish_timeout_s=args.finish_timeout,
        max_errors=args.max_errors,
    )
    summary = {key: value for key, value in report.items() if key != "samples"}
    print("\n".join(f"{key}: {value}" for key, value in summary.items()))
    if args.out is not None:
        write_result(args.out, {**capture_environment(sys.argv), **report})
    return 1 if report["mismatches"] or report["errors"] or report["aborted"] else 0
