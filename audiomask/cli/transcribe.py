"""``audiomask transcribe``: stream files, pipes and stdin through a StreamingRecognizer, one chunk at a time."""

from __future__ import annotations

import argparse
import os
import select
import signal
import stat
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import audiomask
from audiomask.checks import pick_device
from audiomask.cli.common import EXIT_BAD_FILE, EXIT_OK, SIGNAL_EXIT_BASE
from audiomask.cli.output import Output, reason
from audiomask.constants import SAMPLE_RATE

__all__ = ["STDIN", "TRANSCRIBE_THREADS", "Interrupted", "transcribe"]

MS_PER_S = 1000
STDIN = "-"
# Suffixes of the containers libsndfile reads: what a directory argument expands to.
AUDIO_SUFFIXES = frozenset(
    ".wav .wave .flac .ogg .oga .opus .mp3 .aiff .aif .aifc .au .snd .caf .w64 .rf64 .sph".split()
)
# torch intra-op threads while transcribing. A chunk step multiplies matrices of a few tokens,
# too small to share out, and the front end runs on a second thread beside it (audiomask.asr.driver)
# (figures: docs/defaults.md).
TRANSCRIBE_THREADS = 1
FIFO_WRITER_WAIT_S = 10.0  # how long a named pipe without a writer is waited for before it is an error
TERMINATION_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and `kill`, `timeout`, service managers


