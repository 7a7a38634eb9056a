"""What every benchmark result records about its machine."""

from __future__ import annotations

import itertools

import pytest

from audiomask.bench import environment


def test_python_speed_is_the_fastest_rounds_loops_per_second_in_millions(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rounds of 0.5, 0.2 and 0.4 s (a clock read at each round's start and end).
    clock = itertools.chain.from_iterable((start, start + length) for start, length in ((0, 0.5), (1, 0.2), (2, 0.4)))
    monkeypatch.setattr(environment.time, "perf_counter", lambda: next(clock))
    assert environment.python_speed(loops=1_000_000, rounds=3) == 5.0  # 1e6 loops in the fastest 0.2 s


def test_the_environment_records_the_cores_python_speed() -> None:
    recorded = environment.capture_environment(["script.py"])
    assert recorded["python_speed_mloops_s"] > 0
    assert recorded["command"].endswith("script.py")
