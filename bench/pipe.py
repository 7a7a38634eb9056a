"""``audiomask transcribe -`` on a long pipe: its peak memory against a short file's, and its first-partial latency.

Two measurements of the command line as a user runs it (``python -m
audiomask transcribe - --json``, a subprocess), fed on stdin the way a
streaming writer (sox, ffmpeg, arecord) feeds it: a WAV header whose sizes
say "unknown" (:data:`WAV_UNKNOWN_SIZE`), then 16 kHz mono 16-bit samples
of speech-like audio (:func:`~audiomask.bench.signals.speech_like`, made of
:data:`SEGMENTS` distinct segments of :data:`SEGMENT_S` seconds in turn,
generated once and written over and over):

- **memory**: ``minutes`` of audio written as fast as the command reads it
  (the pipe's back-pressure sets the pace), and the same command on a
  :data:`BASELINE_S`-second WAV file of the same audio. Each process's peak
  RSS is its ``ru_maxrss`` (``os.wait4``); the criterion: the pipe's peak
  within :data:`MEMORY_LIMIT_BYTES` of the file's. Each run also reports
  the audio the command said it read (``duration_s``), which must be all of it.
- **first-partial latency**: with ``--partials``, :data:`LATENCY_S` seconds
  of audio written at real time in pieces of :data:`PACE_MS`, for each chunk
  duration of :data:`LATENCY_CHUNK_MS`, once the command has read the header
  (it has loaded its model and waits for samples). Each partial line says how
  much audio had been read (``audio_s``); its latency is the time from the
  moment that audio had been written to the moment the line was read here.
  The criterion: the first partial within :data:`LATENCY_LIMIT_CHUNKS` chunks.

:func:`run_pipe_bench` returns the report; :func:`main` is the command line
(``scripts/bench_pipe.py``), which exits 1 when a criterion is missed or a
run failed::

    python scripts/bench_pipe.py --minutes 60 --out bench/results/pipe_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import soundfile as sf

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.signals import speech_like
from audiomask.bench.timing import MS_PER_S, log, percentiles
from audiomask.constants import SAMPLE_RATE

__all__ = [
    "CliRun",
    "first_partial_latency",
    "main",
    "peak_memory",
    "run_cli",
    "run_pipe_bench",
    "speech_pcm",
    "speech_samples",
    "wav_stream_header",
]

WAV_UNKNOWN_SIZE = 0xFFFFFFFF  # the RIFF and data sizes of a WAV written to a pipe (ffmpeg's "unknown")
SAMPLE_BYTES = 2  # 16-bit PCM
INT16_SCALE = 32768  # int16 full scale: sample / INT16_SCALE is what the reader hands the recognizer
SEGMENT_S = 10.0  # seconds per distinct segment of the audio
SEGMENTS = 6  # distinct segments, written in turn: the pipe's audio repeats every SEGMENTS * SEGMENT_S seconds
WRITE_BYTES = 2**16  # per write at full speed: one pipe buffer
BASELINE_S = 10.0  # the file the long pipe is compared with
MEMORY_LIMIT_BYTES = 100 * 10**6  # 100 MB: the pipe's peak RSS may exceed the file's by this much
LATENCY_S = 10.0  # audio written at real time for the latency figure
PACE_MS = 10  # audio per write at real time
LATENCY_CHUNK_MS = (160, 320)  # chunk durations (--chunk-ms) the latency is measured for
LATENCY_LIMIT_CHUNKS = 2  # the first partial's latency criterion, in chunks
READY_TIMEOUT_S = 120.0  # for the command to start, load its model and read the header
REAL_TIME_FACTOR_BOUND = 0.5  # processing seconds per audio second a run is given before it is stopped
KIB = 1024  # ru_maxrss counts KiB on Linux


def wav_stream_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """The 44-byte header of a mono 16-bit PCM WAV whose length is unknown, as writers to a pipe leave it.

    >>> header = wav_stream_header()
    >>> len(header), header[:4], header[8:16], struct.unpack("<I", header[40:44])[0] == WAV_UNKNOWN_SIZE
    (44, b'RIFF', b'WAVEfmt ', True)
    """
    block_align = SAMPLE_BYTES  # one channel
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * block_align, block_align, 8 * SAMPLE_BYTES)
    return (
        b"RIFF"
        + struct.pack("<I", WAV_UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", WAV_UNKNOWN_SIZE)
    )


def _segments() -> list[np.ndarray]:
    """The :data:`SEGMENTS` distinct ``(SEGMENT_S * SAMPLE_RATE,)`` int16 segments, segment ``i`` of seed ``i``."""
    return [
        np.round(speech_like(SEGMENT_S, seed=index) * (INT16_SCALE - 1)).astype(np.int16) for index in range(SEGMENTS)
    ]


def _audio_int16(seconds: float) -> Iterator[np.ndarray]:
    """The first ``seconds`` of the benchmark's audio as int16 pieces of at most one segment (segments in turn)."""
    segments = _segments()
    left = round(seconds * SAMPLE_RATE)
    index = 0
    while left > 0:
        piece = segments[index % SEGMENTS][:left]
        yield piece
        left -= len(piece)
        index += 1


