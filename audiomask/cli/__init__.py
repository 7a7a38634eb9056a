"""The ``audiomask`` command line: transcribe audio files, describe the model, benchmark, demo.

``audiomask transcribe FILE...`` streams each file through the
:class:`~audiomask.asr.recognizer.StreamingRecognizer` (one encoder chunk of audio
at a time, as a live source would arrive) and prints ``FILE<TAB>TEXT`` lines
on stdout, in argument order; in ``FILE``, a backslash, tab, newline or
carriage return is written ``\\\\``, ``\\t``, ``\\n``, ``\\r``. ``-`` reads a
WAV (or AU, AIFF) from stdin, as it arrives; so are named pipes, process
substitutions (``<(...)``) and character devices; a directory stands for
its audio files (sorted, not recursive). ``--json`` prints one
JSON object a line instead: ``{"kind": "final", "file", "text", "duration_s",
"processing_s", "rtf", "interrupted"}`` (``rtf`` = processing / audio time).

``--partials`` shows the text while a file is being transcribed: with
``--json``, as ``{"kind": "partial", "file", "text", "audio_s"}`` lines on
stdout before the file's final line (``audio_s``: seconds read so far);
without, on stderr: one live line on a terminal, else a line
``partial<TAB>FILE<TAB>TEXT`` each time the text grows. On a terminal, stderr
also shows a progress line for several files or a long one.

Exit status: 0 all files transcribed; 1 a file could not be transcribed (one line
``audiomask: error: FILE: reason`` on stderr each, the other files are still
transcribed; a file whose data ends early is transcribed with a line
``audiomask: warning: FILE: ...``); 2 a bad argument or model (one line
``audiomask: error: ...``; also when stdout is closed), or when the
results cannot be written (stdout full or failing: one line on stderr);
130 interrupted (Ctrl-C), 143 terminated (SIGTERM: ``kill``, ``timeout``):
the lines already printed stay, and the file in progress gets its text so
far, marked ``[interrupted at S s]`` in a third column (``"interrupted":
true`` in JSON). Never a traceback for user errors.

``audiomask info`` prints the model, device, versions and streaming settings,
and every training stage the model card next to the model file lists;
``audiomask bench ARGS...`` runs the latency benchmark
(:mod:`audiomask.bench.latency`); ``audiomask demo`` builds the masks of a
small Phi-4MM and Qwen3-ASR batch in numpy, writes them straight into a
pinned ring slot and moves them to the best device.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import audiomask
from audiomask.cli.common import EXIT_OK, EXIT_USAGE, OutputError, plain
from audiomask.cli.demo import bench
from audiomask.cli.demo import demo as run_demo
from audiomask.cli.info import info as run_info
from audiomask.cli.serve import add_parser as add_serve_parser
from audiomask.cli.transcribe import TRANSCRIBE_THREADS, exit_status
from audiomask.cli.transcribe import transcribe as run_transcribe

__all__ = ["TRANSCRIBE_THREADS", "main"]

STANDARD_FDS = (0, 1, 2)  # stdin, stdout, stderr


# -- the parser --------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audiomask", description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--version", action="version", version=f"audiomask {audiomask.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    device_help = "auto (default: cuda when available), cpu, cuda or cuda:N"
    model_help = (
        "a model file written by audiomask.asr.checkpoint.save_model (default: the model shipped in the package), "
        "or the directory of a Qwen3-ASR or Phi-4-multimodal checkpoint"
    )

    transcribe_parser = commands.add_parser(
        "transcribe",
        help="transcribe audio files (streamed chunk by chunk)",
        description=plain("\n\n".join(__doc__.split("\n\n")[1:4])),  # what it prints, partials, exit status
        formatter_class=argparse.RawDescriptionHelpFormatter,  # paragraphs kept as _plain filled them
    )
    transcribe_parser.add_argument(
        "files", nargs="+", metavar="FILE", help="audio files, directories of them, or - (stdin)"
    )
    transcribe_parser.add_argument("--device", default="auto", help=device_help)
    transcribe_parser.add_argument(
        "--chunk-ms", type=int, help="audio per encoder chunk, a multiple of one token (default: the model's)"
    )
    transcribe_parser.add_argument("--left-chunks", type=int, help="chunks of left context (default: the model's)")
    transcribe_parser.add_argument("--json", action="store_true", help="JSON lines instead of FILE<TAB>TEXT")
    transcribe_parser.add_argument(
        "--partials", action="store_true", help="show the text while each file is transcribed"
    )
    transcribe_parser.add_argument("--model", help=model_help)
    transcribe_parser.add_argument(
        "--context", default="", help="text an LLM recogniser is told first: names and terms it should prefer"
    )
    transcribe_parser.add_argument(
        "--language", help="the language an LLM recogniser writes (a name or ISO code; default: it detects)"
    )
    transcribe_parser.add_argument(
        "--threads",
        type=int,
        default=TRANSCRIBE_THREADS,
        help=f"torch threads for the encoder (default {TRANSCRIBE_THREADS}: faster for single-stream chunks)",
    )
    transcribe_parser.set_defaults(run=run_transcribe)

    info_parser = commands.add_parser("info", help="print the model, device, versions and streaming settings")
    info_parser.add_argument("--model", help=model_help)
    info_parser.add_argument("--device", default="auto", help=device_help)
    info_parser.set_defaults(run=run_info)

    # Parsed by main itself (its arguments belong to the benchmark); listed here for --help.
    commands.add_parser("bench", help="the streaming latency benchmark (audiomask bench --help for its options)")

    demo_parser = commands.add_parser("demo", help="build masks in numpy and move them to the best device")
    demo_parser.add_argument("--device", default="auto", help=device_help)
    demo_parser.set_defaults(run=run_demo)

    add_serve_parser(commands, device_help, model_help)
    return parser


def _reopen_closed_fds() -> None:
    """Put ``/dev/null`` on standard descriptors the caller closed (``>&-``), so no file opened later takes them."""
    for fd in STANDARD_FDS:
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: ``fd`` itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _error(message: str) -> None:
    """``audiomask: error: MESSAGE`` on stderr where it can be written (nowhere when stderr is closed or full)."""
    try:
        print(f"audiomask: error: {message}", file=sys.stderr, flush=True)
    except (AttributeError, OSError):
        pass


def _quiet_stdout() -> None:
    """Point stdout at ``/dev/null``: the interpreter's final flush of a dead stdout stays quiet."""
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until the interpreter exits


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status.

    0 success, 1 a bad file or a failed check, 2 a user error or results
    that cannot be written (stdout closed, full or failing), 128 + N ended
    by signal N (130 Ctrl-C, 143 SIGTERM).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _reopen_closed_fds()
    if sys.stderr is None:  # started with stderr closed: diagnostics go nowhere, results still come
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives until the interpreter exits
    if sys.stdout is None:
        _error("stdout is closed: nowhere to write the results")
        return EXIT_USAGE
    try:
        if argv[:1] == ["bench"]:
            return bench(argv[1:])
        args = _parser().parse_args(argv)
        return args.run(args)
    except ValueError as error:
        _error(str(error))
        return EXIT_USAGE
    except KeyboardInterrupt as interrupt:
        try:
            print("audiomask: interrupted", file=sys.stderr, flush=True)
        except OSError:
            pass
        return exit_status(interrupt)
    except OutputError as error:
        _error(str(error))
        _quiet_stdout()
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`audiomask transcribe ... | head`): not an error of ours
        _quiet_stdout()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
