"""The ``audiomask`` command line: transcribe audio files, describe the model, benchmark, demo.

``audiomask transcribe FILE...`` streams each file through the
:class:`~audiomask.asr.recognizer.StreamingRecognizer` (one encoder chunk of audio
at a time, as a live source would arrive) and prints ``FILE<TAB>TEXT`` lines
on stdout, in argument order; ``-`` reads a wav from stdin, a directory
stands for its audio files (sorted, not recursive). ``--json`` prints one
JSON object a line instead: ``{"kind": "final", "file", "text", "duration_s",
"processing_s", "rtf", "interrupted"}`` (``rtf`` = processing / audio time).

``--partials`` shows the text while a file is being transcribed: with
``--json``, as ``{"kind": "partial", "file", "text", "audio_s"}`` lines on
stdout before the file's final line (``audio_s``: seconds read so far);
without, on stderr: one live line on a terminal, else a line
``partial<TAB>FILE<TAB>TEXT`` each time the text grows. On a terminal, stderr
also shows a progress line for several files or a long one.

Exit status: 0 all files transcribed; 1 a file could not be (one line
``audiomask: error: FILE: reason`` on stderr each, the other files are still
transcribed; a file whose data ends early is transcribed with a line
``audiomask: warning: FILE: ...``); 2 a bad argument or model (one line
``audiomask: error: ...``); 130 interrupted (Ctrl-C): the lines already
printed stay, and the file in progress gets its text so far, marked
``[interrupted at S s]`` in a third column (``"interrupted": true`` in JSON).
Never a traceback for user errors.

``audiomask info`` prints the model, device, versions and streaming settings,
and every training stage the model card next to the model file lists;
``audiomask bench ARGS...`` runs the latency benchmark
(:mod:`audiomask.bench.latency`); ``audiomask demo`` builds the masks of a
small Phi-4MM and Qwen3-ASR batch in numpy, writes them straight into a
pinned ring slot and moves them to the best device.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import numpy as np

import audiomask
from audiomask.constants import FRAME_MS, FRAMES_PER_SECOND, SAMPLE_RATE
from audiomask.masks import phi4mm, qwen3_asr

__all__ = ["main"]

MS_PER_S = 1000
DEMO_UTTERANCES_S = (30.0, 12.3, 5.0, 0.8)  # seconds of audio per utterance in the demo batch
DEMO_CHUNK_TOKENS = 16  # 16 tokens x 80 ms = 1.28 s chunks
DEMO_LEFT_CHUNKS = 2  # chunks of left context

EXIT_OK, EXIT_BAD_FILE, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 128 + 2  # the shell's status for a process ended by SIGINT (2)
STDIN = "-"
# Suffixes of the containers libsndfile reads: what a directory argument expands to.
AUDIO_SUFFIXES = frozenset(
    ".wav .wave .flac .ogg .oga .opus .mp3 .aiff .aif .aifc .au .snd .caf .w64 .rf64 .sph".split()
)
# torch intra-op threads while transcribing. A chunk step multiplies matrices of a few tokens,
# too small to share out, and the front end runs on a second thread beside it (audiomask.asr.driver):
# on the shared 2-core CPU the shipped architecture's CLI RTF was 0.10 with one thread against
# 0.12 with two (bench/results/cli_rtf_cpu_2core.json; 0.14 against 0.25 when the load was higher).
TRANSCRIBE_THREADS = 1
PROGRESS_MIN_AUDIO_S = 10.0  # on a terminal, one file this long (or several files) gets a progress line
HELP_WIDTH = 79  # characters per line of the help texts taken from this module's docstring
MODEL_CARD_NAME = "MODEL_CARD.md"  # the card beside a model file (recipes.ctc_small.card writes the shipped one's)
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
# reST of the docstring, for plain help: :role:`~a.b.name` -> name, :role:`a.b` -> a.b, ``x`` -> x.
_REST_MARKUP = re.compile(r":\w+:`~(?:[\w.]*\.)?([^`]+)`|:\w+:`([^`]+)`|``([^`]+)``")


def _plain(text: str) -> str:
    """reST paragraphs as plain text for ``--help``: markup dropped (quotes kept round literals with spaces).

    >>> _plain("Streams through the\\n:class:`~audiomask.asr.recognizer.StreamingRecognizer`; ``-`` is stdin.")
    'Streams through the StreamingRecognizer; - is stdin.'
    >>> _plain("One line ``audiomask: error: FILE`` each (:mod:`audiomask.audio`).")
    "One line 'audiomask: error: FILE' each (audiomask.audio)."
    """
    text = _REST_MARKUP.sub(lambda m: m[1] or m[2] or (f"'{m[3]}'" if " " in m[3] else m[3]), text)
    return "\n\n".join(textwrap.fill(" ".join(paragraph.split()), HELP_WIDTH) for paragraph in text.split("\n\n"))


def _pick_device(name: str) -> str:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without CUDA is a user error."""
    if not _DEVICE.fullmatch(name):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (use --device cpu or auto)")
    return name