def speech_pcm(seconds: float) -> Iterator[bytes]:
    """The first ``seconds`` of the benchmark's audio as little-endian 16-bit PCM bytes, a segment at a time."""
    for piece in _audio_int16(seconds):
        yield piece.astype("<i2").tobytes()


def speech_samples(seconds: float) -> np.ndarray:
    """The first ``seconds`` of the benchmark's audio as ``(n,)`` float32 samples, as the command reads them."""
    return np.concatenate(list(_audio_int16(seconds))).astype(np.float32) / INT16_SCALE


@dataclasses.dataclass
class CliRun:
    """One run of the command: its status, peak RSS, stdout lines with the times they were read, stderr."""

    returncode: int
    peak_rss_bytes: int
    wall_s: float
    lines: list[tuple[float, str]]  # (time.monotonic() when read, the line)
    stderr: str
    timed_out: bool

    def records(self, kind: str) -> list[tuple[float, dict]]:
        """The JSON lines of ``kind`` (``"partial"`` or ``"final"``), each with the time it was read."""
        parsed = [(at, json.loads(line)) for at, line in self.lines if line.startswith("{")]
        return [(at, record) for at, record in parsed if record.get("kind") == kind]

    def final(self) -> dict:
        """The file's final JSON record; ``RuntimeError`` (with stderr) when the command printed none."""
        finals = self.records("final")
        if self.returncode != 0 or len(finals) != 1:
            killed = " (killed: past its time limit)" if self.timed_out else ""
            raise RuntimeError(
                f"audiomask transcribe exited {self.returncode}{killed} with {len(finals)} results: {self.stderr}"
            )
        return finals[0][1]


