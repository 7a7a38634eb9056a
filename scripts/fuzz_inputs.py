"""Fuzz the audio reader and the mask builders with hypothesis: the CI properties, for many more examples.

Runs every case of ``tests/test_hostile_audio.HOSTILE_FILES`` (random bytes,
13 formats cut short, header fields overwritten with extreme values, flipped
bytes, NaN/Inf/huge and denormal samples) through :func:`audiomask.audio.load`
and :func:`~audiomask.audio.iter_blocks`, and every builder of
``tests/test_hostile_masks.BUILDERS`` with hostile arguments, ``--examples``
times each. An execution fails when it raises anything but the documented
``AudioError`` / ``ValueError`` (``MemoryError`` included: each runs in an
address space only 512 MiB above the process's), gives a wrong result, or
runs longer than ``HANG_SECONDS`` (a hang). Hypothesis shrinks each failure
to a minimal example, which the report records.

    python scripts/fuzz_inputs.py --examples 5000 --out bench/results/fuzz_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from _benchenv import capture_environment, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the properties live with the tests

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from test_hostile_audio import HOSTILE_FILES, check_hostile_file
from test_hostile_masks import (
    BUILDERS,
    FUZZ_MASK_BYTES,
    bounded_address_space,
    check_builder_call,
    mask_bound,
)

HANG_SECONDS = 20  # one execution: a few ms normally, ~0.2 s at worst (a 16 MiB resampling filter)


class HangError(Exception):
    """An execution ran longer than HANG_SECONDS."""


@contextlib.contextmanager
def hang_alarm(seconds: int) -> Iterator[None]:
    """Raise :class:`HangError` in the main thread if the block runs longer than ``seconds``."""

    def expire(signum: int, frame: object) -> None:
        raise HangError(f"execution ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def fuzz(name: str, strategy: st.SearchStrategy, check: Callable[[object], object], examples: int, seed: int) -> dict:
    """Run ``check`` on ``examples`` drawn values (plus shrinking after a failure); the target's report."""
    executions = 0

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=True
    )
    @given(drawn=strategy)
    def target(drawn: object) -> None:
        nonlocal executions
        executions += 1
        with hang_alarm(HANG_SECONDS):
            check(drawn)

    started = time.perf_counter()
    failure = None
    try:
        target()
    except Exception as error:  # noqa: BLE001 (hypothesis re-raises the shrunk failure: record it, go on)
        failure = "".join(traceback.format_exception_only(type(error), error)).strip()[-4000:]
    seconds = time.perf_counter() - started
    print(f"{name:45s} {executions:7d} executions {seconds:7.1f} s {'FAILED' if failure else 'ok'}", flush=True)
    return {
        "target": name,
        "executions": executions,
        "failed": failure is not None,
        "failure": failure,
        "seconds": seconds,
    }


def check_mask(name: str) -> Callable[[dict], object]:
    def check(arguments: dict) -> object:
        with mask_bound(FUZZ_MASK_BYTES), bounded_address_space():
            return check_builder_call(name, arguments)

    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="examples per target (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--only", default="", help="run only the targets whose name contains this")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny calls: threads only spin (see tests/encoder_models.torch_one_thread)

    started = time.perf_counter()
    reports = []
    with tempfile.TemporaryDirectory(prefix="audiomask-fuzz-") as scratch:
        directory = Path(scratch)
        targets = [
            (f"load: {case}", strategy, lambda drawn: check_hostile_file(drawn, directory))
            for case, strategy in HOSTILE_FILES.items()
        ]
        targets += [(f"mask: {name}", strategy, check_mask(name)) for name, (_, strategy, _) in BUILDERS.items()]
        for name, strategy, check in targets:
            if args.only in name:
                reports.append(fuzz(name, strategy, check, args.examples, args.seed))
    executions = sum(r["executions"] for r in reports)
    failures = sum(r["failed"] for r in reports)
    seconds = time.perf_counter() - started
    print(f"total: {executions} executions, {failures} failed targets, {seconds:.0f} s")
    if args.out is not None:
        write_result(
            args.out,
            {
                **capture_environment(sys.argv if argv is None else ["scripts/fuzz_inputs.py", *argv]),
                "examples_per_target": args.examples,
                "seed": args.seed,
                "hang_seconds": HANG_SECONDS,
                "executions": executions,
                "failures": failures,
                "seconds": seconds,
                "targets": reports,
            },
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