# -- transcribe --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """One input: ``name`` as printed; ``path`` to read (``None``: stdin); ``error``: why it cannot be read."""

    name: str
    path: Path | None = None
    error: str | None = None


def _sources(arguments: Sequence[str]) -> list[_Source]:
    """The files the arguments name, in order: ``-`` is stdin, a directory its audio files (sorted)."""
    sources = []
    for argument in arguments:
        if argument == STDIN:
            sources.append(_Source(STDIN))
            continue
        path = Path(argument)
        if not path.is_dir():
            sources.append(_Source(str(path), path))
            continue
        found = sorted(
            entry for entry in path.iterdir() if entry.suffix.lower() in AUDIO_SUFFIXES and not entry.is_dir()
        )
        if not found:
            suffixes = " ".join(sorted(AUDIO_SUFFIXES))
            sources.append(_Source(str(path), error=f"directory without audio files (suffixes: {suffixes})"))
        sources.extend(_Source(str(entry), entry) for entry in found)
    return sources


def _reason(message: str, path: Path) -> str:
    """``message`` without the leading ``"{path}: "`` the audio reader puts on its errors and warnings."""
    return message.removeprefix(f"{path}: ")


class _Output:
    """Where results, partial texts, progress, warnings and errors go (the module docstring's contract)."""

    def __init__(self, *, json_lines: bool, partials: bool, files: int, stdout: TextIO, stderr: TextIO) -> None:
        self.json_lines, self.partials, self.files = json_lines, partials, files
        self.stdout, self.stderr = stdout, stderr
        self.live = stderr.isatty()  # a terminal: one status line, rewritten in place
        self._status_shown = False
        self._file: tuple[int, str, float | None] = (0, "", None)  # index, name, expected seconds
        self._text = ""

    def _emit(self, stream: TextIO, line: str) -> None:
        self._clear_status()
        stream.write(line + "\n")
        stream.flush()

    def _json(self, **fields: Any) -> None:
        self._emit(self.stdout, json.dumps(fields, ensure_ascii=False))

    def _clear_status(self) -> None:
        if self._status_shown:
            self.stderr.write("\r\x1b[K")
            self.stderr.flush()
            self._status_shown = False

    def start(self, index: int, name: str, path: Path) -> None:
        """File ``index`` (0-based) begins; its length (for the progress line) is read from its header."""
        expected = None
        if self.live:
            import soundfile

            try:
                expected = soundfile.info(str(path)).duration
            except (RuntimeError, OSError):  # unreadable: the reader reports why, once, when it gets there
                pass
        self._file, self._text = (index, name, expected), ""

    def update(self, audio_s: float, text: str) -> None:
        """``audio_s`` seconds of the current file read so far, ``text`` recognised so far."""
        grew, self._text = text != self._text, text
        index, name, expected = self._file
        if self.partials and grew and self.json_lines:
            self._json(kind="partial", file=name, text=text, audio_s=round(audio_s, 3))
        elif self.partials and grew and not self.live:
            self._emit(self.stderr, f"partial\t{name}\t{text}")
        progress = self.files > 1 or (expected or 0.0) >= PROGRESS_MIN_AUDIO_S
        if not self.live or not (progress or (self.partials and not self.json_lines)):
            return
        line = f"{name}:"
        if progress:
            total = f"/{expected:.1f}" if expected else ""
            line = f"[{index + 1}/{self.files}] {name} {audio_s:.1f}{total} s"
        width = shutil.get_terminal_size().columns - 1
        if self.partials and not self.json_lines and text:
            room = width - len(line) - 2
            shown = text if len(text) <= room else "…" + text[len(text) - room + 1 :]
            line = f"{line}  {shown}" if room > 1 else line
        self.stderr.write("\r\x1b[K" + line[:width])
        self.stderr.flush()
        self._status_shown = True

    def result(self, name: str, text: str, duration_s: float, processing_s: float, interrupted: bool = False) -> None:
        """A file's final text (or its text so far, ``interrupted``)."""
        if self.json_lines:
            rtf = round(processing_s / duration_s, 4) if duration_s else None
            self._json(
                kind="final",
                file=name,
                text=text,
                duration_s=round(duration_s, 3),
                processing_s=round(processing_s, 4),
                rtf=rtf,
                interrupted=interrupted,
            )
        else:
            mark = f"\t[interrupted at {duration_s:.1f} s]" if interrupted else ""
            self._emit(self.stdout, f"{name}\t{text}{mark}")

    def error(self, name: str, reason: str) -> None:
        self._emit(self.stderr, f"audiomask: error: {name}: {reason}")

    def warnings(self, name: str, path: Path, caught: list[warnings.WarningMessage]) -> None:
        """Print the warnings caught so far as one line each (naming the file), and forget them."""
        for warning in caught:
            message = str(warning.message)
            about = f"{name}: {_reason(message, path)}" if message.startswith(f"{path}: ") else message
            self._emit(self.stderr, f"audiomask: warning: {about}")
        caught.clear()

    def finish(self) -> None:
        self._clear_status()


