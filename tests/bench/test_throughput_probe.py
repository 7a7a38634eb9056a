"""The throughput benchmark's driver probe: one cycle a lane a chunk, whatever the host's speed."""

from __future__ import annotations

import itertools
import multiprocessing
import time

import pytest
import torch

from audiomask.bench import throughput
from audiomask.bench.models import BenchModel, build_model
from audiomask.bench.throughput import ProbePlan, make_probe

LANES = 4
STREAMS = 16  # 4 a lane: Qwen3-ASR's streams start in 8 groups, so lanes fill over the first steps


def slow_host_clock(period_s: float, lanes: int) -> object:
    """A monotonic clock that moves 0.4 of a lane's phase at every reading, as a host feeding thousands of
    streams does between one stream's first block and the next's: the streams fed for one lane arrive over
    several phases."""
    ticks = itertools.count()
    return lambda: next(ticks) * 0.4 * period_s / lanes


@pytest.mark.parametrize("name", ["qwen3_asr_0.6b", "phi4mm_full"])
def test_the_driver_probe_runs_one_cycle_a_lane_however_slowly_the_host_feeds(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build_model(name, torch.device("cpu"), quick=True)
    chunking = {} if not model.is_phi4mm else {"chunk_size": 2, "left_chunk": 1}
    built = BenchModel.driver

    def driver_on_a_slow_host(self: BenchModel, *args: object, **options: object):
        return built(self, *args, **{"wait_clock": slow_host_clock(1.0, LANES), **options})

    monkeypatch.setattr(BenchModel, "driver", driver_on_a_slow_host)
    probe, settings = make_probe(model, "driver", ProbePlan(0, 8), frontend_workers=1, lanes=LANES, **chunking)
    times = probe(STREAMS)  # raises "the driver ran N cycles, not one a lane" when a lane's streams split
    assert settings["lanes"] == LANES
    assert len(times.costs) == len(times.seconds) > 0


@pytest.mark.parametrize("name", ["qwen3_asr_0.6b", "phi4mm_full"])
def test_drivers_in_two_processes_share_the_streams_and_report_every_drivers_chunks(name: str) -> None:
    model = build_model(name, torch.device("cpu"), quick=True)
    chunking = {} if not model.is_phi4mm else {"chunk_size": 2, "left_chunk": 1}
    plan = ProbePlan(0, 8)
    alone, _ = make_probe(model, "driver", plan, frontend_workers=1, lanes=2, **chunking)
    probe, settings = make_probe(model, "driver", plan, frontend_workers=1, lanes=2, driver_processes=2, **chunking)
    single = alone(5)
    times = probe(9)  # shares of 4 and 5 streams
    assert settings["driver_processes"] == times.driver_processes == 2
    assert not times.stopped
    # Each driver times as many chunks as one driver alone does, and each has a front-end process of its own.
    assert len(times.seconds) == len(times.costs) == 2 * len(single.seconds)
    assert times.frontend_processes == 2 * single.frontend_processes == 2
    assert all(cost.feed_cpu_s > 0 for cost in times.costs)


def test_a_driver_process_that_cannot_start_fails_the_probe_with_its_reason() -> None:
    model = build_model("qwen3_asr_0.6b", torch.device("cpu"), quick=True)
    spec = throughput._DriverSpec("no_such_model", "cpu", True, {}, ProbePlan(0, 2), None, {"lanes": 1}, 1)
    with pytest.raises(RuntimeError, match="did not all start.*model must be one of"):
        throughput._drivers_probe(model, spec, 2)(4)


def test_drivers_in_processes_need_a_stream_each() -> None:
    model = build_model("qwen3_asr_0.6b", torch.device("cpu"), quick=True)
    probe, _ = make_probe(model, "driver", ProbePlan(0, 2), frontend_workers=1, driver_processes=3)
    with pytest.raises(ValueError, match=r"streams \(2\) must be at least the driver processes \(3\)"):
        probe(2)


def test_gathering_stops_once_the_driver_processes_have_ended_whatever_they_put() -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    silent = context.Process(target=time.sleep, args=(0.1,))  # ends without a result, as a killed driver does
    speaking = context.Process(target=results.put, args=((None, "ValueError: no"),))
    for process in (silent, speaking):
        process.start()
    began = time.monotonic()
    assert throughput._gather(results, [silent, speaking]) == [(None, "ValueError: no")]
    assert time.monotonic() - began < throughput.DRIVERS_MEET_TIMEOUT_S / 10
    for process in (silent, speaking):
        process.join()
