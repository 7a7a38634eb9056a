"""recipes.ctc_small.cli: the steps' shared parser, count checks and recorded command."""

from __future__ import annotations

import doctest

import pytest

from recipes.ctc_small import cli


def test_doctests() -> None:
    assert doctest.testmod(cli).failed == 0


def test_a_count_below_one_is_a_usage_error_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.step_parser("recipes.ctc_small.x", "A step.")
    parser.add_argument("--eval-per-engine", type=int)
    parser.add_argument("--limit", type=int)
    args = parser.parse_args(["--eval-per-engine", "0"])
    with pytest.raises(SystemExit) as exited:
        cli.check_counts(parser, args, ("eval_per_engine", "limit"))
    assert exited.value.code == 2
    assert "--eval-per-engine must be >= 1, got 0" in capsys.readouterr().err
    cli.check_counts(parser, parser.parse_args(["--limit", "1"]), ("eval_per_engine", "limit"))  # None: not given


def test_the_recorded_command_reruns_the_step_as_a_module() -> None:
    environment = cli.recorded_environment("recipes.ctc_small.train", ["--corpus", "c", "--steps", "2"])
    assert environment["argv"] == ["-m", "recipes.ctc_small.train", "--corpus", "c", "--steps", "2"]
    assert environment["command"].endswith(" -m recipes.ctc_small.train --corpus c --steps 2")
