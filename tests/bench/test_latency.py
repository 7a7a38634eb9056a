"""The latency benchmark: ``--quick`` writes every section's fields; its torch mask and its search are right."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from audiomask.asr.driver import CycleTiming, RunStats
from audiomask.bench import overlap
from audiomask.bench import transfer as transfer_bench
from audiomask.bench.device_masks import hs_mask_torch
from audiomask.bench.latency import DRIVER_LANES
from audiomask.bench.search import (
    ENQUEUE_STEP,
    HOST_STAGES,
    MEMORY_FRACTION,
    RESOURCES,
    TIME_BUDGET,
    limiting_resource,
    memory_per_stream,
    search,
)
from audiomask.bench.throughput import ProbePlan, ProbeTimes, timed_chunks
from audiomask.bench.timing import Budget
from audiomask.masks.phi4mm import hs_mask

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_latency.py"
QUICK_TIMEOUT_S = 120  # --quick takes under a minute on a 2-core machine; the margin is for a loaded one


def run_quick(out: Path, device: str, *options: str) -> tuple[dict, str]:
    """``bench_latency.py --quick`` on ``device`` (and ``options``): the report it wrote and what it printed."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # small models: extra threads only spin on a shared machine
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--device", device, "--no-plots", "--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
        env=environment,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(out.read_text()), completed.stdout


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    return run_quick(tmp_path_factory.mktemp("latency") / "latency.json", "cpu")


def test_quick_report_has_every_section(quick_report: tuple[dict, str]) -> None:
    report, _ = quick_report
    assert {"environment", "transfer", "pipeline", "latency", "throughput", "verdicts", "settings", "models"} <= set(
        report
    )
    environment = report["environment"]
    for key in (
        "command",
        "date",
        "git_commit",
        "torch_version",
        "torchaudio_version",
        "gpu",
        "driver",
        "cpu_count",
        "python_speed_mloops_s",
    ):
        assert key in environment, key
    assert environment["command"].endswith("--out " + environment["argv"][-1])
    assert report["settings"]["quick"] is True


def test_quick_transfer_entries(quick_report: tuple[dict, str]) -> None:
    entries = quick_report[0]["transfer"]
    # No CUDA here: the strategies that mean something on the CPU, idle, at every quick size.
    assert {e["strategy"] for e in entries} == {"ring", "ring_in_place", "on_device"}
    assert len({e["bytes"] for e in entries}) == len(quick_report[0]["settings"]["transfer_sizes"])
    for entry in entries:
        assert {"strategy", "bytes", "busy_gpu", "gpu_state", "host_ms_p50", "host_ms_p99", "end_to_end_ms_p50"} <= (
            entry.keys()
        )
        assert entry["busy_gpu"] is False and entry["gpu_state"] == "idle"
        assert 0 < entry["host_ms_p50"] <= entry["host_ms_p99"]
    assert any("pageable and pin_per_copy" in note for note in quick_report[0]["notes"])


