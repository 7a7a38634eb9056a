"""The transfer benchmark's busy_steady state, its queue feed and its verdicts, without a GPU (stand-ins)."""

from __future__ import annotations

import argparse
import itertools

import pytest
import torch

from audiomask.bench import copy_timing, transfer_verdicts
from audiomask.bench import transfer as bench
from audiomask.bench.harness import HostWorkload, QueueFeed
from audiomask.transfer import KiB, MiB

# --------------------------------------------------------------------------- QueueFeed


class FakeEvent:
    """A CUDA event whose completion the test decides."""

    def __init__(self) -> None:
        self.done = False
        self.records = 0

    def record(self, stream: object) -> None:
        self.done = False
        self.records += 1

    def query(self) -> bool:
        return self.done


class FakeFiller:
    def __init__(self) -> None:
        self.fills: list[float] = []

    def fill(self, ms: float, stream: object = None) -> None:
        self.fills.append(ms)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[FakeEvent]:
    made: list[FakeEvent] = []

    def event() -> FakeEvent:
        made.append(FakeEvent())
        return made[-1]

    monkeypatch.setattr(torch.cuda, "Event", event)
    return made


def test_feed_tops_up_to_its_depth_and_counts_only_whole_queued_pieces(events: list[FakeEvent]) -> None:
    filler = FakeFiller()
    feed = QueueFeed(filler, "stream", depth_ms=5.0, piece_ms=1.0)  # type: ignore[arg-type]
    assert feed.queued_ms() == 0.0
    assert feed.top_up() is True  # never fed: the queue was drained
    assert filler.fills == [1.0] * 6  # 5 queued behind the one that may be running
    assert feed.queued_ms() == 5.0
    for event in events[:3]:
        event.done = True  # three pieces ran
    assert feed.queued_ms() == 2.0
    assert feed.top_up() is False  # work was still queued: the GPU never went idle
    assert len(filler.fills) == 9 and feed.queued_ms() == 5.0
    assert len(events) == 6  # the three completed pieces' events were recorded again, none made
    for event in events:
        event.done = True
    assert feed.top_up() is True  # everything ran before this top-up: the GPU went idle
    assert feed.queued_ms() == 5.0


