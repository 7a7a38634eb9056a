"""The churn soak of the recognizer, scaled down: streams of every kind from several threads on few slots."""

from __future__ import annotations

import pytest

import bench.churn as churn
from bench.churn import CLIPS, DROPPED_KINDS, KINDS, plan_streams, run_churn

FINISH_TIMEOUT_S = 20.0  # a finish that waits this long waits for other streams: an error, not a hang
DEADLINE_S = 120.0  # the whole soak: bounded, however the recognizer behaves


@pytest.mark.parametrize(
    ("streams", "threads", "max_streams"),
    [
        (150, 4, 8),  # two streams open per thread, interleaved: as many open as there are slots
        (40, 4, 2),  # one stream per thread, twice as many as slots: streams wait for slots, in any order
    ],
)
def test_every_finished_stream_gets_its_text_and_no_call_fails(streams: int, threads: int, max_streams: int) -> None:
    """Never-fed, dropped, slow and normal streams interleaved: every finish returns the clip's own text."""
    report = run_churn(
        streams, threads, max_streams, finish_timeout_s=FINISH_TIMEOUT_S, max_errors=1, deadline_s=DEADLINE_S
    )
    errors = [(error["kind"], error["call"], error["error"]) for error in report["error_examples"]]
    assert report["errors"] == 0, errors
    assert report["mismatches"] == 0, report["mismatch_examples"]
    assert report["aborted"] is None and report["hung_threads"] == 0
    assert report["streams_done"] == streams
    for kind, counts in report["kinds"].items():
        assert counts["planned"] > 0, kind
        ended = "dropped" if kind in DROPPED_KINDS else "finished"
        assert counts[ended] == counts["planned"], (kind, counts)


def test_a_wrong_reference_counts_every_finished_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The soak's check can fail: with references no clip has, every finished stream is a mismatch."""

    def wrong_references(audio: object, device: str, max_streams: int) -> tuple[list[str], str, list[float]]:
        return ["not this clip's text"] * CLIPS, "not empty", [0.0] * CLIPS

    monkeypatch.setattr(churn, "reference_texts", wrong_references)
    report = run_churn(12, 2, 2, kinds=("normal", "never_fed_finish"), open_per_thread=1, deadline_s=DEADLINE_S)
    assert report["errors"] == 0, report["error_examples"]
    assert report["finished"] == 12
    assert report["mismatches"] == 12
    assert report["mismatch_examples"][0]["expected"] in ("not this clip's text", "not empty")


def test_the_plan_is_seeded_and_draws_every_kind() -> None:
    plans = plan_streams(1000, seed=3)
    assert plans == plan_streams(1000, seed=3)
    assert plans != plan_streams(1000, seed=4)
    assert {plan.kind for plan in plans} == set(KINDS)
    assert {plan.clip for plan in plans} == set(range(CLIPS))
    assert [plan.index for plan in plans] == list(range(1000))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"streams": 0}, "streams must be >= 1, got 0"),
        ({"streams": 3, "kinds": ("normal", "idle")}, "kinds must be a non-empty subset of"),
        ({"streams": 3, "kinds": ()}, "kinds must be a non-empty subset of"),
    ],
)
def test_bad_plans_are_refused_naming_the_argument(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_streams(**arguments)