def _cli_command(arguments: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "audiomask", "transcribe", *arguments, "--json"]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_cli(arguments: Sequence[str], feed: Callable[[int], None] | None, timeout_s: float) -> CliRun:
    """``audiomask transcribe ARGUMENTS --json`` with ``feed(fd)`` writing its stdin (``None``: no stdin).

    ``feed`` runs on a thread of its own and may block on the pipe (back-pressure); its stdin is closed
    after it returns. A command still running after ``timeout_s`` is killed (``timed_out``).
    """
    process = subprocess.Popen(
        _cli_command(arguments),
        stdin=subprocess.PIPE if feed is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    lines: list[tuple[float, str]] = []
    stderr: list[bytes] = []

    def read_stdout() -> None:
        for line in iter(process.stdout.readline, b""):
            lines.append((time.monotonic(), line.decode().rstrip("\n")))

    def write_stdin() -> None:
        try:
            feed(process.stdin.fileno())
        except BrokenPipeError:  # the command stopped reading (an error, or the watchdog): its status says why
            pass
        finally:
            process.stdin.close()

    helpers = [
        threading.Thread(target=read_stdout),
        threading.Thread(target=lambda: stderr.append(process.stderr.read())),
    ]
    helpers += [threading.Thread(target=write_stdin)] if feed is not None else []
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        process.kill()

    watchdog = threading.Timer(timeout_s, kill)
    started = time.perf_counter()
    for thread in [*helpers, watchdog]:
        thread.start()
    _, status, usage = os.wait4(process.pid, 0)
    wall_s = time.perf_counter() - started
    watchdog.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    for thread in helpers:
        thread.join()
    process.stdout.close()
    process.stderr.close()
    return CliRun(process.returncode, usage.ru_maxrss * KIB, wall_s, lines, b"".join(stderr).decode(), killed.is_set())


def _run_timeout_s(audio_s: float) -> float:
    return READY_TIMEOUT_S + REAL_TIME_FACTOR_BOUND * audio_s


def _feed_full_speed(seconds: float) -> Callable[[int], None]:
    """A stdin writer: the stream's header, then ``seconds`` of audio as fast as the pipe takes it."""

    def feed(fd: int) -> None:
        _write_all(fd, wav_stream_header())
        for data in speech_pcm(seconds):
            for start in range(0, len(data), WRITE_BYTES):
                _write_all(fd, data[start : start + WRITE_BYTES])

    return feed


def peak_memory(seconds: float, arguments: Sequence[str] = (), directory: Path | None = None) -> dict:
    """``seconds`` of audio through the command: piped at full speed, or as a WAV file written in ``directory``.

    Returns the run's peak RSS (bytes), wall time, the audio the command read (``duration_s``, from its
    result) and its text; ``RuntimeError`` when the command failed.
    """
    if directory is None:
        run = run_cli(["-", *arguments], _feed_full_speed(seconds), _run_timeout_s(seconds))
    else:
        path = Path(directory) / f"speech_{seconds:g}s.wav"
        sf.write(path, np.concatenate(list(_audio_int16(seconds))), SAMPLE_RATE, subtype="PCM_16")
        run = run_cli([str(path), *arguments], None, _run_timeout_s(seconds))
    final = run.final()
    return {
        "source": "pipe" if directory is None else "file",
        "audio_s": seconds,
        "duration_s": final["duration_s"],
        "peak_rss_bytes": run.peak_rss_bytes,
        "wall_s": run.wall_s,
        "processing_s": final["processing_s"],
        "rtf": final["rtf"],
        "text": final["text"],
    }


def _pipe_fill(fd: int) -> int:
    """Bytes written to the pipe ``fd`` that its reader has not read yet."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def first_partial_latency(chunk_ms: int, seconds: float = LATENCY_S, arguments: Sequence[str] = ()) -> dict:
    """``seconds`` of audio written at real time to ``transcribe - --partials --chunk-ms CHUNK_MS``: the latencies.

    Returns per partial line ``(audio_s, latency_s)`` (latency: from the moment its audio had been written
    to the moment the line was read), the first partial's latency in seconds and chunks, the time from the
    first chunk's audio to the first partial, and the final text; ``RuntimeError`` when the command failed.
    """
    written: list[tuple[float, int]] = []  # (time.monotonic() after a write, samples written so far)
    pcm = b"".join(speech_pcm(seconds))
    pace_bytes = PACE_MS * SAMPLE_RATE // MS_PER_S * SAMPLE_BYTES

    def feed(fd: int) -> None:
        _write_all(fd, wav_stream_header())
        deadline = time.monotonic() + READY_TIMEOUT_S
        reader_gone = select.poll()
        reader_gone.register(fd, select.POLLERR)  # a pipe's write end reports POLLERR once its reader has exited
        # Until the command has read the header (it has loaded its model), polling every PACE_MS.
        while _pipe_fill(fd) and not reader_gone.poll(PACE_MS) and time.monotonic() < deadline:
            pass
        began = time.monotonic()
        for index, start in enumerate(range(0, len(pcm), pace_bytes)):
            time.sleep(max(0.0, began + index * PACE_MS / MS_PER_S - time.monotonic()))
            _write_all(fd, pcm[start : start + pace_bytes])
            written.append((time.monotonic(), (start + pace_bytes) // SAMPLE_BYTES))

    arguments = ["-", "--partials", "--chunk-ms", str(chunk_ms), *arguments]
    run = run_cli(arguments, feed, READY_TIMEOUT_S + _run_timeout_s(seconds) + seconds)
    final = run.final()
    times = np.array([at for at, _ in written])
    counts = np.array([count for _, count in written])

    def written_at(audio_s: float) -> float:
        """When the first ``audio_s`` seconds had all been written."""
        index = np.searchsorted(counts, round(audio_s * SAMPLE_RATE))
        return float(times[min(index, len(times) - 1)])

    partials = [(record["audio_s"], at - written_at(record["audio_s"]), at) for at, record in run.records("partial")]
    chunk_s = chunk_ms / MS_PER_S
    report = {
        "chunk_ms": chunk_ms,
        "audio_s": seconds,
        "pace_ms": PACE_MS,
        "partials": [[audio_s, latency] for audio_s, latency, _ in partials],
        "final_text": final["text"],
        "texts_of_partials": [record["text"] for _, record in run.records("partial")],
    }
    if partials:
        audio_s, latency, at = partials[0]
        report["first_partial"] = {
            "audio_s": audio_s,
            "latency_s": latency,
            "latency_chunks": latency / chunk_s,
            "after_first_chunk_written_s": at - written_at(chunk_s),
        }
        report["latency_s"] = percentiles([latency for _, latency, _ in partials])
    return report


def run_pipe_bench(
    minutes: float = 60.0,
    arguments: Sequence[str] = (),
    baseline_s: float = BASELINE_S,
    latency_s: float = LATENCY_S,
    latency_chunk_ms: Sequence[int] = LATENCY_CHUNK_MS,
) -> dict:
    """Both measurements (the module docstring); ``arguments`` go to every command (``--device``, ``--model``)."""
    if not minutes > 0:
        raise ValueError(f"minutes must be > 0, got {minutes!r}")
    with tempfile.TemporaryDirectory() as directory:
        log(f"{baseline_s:g} s file")
        file_run = peak_memory(baseline_s, arguments, Path(directory))
    log(f"{baseline_s:g} s pipe")
    short_pipe = peak_memory(baseline_s, arguments)
    log(f"{minutes:g} min pipe")
    long_pipe = peak_memory(minutes * 60, arguments)
    excess = long_pipe["peak_rss_bytes"] - file_run["peak_rss_bytes"]
    latency = []
    for chunk_ms in latency_chunk_ms:
        log(f"first partial, {chunk_ms} ms chunks")
        latency.append(first_partial_latency(chunk_ms, latency_s, arguments))
    first = [run["first_partial"]["latency_chunks"] for run in latency if "first_partial" in run]
    runs = [("file", file_run), ("short_pipe", short_pipe), ("long_pipe", long_pipe)]
    return {
        "minutes": minutes,
        "arguments": list(arguments),
        "memory": {
            "file": {key: value for key, value in file_run.items() if key != "text"},
            "short_pipe": {key: value for key, value in short_pipe.items() if key != "text"},
            "long_pipe": {key: value for key, value in long_pipe.items() if key != "text"},
            "long_pipe_minus_file_bytes": excess,
            "limit_bytes": MEMORY_LIMIT_BYTES,
            "within_limit": excess <= MEMORY_LIMIT_BYTES,
            "all_audio_read": all(run["duration_s"] == round(run["audio_s"], 3) for _, run in runs),
        },
        "latency": {
            "runs": latency,
            "limit_chunks": LATENCY_LIMIT_CHUNKS,
            "within_limit": len(first) == len(latency) and max(first) <= LATENCY_LIMIT_CHUNKS,
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``argv`` without the program name); 1 when a criterion is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="audio piped for the memory figure (default 60)")
    parser.add_argument("--baseline-seconds", type=float, default=BASELINE_S, help="the file compared with")
    parser.add_argument("--latency-seconds", type=float, default=LATENCY_S, help="audio written at real time")
    parser.add_argument("--device", default="auto", help="the command's --device (default auto)")
    parser.add_argument("--model", default=None, help="the command's --model (default: the shipped model)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    arguments = ["--device", args.device] + (["--model", args.model] if args.model else [])
    report = run_pipe_bench(args.minutes, arguments, args.baseline_seconds, args.latency_seconds)
    memory, latency = report["memory"], report["latency"]
    print(json.dumps(memory, indent=1))
    for run in latency["runs"]:
        print(f"{run['chunk_ms']} ms chunks: first partial {run.get('first_partial')}, latency {run.get('latency_s')}")
    if args.out is not None:
        write_result(args.out, {**capture_environment(sys.argv), **report})
    ok = memory["within_limit"] and memory["all_audio_read"] and latency["within_limit"]
    return 0 if ok else 1