class Interrupted(KeyboardInterrupt):
    """The run was ended by signal ``signum``: the text so far is printed, the status is 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class _Source:
    """One input: ``name`` as printed; ``path`` to read (``None``: stdin); ``error``: why it cannot be read."""

    name: str
    path: Path | None = None
    error: str | None = None


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a directory; ``False`` where it cannot be checked (the audio reader then says why)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:  # a name too long, a directory it may not enter, a link loop, ...
        return False


def _sources(arguments: Sequence[str]) -> list[_Source]:
    """The files the arguments name, in order: ``-`` is stdin, a directory its audio files (sorted).

    A path that cannot be checked is a source that fails when read, and a directory that cannot be
    listed is one with its error: neither stops the others.
    """
    sources = []
    for argument in arguments:
        if argument == STDIN:
            sources.append(_Source(STDIN))
            continue
        path = Path(argument)
        if not _is_dir(path):
            sources.append(_Source(str(path), path))
            continue
        try:
            entries = list(path.iterdir())
        except OSError as error:
            sources.append(_Source(str(path), error=f"directory cannot be listed ({error.strerror})"))
            continue
        found = sorted(entry for entry in entries if entry.suffix.lower() in AUDIO_SUFFIXES and not _is_dir(entry))
        if not found:
            suffixes = " ".join(sorted(AUDIO_SUFFIXES))
            sources.append(_Source(str(path), error=f"directory without audio files (suffixes: {suffixes})"))
        sources.extend(_Source(str(entry), entry) for entry in found)
    return sources


def _is_stream(path: Path) -> bool:
    """Whether ``path`` is a pipe (a FIFO, ``<(...)``) or a character device: read once, as it arrives."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing or unreadable: the audio reader says why
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _open_stream(source: _Source) -> int:
    """A readable descriptor of the stream ``source`` (stdin: a duplicate of descriptor 0); close it after use."""
    if source.path is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise audiomask.AudioError(f"{STDIN}: stdin is a terminal, not audio (pipe a wav file into it)")
        return os.dup(sys.stdin.fileno())
    try:
        fd = os.open(source.path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO without a writer would block the open
    except OSError as error:
        raise audiomask.AudioError(f"{source.path}: cannot be read ({error.strerror})") from None
    if stat.S_ISFIFO(os.fstat(fd).st_mode):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        if not poller.poll(FIFO_WRITER_WAIT_S * MS_PER_S):
            os.close(fd)
            raise audiomask.AudioError(
                f"{source.path}: named pipe without a writer (nothing arrived in {FIFO_WRITER_WAIT_S:g} s)"
            )
    os.set_blocking(fd, True)
    return fd


@contextmanager
def _blocks(source: _Source, block_samples: int) -> Iterator[tuple[Path, Iterator[Any], bool]]:
    """``(path, blocks, streamed)`` of ``source``: a file read in blocks, or a stream read as it arrives."""
    from audiomask.audio import iter_blocks, iter_stream_blocks

    path = Path(STDIN) if source.path is None else source.path
    if source.path is not None and not _is_stream(source.path):
        yield path, iter_blocks(path, block_samples), False
        return
    fd = _open_stream(source)
    blocks = iter_stream_blocks(fd, source.name, block_samples)
    try:
        yield path, blocks, True
    finally:
        blocks.close()
        os.close(fd)


def _transcribe_source(recognizer: Any, source: _Source, output: Output, index: int) -> None:
    """Stream ``source`` through ``recognizer`` one chunk of samples at a time; report as it goes."""
    from audiomask.audio import TruncatedAudioWarning

    name = source.name
    block_samples = recognizer.block_samples  # one encoder chunk of 16 kHz samples
    started = time.perf_counter()
    stream, read = None, 0
    try:
        with _blocks(source, block_samples) as (path, blocks, streamed), warnings.catch_warnings(record=True) as caught:
            output.start(index, name, None if streamed else path)
            warnings.simplefilter("always", TruncatedAudioWarning)  # one line per file, however often it recurs
            for block in blocks:
                if stream is None:  # opened with its first samples: a file that fails to open holds no slot
                    stream = recognizer.open_stream(name)
                stream.accept(block)
                read += len(block)
                output.warnings(name, path, caught)
                output.update(read / SAMPLE_RATE, stream.partial())
            text = stream.finish()
            output.warnings(name, path, caught)
    except KeyboardInterrupt:
        text = stream.partial() if stream is not None else ""
        output.result(name, text, read / SAMPLE_RATE, time.perf_counter() - started, interrupted=True)
        raise
    except audiomask.AudioError:
        if stream is not None:
            stream.finish()  # frees its encoder slot for the next file; the text goes with the bad file
        raise
    output.result(name, text, read / SAMPLE_RATE, time.perf_counter() - started)


def _check_threads(threads: object) -> int:
    """``--threads``: 1 to the cores this process may run on."""
    from audiomask.checks import check_int

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = check_int("--threads", threads, minimum=1)
    if threads > cores:
        raise ValueError(f"--threads must be 1 to {cores} (the cores available to this process), got {threads}")
    return threads


def _llm_recognizer(args: argparse.Namespace, device: str) -> Any:
    """The streaming recogniser of an LLM checkpoint directory (Qwen3-ASR, Phi-4-multimodal)."""
    from audiomask.llm.recognizer import LLMRecognizer
    from audiomask.llm.streaming import StreamPolicy

    if args.left_chunks is not None:
        raise ValueError(
            f"--left-chunks is for CTC models; {args.model!r} is an LLM recogniser, got {args.left_chunks}"
        )
    policy = StreamPolicy() if args.chunk_ms is None else StreamPolicy(chunk_s=args.chunk_ms / 1000)
    return LLMRecognizer.from_pretrained(
        args.model, device, policy=policy, context=args.context, language=args.language
    )


def _recognizer(args: argparse.Namespace, device: str) -> Any:
    from audiomask.asr.checkpoint import load_model
    from audiomask.asr.recognizer import StreamingRecognizer
    from audiomask.llm.checkpoint import is_llm_checkpoint

    if args.model is not None and is_llm_checkpoint(args.model):
        return _llm_recognizer(args, device)
    if args.context or args.language is not None:
        raise ValueError(
            "--context and --language need an LLM checkpoint directory as --model (Qwen3-ASR, Phi-4-multimodal)"
        )
    model = load_model(args.model)
    try:
        return StreamingRecognizer(model, device, args.chunk_ms, args.left_chunks)
    except ValueError as error:
        raise ValueError(f"--chunk-ms/--left-chunks: {error}") from None


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise :class:`Interrupted` (in the main thread), so both unwind alike."""
    previous = {signum: signal.signal(signum, _raise_interrupted) for signum in TERMINATION_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def transcribe(args: argparse.Namespace) -> int:
    """Run ``audiomask transcribe``; the exit status (0, or 1 when a file could not be transcribed)."""
    import torch

    device = pick_device(args.device, "--device")
    torch.set_num_threads(_check_threads(args.threads))
    sources = _sources(args.files)
    failed = False
    output = Output(
        json_lines=args.json, partials=args.partials, files=len(sources), stdout=sys.stdout, stderr=sys.stderr
    )
    with _signals_interrupt(), _recognizer(args, device) as recognizer:
        try:
            for index, source in enumerate(sources):
                if source.error is not None:
                    output.error(source.name, source.error)
                    failed = True
                    continue
                try:
                    _transcribe_source(recognizer, source, output, index)
                except audiomask.AudioError as error:
                    path = STDIN if source.path is None else source.path
                    output.error(source.name, reason(str(error), Path(path)))
                    failed = True
        finally:
            output.finish()
    return EXIT_BAD_FILE if failed else EXIT_OK


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal that ended the run (SIGINT for a plain ``KeyboardInterrupt``)."""
    return SIGNAL_EXIT_BASE + getattr(interrupt, "signum", signal.SIGINT)