def _copy_stdin(path: Path) -> None:
    """Stdin's bytes into the file ``path`` (the audio reader seeks, a pipe cannot); once, then reused."""
    if not path.exists():
        if sys.stdin is None or sys.stdin.isatty():
            raise audiomask.AudioError(f"{path}: stdin is a terminal, not audio (pipe a wav file into it)")
        with path.open("wb") as copy:
            shutil.copyfileobj(sys.stdin.buffer, copy)


def _transcribe_file(recognizer: Any, name: str, path: Path, output: _Output) -> None:
    """Stream the file ``path`` through ``recognizer`` one chunk of samples at a time; report as it goes."""
    from audiomask.audio import TruncatedAudioWarning, iter_blocks

    block_samples = recognizer.chunk_ms * SAMPLE_RATE // MS_PER_S
    started = time.perf_counter()
    stream, read = None, 0
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TruncatedAudioWarning)  # one line per file, however often it recurs
            for block in iter_blocks(path, block_samples):
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


def _recognizer(args: argparse.Namespace, device: str) -> Any:
    from audiomask.asr.checkpoint import load_model
    from audiomask.asr.recognizer import StreamingRecognizer

    model = load_model(args.model)
    try:
        return StreamingRecognizer(model, device, args.chunk_ms, args.left_chunks)
    except ValueError as error:
        raise ValueError(f"--chunk-ms/--left-chunks: {error}") from None


def _transcribe(args: argparse.Namespace) -> int:
    import torch

    from audiomask.checks import check_int

    device = _pick_device(args.device)
    torch.set_num_threads(check_int("--threads", args.threads, minimum=1))
    sources = _sources(args.files)
    failed = False
    output = _Output(
        json_lines=args.json, partials=args.partials, files=len(sources), stdout=sys.stdout, stderr=sys.stderr
    )
    with _recognizer(args, device) as recognizer, tempfile.TemporaryDirectory(prefix="audiomask-") as scratch:
        try:
            for index, source in enumerate(sources):
                if source.error is not None:
                    output.error(source.name, source.error)
                    failed = True
                    continue
                path = Path(scratch) / "stdin" if source.path is None else source.path
                try:
                    if source.path is None:
                        _copy_stdin(path)
                    output.start(index, source.name, path)
                    _transcribe_file(recognizer, source.name, path, output)
                except audiomask.AudioError as error:
                    output.error(source.name, _reason(str(error), path))
                    failed = True
        finally:
            output.finish()
    return EXIT_BAD_FILE if failed else EXIT_OK


# -- info --------------------------------------------------------------------------------------