def test_pipeline_section_runs_on_the_threads_asked_and_puts_the_count_back(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(overlap, "pipeline_runs", lambda *args: seen.append(torch.get_num_threads()) or {"batch": 1})
    before = torch.get_num_threads()
    asked = before + 1
    section = overlap.pipeline_section(None, 1, 1, 1, 1, 1, Budget(1.0), asked)  # type: ignore[arg-type]
    assert seen == [asked] and section == {"torch_threads": asked, "batch": 1}
    assert torch.get_num_threads() == before
    assert overlap.pipeline_threads(16) == 15 and overlap.pipeline_threads(1) == 1


def test_quick_pipeline_fields(quick_report: tuple[dict, str]) -> None:
    pipeline = quick_report[0]["pipeline"]
    assert {"overlap", "serial_wall_s", "pipelined_wall_s", "cpu_s", "gpu_s", "batch"} <= pipeline.keys()
    assert pipeline["serial_wall_s"] > 0 and pipeline["pipelined_wall_s"] > 0
    # The overlap figure is (T_cpu + T_gpu - T_wall) / min(T_cpu, T_gpu) on the reported times.
    shorter = min(pipeline["cpu_s"], pipeline["gpu_s"])
    expected = (pipeline["cpu_s"] + pipeline["gpu_s"] - pipeline["pipelined_wall_s"]) / shorter
    assert pipeline["overlap"] == pytest.approx(expected)
    # The same driver with its front end in a process of its own, beside it.
    assert pipeline["process_wall_s"] > 0 and pipeline["process_cpu_s"] > 0
    assert pipeline["process_over_max_of_sums"] == pytest.approx(
        pipeline["process_wall_s"] / max(pipeline["process_cpu_s"], pipeline["process_gpu_s"])
    )


def test_quick_latency_rows(quick_report: tuple[dict, str]) -> None:
    rows = quick_report[0]["latency"]
    assert [row["chunk_ms"] for row in rows] == [160, 320, 640, 1280]
    for row in rows:
        assert row["algorithmic_latency_ms"] == row["chunk_ms"] + 15  # Phi-4MM's frame lookahead: 240 samples
        assert row["compute_ms_p50"] <= row["compute_ms_p95"] <= row["compute_ms_p99"]
        assert row["first_partial_ms"] == pytest.approx(row["algorithmic_latency_ms"] + row["first_chunk_compute_ms"])
        assert row["rtf"] > 0


def test_quick_throughput_runs(quick_report: tuple[dict, str]) -> None:
    runs = quick_report[0]["throughput"]
    assert {(run["model"], run["path"]) for run in runs} == {
        ("shipped", "driver"),
        ("phi4mm_full", "encoder_step"),
        ("phi4mm_full", "driver"),
        ("qwen3_asr_0.6b", "encoder_step"),
        ("qwen3_asr_0.6b", "driver"),
    }
    for run in runs:
        assert {"max_streams", "chunk_ms", "limited_by", "probes", "criterion"} <= run.keys()
        passed = [probe["streams"] for probe in run["probes"] if probe["ok"]]
        assert run["max_streams"] == max(passed, default=0)
        assert run["limiting_resource"] in (*RESOURCES, TIME_BUDGET)
        assert run["bytes_per_stream"] is None  # no CUDA: device memory is not measured
        cores = run["host_cores"]
        assert cores["allowed"] >= 1 and 1 <= cores["torch_threads"] <= max(cores["allowed"], 1)
        measured = [probe for probe in run["probes"] if "chunk_ms_p99" in probe]
        assert measured and all(probe["gpu_ms_per_cycle"] > 0 for probe in measured)
        assert run["cycle_costs"]["streams"] in {probe["streams"] for probe in measured}
        if run["path"] == "driver":  # the front end in processes of its own, sharded where the driver can
            assert run["frontend_process"] is True and run["frontend_sharded"] is True
            assert "frontend_workers" in run and run["lanes"] == DRIVER_LANES
            assert all(probe["frontend_processes"] >= 1 and probe["frontend_ms_per_cycle"] > 0 for probe in measured)
            # The main thread's CPU by stage: samples were fed, steps enqueued (computed, on the CPU), cycles run;
            # the step's call is part of the enqueue.
            for probe in measured:
                split = probe["host_cpu_ms_per_cycle"]
                assert set(split) == {*HOST_STAGES, ENQUEUE_STEP} and all(split[stage] > 0 for stage in HOST_STAGES)
                assert 0 < split[ENQUEUE_STEP] <= split["enqueue"]
            assert run["cycle_costs"]["host_cpu_ms_per_cycle"] in [probe["host_cpu_ms_per_cycle"] for probe in measured]
        else:  # host features in: no front end, no driver
            assert all(probe["frontend_processes"] == 0 == probe["frontend_ms_per_cycle"] for probe in measured)
            assert not any("host_cpu_ms_per_cycle" in probe for probe in measured)
    assert "phi4mm_full" in quick_report[0]["models"]
    assert "stand-in" in quick_report[0]["models"]["phi4mm_full"]["source"]  # --quick says it is no measurement


def test_quick_prints_tables_and_verdicts(quick_report: tuple[dict, str]) -> None:
    stdout = quick_report[1]
    for heading in ("transfer (ms;", "pipeline (", "latency ", "throughput ", "limiting resource"):
        assert heading in stdout
    assert "throughput reported for both full-size configs: yes" in stdout
    assert (
        "Qwen3-ASR-0.6B through the driver >= 10,000 concurrent real-time streams and >= 80% of its encoder step's "
        "capacity: no" in stdout
    )
    assert "Qwen3-ASR-0.6B encoder step >= 90% of the nearer of its compute and memory limits: n/a" in stdout
    row = next(line for line in stdout.splitlines() if line.startswith("qwen3_asr_0.6b") and " driver " in line)
    assert row.endswith((*RESOURCES, TIME_BUDGET))


def test_plot_from_a_report_needs_matplotlib_or_writes_pngs(quick_report: tuple[dict, str], tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    report_path.write_text(json.dumps(quick_report[0]))
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--plot", str(report_path)], capture_output=True, text=True, check=False
    )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert completed.returncode == 1 and "matplotlib is not installed" in completed.stdout
        return
    assert completed.returncode == 0, completed.stderr
    for section in ("transfer", "pipeline", "latency", "throughput"):
        assert (tmp_path / f"report_{section}.png").stat().st_size > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seconds", "0"], "--seconds must be > 0, got 0.0"),
        (["--max-streams", "0"], "--max-streams must be >= 1, got 0"),
        (["--frontend-workers", "0"], "--frontend-workers must be >= 1, got 0"),
        (["--driver-processes", "0"], "--driver-processes must be >= 1, got 0"),
        (["--rows", "qwen3_asr_0.6b/nonsense"], "invalid choice: 'qwen3_asr_0.6b/nonsense'"),
        (["--sections", "nonsense"], "invalid choice: 'nonsense'"),
        (["--device", "tpu:0"], "--device must be auto, cpu or cuda[:N], got 'tpu:0'"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    from audiomask.bench import latency

    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error, before anything runs
        latency.main(argv)
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert message in stderr and "Traceback" not in stderr


def test_the_short_form_runs_the_rows_named_alone_with_the_drivers_asked(tmp_path: Path) -> None:
    options = ("--short", "--rows", "qwen3_asr_0.6b/driver", "--driver-processes", "2")
    report, printed = run_quick(tmp_path / "rows.json", "cpu", *options)
    [row] = report["throughput"]
    assert (row["model"], row["path"], row["driver_processes"]) == ("qwen3_asr_0.6b", "driver", 2)
    probes = [probe for probe in row["probes"] if "error" not in probe]
    assert probes and all(probe["driver_processes"] == 2 for probe in probes)
    assert "driver x2" in printed


# --------------------------------------------------------------------------- the mask built on the device


@given(
    lengths=st.lists(st.integers(0, 200), min_size=1, max_size=5),
    extra=st.integers(0, 40),
    chunk_size=st.integers(-1, 7),
    left_chunk=st.integers(0, 4),
    time_reduction=st.sampled_from([1, 2, 4, 8]),
)
def test_hs_mask_torch_equals_numpy_hs_mask(
    lengths: list[int], extra: int, chunk_size: int, left_chunk: int, time_reduction: int
) -> None:
    max_frames = max(lengths) + extra
    expected = hs_mask(lengths, max_frames, chunk_size, left_chunk, time_reduction)
    built = hs_mask_torch(torch.tensor(lengths), max_frames, chunk_size, left_chunk, time_reduction)
    assert built.dtype == torch.bool
    np.testing.assert_array_equal(built.numpy(), expected)


def test_hs_mask_torch_writes_into_out() -> None:
    out = torch.zeros(2, 5, 5, dtype=torch.bool)
    result = hs_mask_torch(torch.tensor([40, 17]), 40, chunk_size=2, left_chunk=1, out=out)
    assert result.data_ptr() == out.data_ptr()
    np.testing.assert_array_equal(out.numpy(), hs_mask([40, 17], 40, 2, 1))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: hs_mask_torch(torch.tensor([1.5]), 8, 2, 1), r"feature_lengths must be a 1-D integer tensor"),
        (lambda: hs_mask_torch([8], 8, 2, 1), r"feature_lengths must be a 1-D integer tensor, got <class 'list'>"),
        (lambda: hs_mask_torch(torch.tensor([8]), -1, 2, 1), r"max_frames must be >= 0, got -1"),
        (lambda: hs_mask_torch(torch.tensor([8]), 8, 2, -1), r"left_chunk must be >= 0, got -1"),
        (
            lambda: hs_mask_torch(torch.tensor([8]), 8, 2, 1, out=torch.zeros(1, 2, 2, dtype=torch.bool)),
            r"out must be a bool tensor of shape \(1, 1, 1\)",
        ),
    ],
)
def test_hs_mask_torch_rejects_bad_arguments(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# --------------------------------------------------------------------------- the throughput search


def _probe_passing_up_to(capacity: int, calls: list[int]):
    """A fake probe: chunk latency 10 ms up to ``capacity`` streams, 2000 ms beyond (chunk of 1000 ms)."""

    def probe(streams: int) -> ProbeTimes:
        calls.append(streams)
        seconds = 0.01 if streams <= capacity else 2.0
        return ProbeTimes([seconds] * 4, streams > capacity)

    return probe


@pytest.mark.parametrize("capacity", [1, 5, 37, 100])
def test_search_finds_the_capacity_within_the_tolerance(capacity: int) -> None:
    calls: list[int] = []
    result = search(
        _probe_passing_up_to(capacity, calls),
        {"model": "fake", "path": "x", "chunk_ms": 1000},
        torch.device("cpu"),
        Budget(60),
        max_streams=1024,
    )
    assert result["max_streams"] <= capacity < result["first_failing"]
    assert result["first_failing"] - result["max_streams"] <= max(1, 0.05 * result["max_streams"])
    assert result["limited_by"] == "latency"
    doubling = calls[: next(i for i, n in enumerate(calls) if n > capacity) + 1]
    assert doubling == [2**i for i in range(len(doubling))]  # then bisection inside the bracket doubling made
    assert all(doubling[-2] < n < doubling[-1] for n in calls[len(doubling) :])
    assert [probe["streams"] for probe in result["probes"]] == calls


def test_search_stops_at_max_streams() -> None:
    result = search(
        _probe_passing_up_to(10**6, []),
        {"model": "fake", "path": "x", "chunk_ms": 1000},
        torch.device("cpu"),
        Budget(60),
        max_streams=12,
    )
    assert (result["max_streams"], result["first_failing"], result["limited_by"]) == (12, None, "max_streams")
    assert [probe["streams"] for probe in result["probes"]] == [1, 2, 4, 8, 12]


@pytest.mark.parametrize(("capacity", "first_probes"), [(100, [16, 32, 64, 128]), (10, [16, 8, 12])])
def test_search_starts_doubling_at_start(capacity: int, first_probes: list[int]) -> None:
    """From ``start`` up while probes pass; a failing ``start`` bisects between 0 and it."""
    calls: list[int] = []
    settings = {"model": "fake", "path": "x", "chunk_ms": 1000}
    result = search(_probe_passing_up_to(capacity, calls), settings, torch.device("cpu"), Budget(60), 1024, start=16)
    assert calls[: len(first_probes)] == first_probes
    assert result["max_streams"] <= capacity < result["first_failing"]


@pytest.mark.parametrize(
    ("capacity", "probed", "found"),
    [(100, [8, 24, 64], (64, None, "counts")), (30, [8, 24, 64], (24, 64, "latency")), (5, [8], (0, 8, "latency"))],
)
def test_search_with_counts_probes_those_counts_alone_up_to_the_first_failure(
    capacity: int, probed: list[int], found: tuple
) -> None:
    """The short form: no doubling, no bisection; the counts smallest first, whatever order they came in."""
    calls: list[int] = []
    settings = {"model": "fake", "path": "x", "chunk_ms": 1000}
    probe = _probe_passing_up_to(capacity, calls)
    result = search(probe, settings, torch.device("cpu"), Budget(60), 1024, start=16, counts=[64, 8, 24])
    assert calls == probed
    assert (result["max_streams"], result["first_failing"], result["limited_by"]) == found


def test_search_records_a_probe_that_raises() -> None:
    def probe(streams: int) -> ProbeTimes:
        if streams > 4:
            raise RuntimeError("a request of 9 bytes exceeds max_pinned_bytes=8")
        return ProbeTimes([0.01], False)

    result = search(probe, {"model": "fake", "path": "x", "chunk_ms": 1000}, torch.device("cpu"), Budget(60), 64)
    assert (result["max_streams"], result["first_failing"], result["limited_by"]) == (4, 5, "error")
    failure = next(p for p in result["probes"] if p["streams"] == 8)
    assert failure["ok"] is False and "exceeds max_pinned_bytes" in failure["error"]


def test_a_probe_plan_with_early_exceedances_fails_the_probe() -> None:
    # p99 of up to 101 chunks is above the duration once two are: the probe stops there.
    durations = iter([0.0, 0.0, 0.03, 0.0, 0.03, 0.0, 0.0])

    def step(index: int) -> None:
        import time

        time.sleep(next(durations))

    times = timed_chunks(step, warmup=1, plan=ProbePlan(warmup=0, chunks=6), duration_s=0.02)
    assert times.stopped and len(times.seconds) == 4 and times.costs == []


# --------------------------------------------------------------------------- what stops a throughput row

GiB = 2**30


def probe_record(streams: int, ok: bool, gpu: float = 1.0, frontend: float = 0.0, host: float = 0.0, **extra) -> dict:
    """A probe row as :func:`search` records it, with mean milliseconds per cycle."""
    costs = {"gpu_ms_per_cycle": gpu, "frontend_ms_per_cycle": frontend, "host_ms_per_cycle": host, "gpu_busy": 0.5}
    return {"streams": streams, "ok": ok, **costs, **extra}


@pytest.mark.parametrize(
    "costs, resource",
    [
        ({"gpu": 900.0, "frontend": 50.0, "host": 20.0}, "gpu compute"),
        ({"gpu": 200.0, "frontend": 700.0, "host": 20.0}, "host front end"),
        ({"gpu": 200.0, "frontend": 100.0, "host": 650.0}, "host driver loop"),
    ],
)
def test_limiting_resource_is_the_largest_cost_of_the_first_failing_probe(costs: dict, resource: str) -> None:
    probes = [
        probe_record(1, True, gpu=1.0, frontend=9.0, host=5.0),  # passing probes do not decide
        probe_record(8, False, gpu=1.0, frontend=1.0, host=1.0),  # nor a failing one above the first failure
        probe_record(4, True, gpu=1.0, frontend=9.0, host=5.0),
        probe_record(6, False, **costs),
    ]
    assert limiting_resource(probes, "latency", None) == resource
    assert limiting_resource(probes, "latency", 100 * GiB) == resource  # no peak recorded: not memory


def test_limiting_resource_without_a_failure_judges_the_largest_probe() -> None:
    probes = [probe_record(2, True, gpu=1.0, frontend=3.0), probe_record(4, True, gpu=5.0, frontend=3.0)]
    assert limiting_resource(probes, "max_streams", None) == "gpu compute"


@pytest.mark.parametrize(
    "failure",
    [
        {"error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"},
        {"error": "RuntimeError: CUDA error: out of memory"},
        {"error": "not run: predicted peak 135.1 GiB > 128.6 GiB", "predicted_peak_bytes": 135 * GiB},
    ],
)
def test_limiting_resource_is_gpu_memory_when_a_probe_runs_out_of_it(failure: dict) -> None:
    probes = [probe_record(1, True, gpu=900.0, peak_bytes=GiB), {"streams": 2, "ok": False, **failure}]
    assert limiting_resource(probes, "memory", 140 * GiB) == "gpu memory"


def test_limiting_resource_is_gpu_memory_when_the_deciding_probe_filled_it() -> None:
    full = probe_record(8, False, gpu=900.0, peak_bytes=int((MEMORY_FRACTION + 0.01) * 100 * GiB))
    assert limiting_resource([probe_record(4, True, peak_bytes=50 * GiB), full], "latency", 100 * GiB) == "gpu memory"
    roomy = probe_record(8, False, gpu=900.0, peak_bytes=80 * GiB)
    assert limiting_resource([probe_record(4, True, peak_bytes=40 * GiB), roomy], "latency", 100 * GiB) == "gpu compute"


def test_limiting_resource_for_time_and_for_errors() -> None:
    probes = [probe_record(1, True, host=9.0), probe_record(2, False, gpu=99.0)]
    assert limiting_resource(probes, "budget", None) == TIME_BUDGET  # the search never settled the row
    # A probe that raised (not for memory) has no costs: the largest probe that measured them is judged.
    raised = {"streams": 4, "ok": False, "error": "RuntimeError: a request exceeds max_pinned_bytes"}
    assert limiting_resource([probe_record(2, True, host=9.0), raised], "error", None) == "host driver loop"
    assert limiting_resource([raised], "error", None) is None
    assert limiting_resource([], "max_streams", None) is None


def test_memory_per_stream_is_the_slope_of_peak_memory_over_streams() -> None:
    baseline, per_stream = 2 * GiB, 3 * 2**20
    probes = [{"streams": n, "peak_bytes": baseline + per_stream * n + (n % 3) * 1024} for n in (1, 2, 4, 8, 16)]
    probes.append({"streams": 32, "peak_bytes": 99 * GiB, "error": "OutOfMemoryError"})  # not a clean probe
    assert memory_per_stream(probes) == pytest.approx(per_stream, rel=1e-3)
    assert memory_per_stream(probes[:1]) is None and memory_per_stream([{"streams": 4}]) is None


def throughput_row(model: str, path: str, streams: int) -> dict:
    return {"model": model, "path": path, "max_streams": streams}


@pytest.mark.parametrize(
    "driver, step, qwen3, qwen3_step, expected",
    [
        (12_000, 14_000, 10_500, 4_992, (True, True)),
        (12_000, 16_000, 9_000, 4_992, (False, False)),  # the driver reaches 75 % of its step's capacity
        (9_000, 10_000, 10_000, 4_992, (False, True)),
        (12_000, 14_000, 17_408, 40_960, (True, False)),  # 42 % of its step's
    ],
)
def test_throughput_verdicts_state_the_driver_aims(
    driver: int, step: int, qwen3: int, qwen3_step: int, expected: tuple
) -> None:
    from audiomask.bench import latency

    rows = [
        throughput_row("phi4mm_full", "encoder_step", step),
        throughput_row("phi4mm_full", "driver", driver),
        throughput_row("qwen3_asr_0.6b", "encoder_step", qwen3_step),
        throughput_row("qwen3_asr_0.6b", "driver", qwen3),
    ]
    found = latency.verdicts({"transfer": [], "pipeline": {}, "throughput": rows, "settings": {}})
    claim = " through the driver >= 10,000 concurrent real-time streams and >= 80% of its encoder step's capacity"
    phi4mm, qwen3_driver = found["full-size Phi-4MM" + claim], found["Qwen3-ASR-0.6B" + claim]
    assert (phi4mm["ok"], qwen3_driver["ok"]) == expected
    assert phi4mm["of_encoder_step"] == pytest.approx(driver / step)
    assert qwen3_driver["of_encoder_step"] == pytest.approx(qwen3 / qwen3_step)
    unmeasured = latency.verdicts({"transfer": [], "pipeline": {}, "throughput": rows[:1], "settings": {}})
    assert unmeasured["Qwen3-ASR-0.6B" + claim]["ok"] is None


@pytest.mark.parametrize("fraction, expected", [(0.93, True), (0.85, False), (None, None)])
def test_throughput_verdicts_hold_each_step_to_its_nearer_limit(fraction: float | None, expected: bool | None) -> None:
    from audiomask.bench import latency

    step = throughput_row("qwen3_asr_0.6b", "encoder_step", 40_960) | {
        "fraction_of_nearer_limit": fraction,
        "nearer_limit": "compute",
    }
    found = latency.verdicts({"transfer": [], "pipeline": {}, "throughput": [step], "settings": {}})
    verdict = found["Qwen3-ASR-0.6B encoder step >= 90% of the nearer of its compute and memory limits"]
    assert (verdict["ok"], verdict["of_nearer_limit"], verdict["max_streams"]) == (expected, fraction, 40_960)
    assert found["full-size Phi-4MM encoder step >= 90% of the nearer of its compute and memory limits"]["ok"] is None


# --------------------------------------------------------------------------- CUDA (the H200)


@pytest.mark.gpu
def test_hs_mask_torch_on_cuda_equals_numpy() -> None:
    from audiomask.transfer import to_device

    lengths = np.array([3000, 1230, 8, 0], dtype=np.int64)
    built = hs_mask_torch(to_device(lengths, "cuda"), 3000, chunk_size=16, left_chunk=4)
    assert built.device.type == "cuda"
    np.testing.assert_array_equal(built.cpu().numpy(), hs_mask(lengths, 3000, 16, 4))


@pytest.mark.gpu
def test_quick_runs_every_cuda_path(tmp_path: Path) -> None:
    report, _ = run_quick(tmp_path / "latency_cuda.json", "cuda")
    entries = report["transfer"]
    assert {e["strategy"] for e in entries} == {"pageable", "pin_per_copy", "ring", "ring_in_place", "on_device"}
    assert {e["busy_gpu"] for e in entries} == {False, True}
    assert {e["gpu_state"] for e in entries} == {"idle", "busy", "busy_hot", "busy_steady"}
    assert all(e["busy_gpu"] == (e["gpu_state"] != "idle") for e in entries)
    steady = [e for e in entries if e["gpu_state"] == "busy_steady"]
    assert all(e["queue_ms_min"] >= transfer_bench.STEADY_MIN_QUEUE_MS for e in steady), steady
    assert all("gpu_ms_p50" in e and "end_to_end_ms_p50" in e for e in entries)
    assert all(e["queue_still_busy"] == 1.0 for e in entries if e["busy_gpu"] and e["strategy"] == "ring_in_place")
    assert report["environment"]["gpu"] and report["settings"]["busy_ms_measured"] > 0
    assert report["pipeline"]["gpu_s"] > 0
    assert all(run["max_streams"] >= 1 for run in report["throughput"]), report["throughput"]
    assert all("peak_bytes" in probe for run in report["throughput"] for probe in run["probes"])
    for run in report["throughput"]:  # device memory per stream from the probes' peaks; the device's size
        clean = {probe["streams"] for probe in run["probes"] if "error" not in probe}
        assert (run["bytes_per_stream"] is not None) == (len(clean) >= 2), run
        assert run["device_bytes"] > 0 and run["limiting_resource"] in (*RESOURCES, TIME_BUDGET)


def test_git_commit_named_by_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from audiomask.bench.environment import GIT_COMMIT_VARIABLE, git_commit

    monkeypatch.delenv(GIT_COMMIT_VARIABLE, raising=False)
    from_checkout = git_commit()
    monkeypatch.setenv(GIT_COMMIT_VARIABLE, "0123abc")
    assert git_commit() == "0123abc"
    monkeypatch.setenv(GIT_COMMIT_VARIABLE, "")
    assert git_commit() == from_checkout


@pytest.mark.parametrize(
    ("gpu_fixed_s", "calibrated", "chosen"),
    [
        (0.021, [1, 2, 4, 8, 16, 32], 16),  # balanced at B = 21: the loaded B nearest it
        (0.004, [1, 2, 4, 8, 16, 32], 32),  # balanced at B = 8, where a cycle is too light: B = 32 takes 32 ms
    ],
)
def test_pipeline_calibration_warms_up_untimed_and_stops_at_a_balanced_loaded_batch(
    monkeypatch: pytest.MonkeyPatch, gpu_fixed_s: float, calibrated: list[int], chosen: int
) -> None:
    """The first drive pays one-time costs and must not count; B doubles until the front end catches the encoder
    and a cycle's larger stage takes at least MIN_CYCLE_S (20 ms), then the most balanced such B is kept."""
    calls: list[tuple[int, bool, bool]] = []

    def fake_drive(model, batch, cycles, chunk_size, left_chunk, *, overlap, frontend_process=False):
        calls.append((batch, overlap, frontend_process))
        if len(calls) == 1:
            time.sleep(0.3)  # the one-time costs (graph captures, allocator growth) of a process's first drive
        per_cycle_cpu, per_cycle_gpu = 0.001 * batch, gpu_fixed_s
        timings = [CycleTiming(i, batch, per_cycle_cpu, 0.0, per_cycle_gpu, 0.0) for i in range(cycles)]
        return RunStats(timings, wall_s=cycles * max(per_cycle_cpu, per_cycle_gpu))

    monkeypatch.setattr(overlap, "drive", fake_drive)
    model = SimpleNamespace(
        name="fake", asr=SimpleNamespace(encoder=SimpleNamespace(config=SimpleNamespace(time_reduction=4)))
    )
    # Enough for the calibration and one final run of each mode, not for all repeats of a 96-cycle run.
    report = overlap.pipeline_runs(model, 8, 8, 96, 3, 64, Budget(1.0))  # type: ignore[arg-type]
    assert calls[0] == (1, False, False)  # the untimed warm-up
    assert [row["batch"] for row in report["calibration"]] == calibrated
    assert report["batch"] == chosen and 1 <= report["repeats"] <= 3
    final = calls[1 + len(report["calibration"]) :]
    assert final == [(chosen, False, False), (chosen, True, False), (chosen, True, True)] * report["repeats"]
    assert report["serial_wall_s_spread"] == report["pipelined_wall_s_spread"] == 0.0  # the fake's runs agree


def test_the_short_form_probes_each_full_size_step_at_its_aim_of_the_nearer_limit() -> None:
    from audiomask.bench import latency
    from audiomask.bench.limits import EncoderLimits, compute_limit

    known = EncoderLimits(
        flop_per_audio_s=8.98e9, state_bytes_per_stream=1, shared_bytes=0, weight_bytes=0, peak_tflops=989.0
    )
    cpu = SimpleNamespace(device=torch.device("cpu"))  # no memory limit there: the compute limit is the nearer
    nearer = compute_limit(8.98e9, 989.0)
    step = latency._short_counts("qwen3_asr_0.6b", "encoder_step", known, cpu)
    driver = latency._short_counts("qwen3_asr_0.6b", "driver", known, cpu)
    assert step == {*latency.SHORT_COUNTS["qwen3_asr_0.6b", "encoder_step"], math.ceil(0.9 * nearer)}
    assert driver == {*latency.SHORT_COUNTS["qwen3_asr_0.6b", "driver"], math.ceil(0.8 * math.ceil(0.9 * nearer))}
    # With the step's capacity measured in the run, the driver is probed at 80 % of that: its verdict's count.
    held = latency._short_counts("qwen3_asr_0.6b", "driver", known, cpu, step_streams=40_960)
    assert held == {*latency.SHORT_COUNTS["qwen3_asr_0.6b", "driver"], 32_768}
    unknown = EncoderLimits(
        flop_per_audio_s=1e9, state_bytes_per_stream=1, shared_bytes=0, weight_bytes=0, peak_tflops=None
    )
    assert latency._short_counts("phi4mm_full", "encoder_step", unknown, cpu) == {12_288}
    assert latency._short_counts("shipped", "driver", known, cpu) == set(latency.SHORT_COUNTS["shipped", "driver"])


def test_the_short_form_probes_each_driver_at_its_share_of_the_streams_its_step_held(monkeypatch) -> None:
    """The step's row runs first; its driver's counts take the most streams the step held in that run."""
    from audiomask.bench import latency
    from audiomask.bench.limits import EncoderLimits

    known = EncoderLimits(
        flop_per_audio_s=8.98e9, state_bytes_per_stream=1, shared_bytes=0, weight_bytes=0, peak_tflops=989.0
    )
    held = {"encoder_step": 40_960, "driver": 30_000}
    asked: dict[str, list[int]] = {}

    def fake_search(probe, settings, device, budget, max_streams, start, counts=None):
        asked[settings["path"]] = list(counts)
        return {"max_streams": held[settings["path"]], "chunk_ms": settings["chunk_ms"]}

    monkeypatch.setattr(
        latency, "make_probe", lambda model, path, *args, **kwargs: (None, {"path": path, "chunk_ms": 1000})
    )
    monkeypatch.setattr(latency, "search", fake_search)
    monkeypatch.setattr(latency.EncoderLimits, "of", lambda *args: known)
    settings = replace(
        latency.QUICK, short=True, max_streams=65_536, rows=("qwen3_asr_0.6b/encoder_step", "qwen3_asr_0.6b/driver")
    )
    models = {"qwen3_asr_0.6b": SimpleNamespace(device=torch.device("cpu"), is_phi4mm=False)}
    rows = latency.throughput_section(settings, models, Budget(60.0))
    assert [row["max_streams"] for row in rows] == [40_960, 30_000]
    assert asked["driver"] == sorted({*latency.SHORT_COUNTS["qwen3_asr_0.6b", "driver"], 32_768})
    assert math.ceil(0.9 * known.limits(None, 1)["compute"]) in asked["encoder_step"]
