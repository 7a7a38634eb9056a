"""What every step's command line shares: its parser, its count checks, its error exit, its recorded command.

A step is a module run as ``python -m recipes.ctc_small.<step>``; its reports record that command
(:func:`recorded_environment`), so each one reruns from the repository root as written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from audiomask.bench.environment import capture_environment

__all__ = ["check_counts", "recorded_environment", "run_step", "step_parser"]


def step_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m module``, described by the first paragraph of the module's docstring ``doc``.

    >>> step_parser("recipes.ctc_small.card", "Render the card.\\n\\nMore.").format_usage()
    'usage: python -m recipes.ctc_small.card [-h]\\n'
    """
    return argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def check_counts(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str]) -> None:
    """A usage error (exit status 2) naming the option when one of ``names`` is given below 1."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def run_step(
    step: Callable[[argparse.Namespace, Sequence[str]], int],
    parse_args: Callable[[Sequence[str]], argparse.Namespace],
    argv: Sequence[str] | None,
    name: str,
) -> int:
    """``step(parse_args(argv), argv)``, ``argv`` defaulting to the command line; a ``ValueError`` exits naming it.

    >>> def fail(args, argv):
    ...     raise ValueError("--corpus 'x': no manifest")
    >>> run_step(fail, lambda argv: None, [], "train")
    Traceback (most recent call last):
    SystemExit: train: error: --corpus 'x': no manifest
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return step(parse_args(argv), argv)
    except ValueError as error:
        raise SystemExit(f"{name}: error: {error}") from None


def recorded_environment(module: str, argv: Sequence[str]) -> dict:
    """The environment a report records (:func:`audiomask.bench.environment.capture_environment`), its command
    ``python -m module argv...``."""
    return capture_environment(["-m", module, *argv])