def _summary(value: object, limit: int = 100) -> str:
    """A card value on one line: scalars as they are, the rest as compact JSON, cut at ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


# One row of a model card's training-stage table: the stage's report file, steps and seconds.
_Stage = NamedTuple("_Stage", [("report", str), ("steps", int), ("seconds", float)])


def _training_stages(card_file: Path) -> list[_Stage]:
    """The rows of the ``| stage | report | steps | seconds | ...`` table of ``card_file``, in order; ``[]`` if none."""
    stages: list[_Stage] = []
    columns = None
    try:
        for line in card_file.read_text(encoding="utf-8").splitlines():
            cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
            if columns is None:
                columns = cells if cells[:2] == ["stage", "report"] else None
            elif not line.startswith("|"):
                break
            elif cells[0].isdigit():  # a stage, not the |---| line under the header
                row = dict(zip(columns, cells))
                stages.append(_Stage(row["report"], int(row["steps"].replace(",", "")), float(row["seconds"])))
    except (OSError, UnicodeDecodeError, KeyError, ValueError):  # no card, or a table of another shape
        return []
    return stages


def _card_lines(card: dict, stages: Sequence[_Stage] = ()) -> Iterator[str]:
    """``key: value`` lines of a model card; the fields ``recipes.ctc_small.train`` writes are spelled out.

    ``stages``: the training stages of the card file beside the model; when the
    last is the card's own training, every stage is listed.

    >>> list(_card_lines({"held_out": {"flite": {"offline_full": {"cer": 0.2309}, "streaming_320ms": {"cer": 0.29}}}}))
    ['held_out: flite CER 23.09 % offline, 29.00 % streaming 320 ms']
    >>> list(_card_lines({"training": {"steps": 2664, "train_s": 359.8}, "data": "none: random weights"}))
    ['training: 2,664 steps in 360 s', 'data: none: random weights']
    >>> list(_card_lines({"training": {"steps": 20, "train_s": 3.4}}, [_Stage("a.json", 10, 5), _Stage("b.json", 20, 3)]))
    ['training: 30 steps in 8 s, in 2 stages', '  stage 1: 10 steps in 5 s (a.json)', '  stage 2: 20 steps in 3 s (b.json)']
    >>> list(_card_lines({"data": {"splits": {"train": {"a": {"utterances": 3, "hours": 1.0}}}}}))
    ['data: 3 training utterances (1.0 h: a), 0 held out']
    """
    for key, value in card.items():
        try:
            if key == "held_out":
                rates = []
                for engine, modes in value.items():
                    streaming = next(mode for mode in modes if mode.startswith("streaming_"))
                    ms = streaming.removeprefix("streaming_").removesuffix("ms")
                    rates.append(
                        f"{engine} CER {100 * modes['offline_full']['cer']:.2f} % offline, "
                        f"{100 * modes[streaming]['cer']:.2f} % streaming {ms} ms"
                    )
                yield f"{key}: {'; '.join(rates)}"
                continue
            if key == "training" and stages and stages[-1].steps == value["steps"]:  # the card file is this model's
                total_s = sum(stage.seconds for stage in stages)
                yield f"{key}: {sum(stage.steps for stage in stages):,} steps in {total_s:.0f} s, in {len(stages)} stages"
                for number, stage in enumerate(stages, 1):
                    yield f"  stage {number}: {stage.steps:,} steps in {stage.seconds:.0f} s ({stage.report})"
                continue
            if key == "training":
                yield f"{key}: {value['steps']:,} steps in {value['train_s']:.0f} s"
                continue
            if key == "data":
                train, held = value["splits"]["train"], value["splits"].get("eval", {})
                hours = sum(entry["hours"] for entry in train.values())
                yield (
                    f"{key}: {sum(entry['utterances'] for entry in train.values()):,} training utterances "
                    f"({hours:.1f} h: {', '.join(train)}), "
                    f"{sum(entry['utterances'] for entry in held.values()):,} held out"
                )
                continue
        except (AttributeError, KeyError, StopIteration, TypeError, ValueError):
            pass  # a card of another shape: shown as it is
        yield f"{key}: {_summary(value)}"


def _info_lines(args: argparse.Namespace) -> Iterator[str]:
    import torch
    import torchaudio

    from audiomask.asr.checkpoint import model_info

    device = _pick_device(args.device)
    yield "versions"
    for name, version in (
        ("audiomask", audiomask.__version__),
        ("torch", torch.__version__),
        ("torchaudio", torchaudio.__version__),
        ("numpy", np.__version__),
        ("python", platform.python_version()),
    ):
        yield f"  {name:<12}{version}"
    yield "device"
    cuda = device.startswith("cuda")
    yield f"  {'name':<12}{device} ({torch.cuda.get_device_name(device) if cuda else f'{os.cpu_count()} cores'})"
    info = model_info(args.model)
    config = info["encoder_config"]
    yield "model"
    yield f"  {'path':<12}{info['path']} ({info['size_bytes'] / 2**20:.1f} MiB, {'/'.join(info['dtypes'])})"
    yield f"  {'format':<12}{info['format']}"
    yield (
        f"  {'encoder':<12}Phi-4MM Conformer: {config['num_blocks']} blocks of {config['hidden_size']}, "
        f"{config['num_attention_heads']} heads, feed-forward {config['intermediate_size']}, "
        f"{config['time_reduction'] * FRAME_MS} ms per token"
    )
    yield f"  {'parameters':<12}{info['parameters']:,}"
    yield f"  {'alphabet':<12}{len(info['alphabet'])} characters + blank: {info['alphabet']!r}"
    card_file = Path(info["path"]).with_name(MODEL_CARD_NAME)
    stages = _training_stages(card_file)
    for index, line in enumerate(_card_lines(info["card"] or {"(none)": ""}, stages)):
        yield f"  {'card' if index == 0 else '':<12}{line}"
    if card_file.is_file():  # the shipped model's: every training stage, error rates per chunk size
        yield f"  {'':<12}the whole card: {card_file}"
    yield "settings"
    chunk = info["chunk_ms"]
    yield f"  {'chunk_ms':<12}{chunk if chunk is not None else 'none (give --chunk-ms: the model attends fully)'}"
    left = info["left_chunks"]
    context = f" ({left * chunk} ms of left context)" if chunk is not None else ""
    yield f"  {'left_chunks':<12}{left}{context}"
    yield f"  {'threads':<12}{TRANSCRIBE_THREADS} (torch threads of transcribe: --threads)"


def _info(args: argparse.Namespace) -> int:
    for line in _info_lines(args):  # printed as produced: a bad model still shows the versions and device
        print(line, flush=True)
    return EXIT_OK


# -- bench -------------------------------------------------------------------------------------


def _bench(argv: Sequence[str]) -> int:
    """Forward ``argv`` to :func:`audiomask.bench.latency.main`."""
    try:
        from audiomask.bench.latency import main as bench_main
    except ModuleNotFoundError as error:
        if error.name not in ("audiomask.bench", "audiomask.bench.latency"):
            raise
        raise ValueError("bench: the latency benchmark (audiomask.bench.latency) is not in this install") from None
    return bench_main(list(argv))


# -- demo --------------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    import torch

    from audiomask.transfer import PinnedRing, to_device

    device = _pick_device(args.device)
    where = torch.cuda.get_device_name(device) if device.startswith("cuda") else "host memory, no GPU"
    print(f"audiomask {audiomask.__version__} demo on {device} ({where})")

    frames = np.array([round(s * FRAMES_PER_SECOND) for s in DEMO_UTTERANCES_S], dtype=np.int64)
    max_frames = int(frames.max())
    tokens = int(phi4mm.subsampled_lengths([max_frames])[0])
    print(
        f"\nPhi-4MM hidden-state mask: {len(frames)} utterances of {', '.join(f'{s} s' for s in DEMO_UTTERANCES_S)}"
        f" -> (B, T_q, T_k) = ({len(frames)}, {tokens}, {tokens}) bool, chunks of {DEMO_CHUNK_TOKENS} tokens"
        f" ({DEMO_CHUNK_TOKENS * phi4mm.TOKEN_MS} ms), {DEMO_LEFT_CHUNKS} chunks of left context"
    )
    ring = PinnedRing()
    shape = (len(frames), tokens, tokens)
    with ring.stage(shape, np.bool_) as staged:
        start = time.perf_counter()
        phi4mm.hs_mask(frames, max_frames, DEMO_CHUNK_TOKENS, DEMO_LEFT_CHUNKS, out=staged.array)
        built = time.perf_counter()
        device_mask = staged.to(device)
        submitted = time.perf_counter()
    print(
        f"  built in place in a {'pinned' if ring.stats().pinned else 'host'} ring slot in"
        f" {(built - start) * 1e3:.3f} ms, submitted to {device} in {(submitted - built) * 1e3:.3f} ms of host time"
    )

    windows = qwen3_asr.cu_seqlens(frames)
    device_windows = to_device(windows, device, ring=ring)
    print(
        f"\nQwen3-ASR attention windows of the same batch ({qwen3_asr.WINDOW_TOKENS} tokens each):"
        f"\n  tokens per utterance {qwen3_asr.output_lengths(frames).tolist()}"
        f"\n  cu_seqlens {windows.tolist()}"
    )

    expected = phi4mm.hs_mask(frames, max_frames, DEMO_CHUNK_TOKENS, DEMO_LEFT_CHUNKS)
    same = np.array_equal(device_mask.cpu().numpy(), expected) and np.array_equal(device_windows.cpu().numpy(), windows)
    print(f"\ncopies on {device} equal their host source: {'yes' if same else 'NO'}")
    stats = ring.stats()
    print(
        f"ring: {stats.copies} copies, {stats.bytes_copied} bytes, {stats.slot_waits} slot waits,"
        f" {stats.pinned_bytes} {'pinned ' if stats.pinned else ''}bytes held"
    )
    example = phi4mm.hs_mask([40, 17], 40, chunk_size=2, left_chunk=1)[1]
    print("\nA small one: hs_mask([40, 17], max_frames=40, chunk_size=2, left_chunk=1)[1], rows = queries:")
    print("\n".join("    " + "".join("1" if v else "0" for v in row) for row in example))
    return 0 if same else 1


# -- the parser --------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audiomask", description=_plain(__doc__.splitlines()[0]))
    parser.add_argument("--version", action="version", version=f"audiomask {audiomask.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    device_help = "auto (default: cuda when available), cpu, cuda or cuda:N"
    model_help = (
        "a model file written by audiomask.asr.checkpoint.save_model (default: the model shipped in the package)"
    )

    transcribe = commands.add_parser(
        "transcribe",
        help="transcribe audio files (streamed chunk by chunk)",
        description=_plain("\n\n".join(__doc__.split("\n\n")[1:4])),  # what it prints, partials, exit status
        formatter_class=argparse.RawDescriptionHelpFormatter,  # paragraphs kept as _plain filled them
    )
    transcribe.add_argument("files", nargs="+", metavar="FILE", help="audio files, directories of them, or - (stdin)")
    transcribe.add_argument("--device", default="auto", help=device_help)
    transcribe.add_argument(
        "--chunk-ms", type=int, help="audio per encoder chunk, a multiple of one token (default: the model's)"
    )
    transcribe.add_argument("--left-chunks", type=int, help="chunks of left context (default: the model's)")
    transcribe.add_argument("--json", action="store_true", help="JSON lines instead of FILE<TAB>TEXT")
    transcribe.add_argument("--partials", action="store_true", help="show the text while each file is transcribed")
    transcribe.add_argument("--model", help=model_help)
    transcribe.add_argument(
        "--threads",
        type=int,
        default=TRANSCRIBE_THREADS,
        help=f"torch threads for the encoder (default {TRANSCRIBE_THREADS}: faster for single-stream chunks)",
    )
    transcribe.set_defaults(run=_transcribe)

    info = commands.add_parser("info", help="print the model, device, versions and streaming settings")
    info.add_argument("--model", help=model_help)
    info.add_argument("--device", default="auto", help=device_help)
    info.set_defaults(run=_info)

    # Parsed by main itself (its arguments belong to the benchmark); listed here for --help.
    commands.add_parser("bench", help="the streaming latency benchmark (audiomask bench --help for its options)")

    demo = commands.add_parser("demo", help="build masks in numpy and move them to the best device")
    demo.add_argument("--device", default="auto", help=device_help)
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 success, 1 a bad file or failed check, 2 a user error, 130 Ctrl-C)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["bench"]:
            return _bench(argv[1:])
        args = _parser().parse_args(argv)
        return args.run(args)
    except ValueError as error:
        print(f"audiomask: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("audiomask: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`audiomask transcribe ... | head`): not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
