"""The throughput benchmark's driver probe: one cycle a lane a chunk, whatever the host's speed."""

from __future__ import annotations

import itertools

import pytest
import torch

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