@pytest.mark.parametrize(
    ("depth_ms", "piece_ms", "message"),
    [(0.0, 1.0, "depth_ms must be > 0, got 0.0"), (5.0, 6.0, r"piece_ms must be > 0 and <= depth_ms \(5.0\), got 6.0")],
)
def test_feed_rejects_bad_arguments(depth_ms: float, piece_ms: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QueueFeed(FakeFiller(), "stream", depth_ms, piece_ms)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- steady_pass


class FakeStream:
    def __init__(self, busy: bool = True) -> None:
        self.busy = busy

    def query(self) -> bool:
        return not self.busy


class ScriptedFeed:
    """A feed whose top-ups report drained queues and whose depths follow a script."""

    def __init__(self, depth_ms: float, drained: list[bool], depths: list[float]) -> None:
        self.depth_ms = depth_ms
        self.stream = FakeStream()
        self._drained = iter(drained)
        self._depths = iter(depths)
        self.top_ups = 0

    def top_up(self) -> bool:
        self.top_ups += 1
        return next(self._drained, False)

    def queued_ms(self) -> float:
        return next(self._depths)


def counting_strategy() -> tuple[copy_timing.Strategy, list[int]]:
    calls: list[int] = []
    return copy_timing.Strategy("count", False, lambda case, stream, state: calls.append(len(calls))), calls


def test_steady_pass_warms_up_for_queue_depths_and_records_the_depth_before_each_copy() -> None:
    strategy, calls = counting_strategy()
    depth_ms = 20.0  # warm-up: at least 2 depths (40 ms) of untimed repetitions
    feed = ScriptedFeed(depth_ms, drained=[True], depths=itertools.count(100.0))  # type: ignore[arg-type]
    row = copy_timing.steady_pass(strategy, None, 5, 1, feed, HostWorkload("cpu"))  # type: ignore[arg-type]
    assert row["untimed_reps"] >= 1 and len(calls) == row["untimed_reps"] + 5
    assert feed.top_ups == len(calls) + 1  # once to start the feed, then before every copy
    first_timed_depth = 100.0 + row["untimed_reps"]
    assert row["queue_ms_min"] == first_timed_depth  # the depths of timed copies only
    assert row["queue_ms_p50"] == first_timed_depth + 2
    assert row["gpu_idle_gaps"] == 0  # the only drained top-up started the feed
    assert row["queue_still_busy"] == 1.0
    assert 0 < row["host_ms_p50"] <= row["host_ms_p99"]


def test_steady_pass_counts_gpu_idle_gaps_in_timed_repetitions() -> None:
    strategy, _ = counting_strategy()
    feed = ScriptedFeed(1e-3, drained=[True] * 100, depths=itertools.repeat(50.0))  # drains before every copy
    feed.stream.busy = False  # and every copy waited for the queue
    row = copy_timing.steady_pass(strategy, None, 4, 2, feed, HostWorkload("cpu"))  # type: ignore[arg-type]
    assert row["untimed_reps"] == 2
    assert row["gpu_idle_gaps"] == 4
    assert row["queue_still_busy"] == 0.0


# --------------------------------------------------------------------------- verdicts


def synthetic_entries(sizes: tuple[int, ...], host_ms: dict[tuple[str, str], float]) -> list[dict]:
    """Entries of every strategy and floor, size and state: ``host_ms[(strategy, state)]``, else 0.02 ms for
    pin_per_copy and pageable, 0.005 ms for ring_in_place and 0.01 ms for the others: every check passes."""
    entries = []
    default_ms = {"pin_per_copy": 0.02, "pageable": 0.02, "ring_in_place": 0.005}
    for n, name, state in itertools.product(sizes, bench.STRATEGIES + bench.FLOORS, bench.CONDITIONS):
        ms = host_ms.get((name, state), default_ms.get(name, 0.01))
        if name == "pageable" and n >= transfer_verdicts.STALL_FROM_BYTES and bench.CONDITIONS[state].busy:
            ms = 50.0
        entry = {
            "strategy": name,
            "bytes": n,
            "gpu_state": state,
            "condition": state,
            "busy_gpu": bench.CONDITIONS[state].busy,
            "host_ms_p50": ms,
            "host_ms_p99": ms,
        }
        if bench.CONDITIONS[state].busy:
            entry["queue_still_busy"] = 1.0
        if bench.CONDITIONS[state].steady:
            entry.update(queue_ms_min=49.0, gpu_idle_gaps=0)
        entries.append(entry)
    return entries


STEADY_SUBMIT = f"ring_in_place submit under {transfer_verdicts.OVERHEAD_BOUND_MS} ms at every size (busy_steady, p50)"
HOT_SUBMIT = (
    f"ring_in_place submit under {transfer_verdicts.OVERHEAD_BOUND_MS} ms at every size "
    f"(busy_hot: {copy_timing.SETTLE_MS:g} ms after work is queued on an idle GPU; reported, p50)"
)
NEVER_WAITED = "no audiomask copy waited for the GPU queue, at any size (busy_steady)"
NEGATIVE_CONTROL = "pageable non_blocking >= 4 MiB waits for the GPU queue (busy_steady; negative control)"
IN_PLACE_P99 = "ring_in_place host p99 <= 0.1 ms with the GPU busy (busy_steady), payloads <= 1 MiB"
IN_PLACE_LOWEST = "ring_in_place has the lowest host p99 of all strategies from 64 KiB (busy_steady)"


def held_key(found: dict) -> str:
    (key,) = [key for key in found if key.startswith("busy_steady held")]
    return key


def test_verdicts_judge_busy_steady_and_report_busy_hot_beside_it() -> None:
    sizes = (16 * KiB, 4 * MiB)
    found = bench.verdicts(synthetic_entries(sizes, {("ring_in_place", "busy_hot"): 0.2}), 50.0)
    assert found[STEADY_SUBMIT]["ok"] is True
    assert set(found[STEADY_SUBMIT]["submit ms"]) == {f"{n}/busy_steady" for n in sizes}
    assert found[HOT_SUBMIT]["ok"] is False  # visible, and not what the guarantees are judged on
    assert found[IN_PLACE_P99]["ok"] is True and found[IN_PLACE_LOWEST]["ok"] is True
    assert found[held_key(found)]["ok"] is True


def test_verdicts_fail_when_busy_steady_fails() -> None:
    found = bench.verdicts(synthetic_entries((16 * KiB, 64 * KiB), {("ring_in_place", "busy_steady"): 0.2}), 50.0)
    assert found[STEADY_SUBMIT]["ok"] is False
    assert found[IN_PLACE_P99]["ok"] is False
    assert found[IN_PLACE_LOWEST]["ok"] is False  # 0.2 ms against 0.01 for ring at 64 KiB
    assert found[IN_PLACE_LOWEST]["ms"].keys() == {64 * KiB}  # judged from 64 KiB only


def test_guarantees_fail_on_a_copy_that_waited_and_on_a_pageable_copy_that_did_not() -> None:
    entries = synthetic_entries((4 * MiB,), {})
    steady = {e["strategy"]: e for e in entries if e["gpu_state"] == "busy_steady"}
    steady["ring"]["queue_still_busy"] = 0.99  # one copy in a hundred waited for the queue
    steady["pageable"]["host_ms_p50"] = 0.5  # the negative control no longer stalls
    found = transfer_verdicts.guarantees(entries, 50.0)
    assert found[NEVER_WAITED]["ok"] is False and found[NEGATIVE_CONTROL]["ok"] is False
    assert transfer_verdicts.guarantees(synthetic_entries((1 * MiB,), {}), 50.0)[NEGATIVE_CONTROL]["ok"] is None


@pytest.mark.parametrize(("field", "value"), [("queue_ms_min", 10.0), ("gpu_idle_gaps", 1)])
def test_verdicts_say_when_busy_steady_did_not_hold(field: str, value: float) -> None:
    entries = synthetic_entries((16 * KiB,), {})
    next(e for e in entries if e["gpu_state"] == "busy_steady" and e["strategy"] == "ring")[field] = value
    found = bench.verdicts(entries, 50.0)
    assert found[held_key(found)]["ok"] is False


@pytest.mark.parametrize("size", [64 * KiB, 4 * MiB])
def test_verdicts_forgive_the_negative_control_draining_the_queue(size: int) -> None:
    entries = synthetic_entries((size,), {})
    pageable = next(e for e in entries if e["gpu_state"] == "busy_steady" and e["strategy"] == "pageable")
    pageable.update(gpu_idle_gaps=30, queue_still_busy=0.5, queue_ms_min=12.0)  # some of its copies waited
    found = bench.verdicts(entries, 50.0)
    assert found[held_key(found)]["ok"] is True


# --------------------------------------------------------------------------- --sizes


def test_parse_size_refuses_what_the_in_place_mask_cannot_fill() -> None:
    assert bench.parse_size("48K") == 48 * KiB and bench.parse_size("2m") == 2 * MiB
    for text, message in (("3K", "multiple of 16K"), ("1536K", "multiple of 1024K"), ("big", "number of bytes")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            bench.parse_size(text)


def test_every_verdict_passes_on_entries_that_meet_them() -> None:
    found = bench.verdicts(synthetic_entries((16 * KiB, 4 * MiB), {}), 50.0)
    assert {key: value["ok"] for key, value in found.items() if value["ok"] is not True} == {}


def test_latency_verdicts_judge_the_transfer_guarantees_in_busy_steady() -> None:
    from audiomask.bench import latency

    entries = synthetic_entries((16 * KiB, 4 * MiB), {("ring_in_place", "busy_hot"): 0.3})
    found = latency.verdicts({"transfer": entries, "pipeline": {}, "throughput": [], "settings": {}})
    in_place = {key: value["ok"] for key, value in found.items() if key.startswith("ring_in_place host p99")}
    assert in_place == {
        IN_PLACE_P99: True,
        "ring_in_place host p99 <= 0.1 ms with the GPU busy (busy_hot; reported), payloads <= 1 MiB": False,
        "ring_in_place host p99 <= 0.1 ms with the GPU busy (busy; reported), payloads <= 1 MiB": True,
    }
    assert found[NEVER_WAITED]["ok"] and found[NEGATIVE_CONTROL]["ok"] and found[IN_PLACE_LOWEST]["ok"]
    assert not any(key.startswith("ring has the lowest") for key in found)
