"""scripts/bench_server.py starts a server, streams real WebSocket clients through it and writes its report."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.server_process import References

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_server.py"
CLIENTS = 4


def test_bench_server_checks_every_text_and_times_the_partials(tmp_path):
    out = tmp_path / "server.json"
    command = [sys.executable, str(SCRIPT), "--clients", str(CLIENTS), "--model", "shipped_tiny"]
    finished = subprocess.run([*command, "--out", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    report = json.loads(out.read_text())
    assert {"command", "date", "torch_version", "git_commit", "server_cpu_s", "server_health"} <= report.keys()
    assert (report["model"], report["chunk_ms"], report["clients"]) == ("shipped_tiny", 320, CLIENTS)
    assert (report["correct"], report["lost"], report["wrong"]) == (CLIENTS, 0, 0)
    assert report["partials"] > 0 and report["server_health"]["status"] == "ready"
    busiest_cpu_s = report["server_busiest_process_cores"] * report["wall_s"]  # one process's share of them all
    assert 0 < busiest_cpu_s <= report["server_processes_cpu_s"] + 0.01 * report["wall_s"]
    latencies = report["partial_latency_ms"]
    assert 0 < latencies["p50"] <= latencies["p99"] <= latencies["max"]
    by_second = report["partial_latency_ms_by_second"]
    assert sum(second["partials"] for second in by_second) == report["partials"] - report["partials_untimed"]
    assert [second["t_s"] for second in by_second] == sorted({second["t_s"] for second in by_second})
    assert max(second["max"] for second in by_second) == latencies["max"]
    mid, last = report["partial_latency_ms_mid_stream"], report["partial_latency_ms_last_message"]
    assert 0 <= report["partials_last_message"] < report["partials"] - report["partials_untimed"]
    assert max(mid["max"], last["max"] or 0.0) == latencies["max"]  # None: no partial timed from a last message


def test_bench_server_runs_each_count_of_clients_against_one_server(tmp_path):
    out = tmp_path / "levels.json"
    command = [sys.executable, str(SCRIPT), "--clients", "1", "3", "--model", "shipped_tiny", "--realtime"]
    finished = subprocess.run([*command, "--out", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    report = json.loads(out.read_text())
    levels = report["levels"]
    assert [level["clients"] for level in levels] == [1, 3]  # one and three real-time clients of the tiny model hold
    for level in levels:
        assert (level["correct"], level["lost"], level["wrong"]) == (level["clients"], 0, 0)
        assert level["holds"] == (level["partial_latency_ms"]["p99"] < level["chunk_ms"])
    assert report["most_clients_holding"] == max((lvl["clients"] for lvl in levels if lvl["holds"]), default=None)
    # One server for both: its steps count on from the first run's.
    assert 0 < levels[0]["server_health"]["cycles"] < levels[1]["server_health"]["cycles"]
    summaries = [json.loads(line) for line in finished.stdout.splitlines() if line.startswith("{")]
    assert [summary["clients"] for summary in summaries] == [1, 3]  # a summary line a count


@pytest.fixture(scope="module")
def bench_server():
    """The script as a module (its functions, without running it)."""
    spec = importlib.util.spec_from_file_location("bench_server", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# 320 ms chunks of 5,120 samples, the first needing 240 samples more (the front end's window); 100 ms messages.
REFERENCES = References({"clip": ["", "", "", "h", "h", "h", "hi", "hi"]}, {"clip": "hi"}, 320, 5360, 5120)
MESSAGE_SAMPLES = 1600


def test_a_partial_is_timed_from_the_message_that_completed_its_newest_tokens_chunk(bench_server):
    sent_at = [10.0 + 0.1 * index for index in range(8)]
    partials = [(10.5, "h"), (10.5, "h"), (10.9, "hx"), (11.0, "hi")]  # "hx": a near tie the reference lacks
    token_s = [0.04, 0.04, 0.36, 0.6]  # chunks 0, 0, 1, 1: complete at samples 5,360 and 10,480
    outcome = {"partials": partials, "partial_token_s": token_s, "sent_at": sent_at}
    latencies, untimed, unmatched = bench_server._partial_latencies(outcome, REFERENCES, "clip", MESSAGE_SAMPLES)
    # chunk 0's last sample (5,359) is in message 3, chunk 1's (10,479) in message 6; the repeated text is
    # a segment's end, not timed
    assert latencies == [
        (10.5, pytest.approx(0.2), False),
        (10.9, pytest.approx(0.3), False),
        (11.0, pytest.approx(0.4), False),
    ]
    assert (untimed, unmatched) == (1, 0)


def test_without_token_times_a_partial_is_timed_by_the_reference_text_or_not_at_all(bench_server):
    sent_at = [10.0 + 0.1 * index for index in range(8)]
    partials = [(10.5, "h"), (10.9, "hx"), (11.0, "hi")]
    outcome = {"partials": partials, "partial_token_s": [None] * 3, "sent_at": sent_at}
    latencies, untimed, unmatched = bench_server._partial_latencies(outcome, REFERENCES, "clip", MESSAGE_SAMPLES)
    assert latencies == [(10.5, pytest.approx(0.2), False), (11.0, pytest.approx(0.4), False)]  # "h": message 3
    assert (untimed, unmatched) == (1, 1)


def test_the_last_chunk_of_a_stream_is_timed_from_its_last_message(bench_server):
    sent_at = [10.0 + 0.1 * index for index in range(8)]  # 12,800 samples
    outcome = {"partials": [(10.5, "h"), (11.0, "hi")], "partial_token_s": [0.04, 0.7], "sent_at": sent_at}
    latencies, _, _ = bench_server._partial_latencies(outcome, REFERENCES, "clip", MESSAGE_SAMPLES)
    # chunk 0 ends in message 3; chunk 2 (padded) would end at sample 15,599, past the audio: the last message
    assert latencies == [(10.5, pytest.approx(0.2), False), (11.0, pytest.approx(0.3), True)]


def test_an_llm_recognisers_kth_partial_is_timed_from_its_kth_chunk(bench_server):
    clock = bench_server._update_clock(500)  # 8,000 samples a chunk, the first one too: 5 messages each
    sent_at = [10.0 + 0.1 * index for index in range(25)]
    partials = [(10.45, "a"), (10.95, "ab"), (11.46, "ab"), (12.1, "abc")]  # an update whose text did not change
    outcome = {"partials": partials, "partial_token_s": [None] * 4, "sent_at": sent_at}
    latencies, untimed, unmatched = bench_server._partial_latencies(outcome, clock, "clip", MESSAGE_SAMPLES)
    # chunk k's last sample (8,000 (k + 1) - 1) is in message 5k + 4, sent at 10.4 + 0.5 k
    assert latencies == [
        (10.45, pytest.approx(0.05), False),
        (10.95, pytest.approx(0.05), False),
        (11.46, pytest.approx(0.06), False),
        (12.1, pytest.approx(0.2), False),
    ]
    assert (untimed, unmatched) == (0, 0)


def test_an_llm_recognisers_partials_are_timed_from_their_own_segments_chunks(bench_server):
    clock = bench_server._update_clock(500)  # 8,000 samples a chunk: 5 messages each
    sent_at = [10.0 + 0.1 * index for index in range(40)]
    # Segment 0 (from 0 s) has one partial, ends at 0.7 s (an endpoint: its final text, late), segment 1 starts
    # at 1.2 s (after a pause that belongs to no segment): its chunk k ends at sample 19,200 + 8,000 (k + 1) - 1.
    partials = [(10.45, "a"), (11.8, "ab"), (12.5, "abc"), (13.4, "ab"), (13.9, "abcd")]
    places = [(0, 0.0, False), (1, 1.2, False), (1, 1.2, False), (0, 0.0, True), (1, 1.2, False)]
    outcome = {"partials": partials, "partial_token_s": [None] * 5, "partial_segments": places, "sent_at": sent_at}
    latencies, untimed, unmatched = bench_server._partial_latencies(outcome, clock, "clip", MESSAGE_SAMPLES)
    # segment 1's chunks end at samples 27,199 / 35,199 / 43,199: messages 16 / 21 / 26, sent at 11.6 / 12.1 / 12.6
    assert latencies == [
        (10.45, pytest.approx(0.05), False),
        (11.8, pytest.approx(0.2), False),
        (12.5, pytest.approx(0.4), False),
        (13.9, pytest.approx(1.3), False),
    ]
    assert (untimed, unmatched) == (1, 0)  # the endpoint's final text


def test_bench_server_streams_an_llm_checkpoint_with_fixed_tokens(tmp_path):
    pytest.importorskip("transformers")
    from bench.llm_checkpoints import save_random_qwen3_asr

    model = save_random_qwen3_asr(tmp_path / "llm", "tiny")
    out = tmp_path / "server.json"
    command = [sys.executable, str(SCRIPT), "--clients", "2", "--model", str(model), "--fixed-tokens", "6"]
    command += ["--chunk-ms", "1000", "--realtime", "--max-segment-s", "2", "--out", str(out)]
    finished = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    report = json.loads(out.read_text())
    assert (report["chunk_ms"], report["fixed_tokens"], report["correct"], report["lost"]) == (1000, 6, 2, 0)
    assert report["max_segment_s"] == 2.0  # the server cut each 3-4 s stream at 2 s: segments of their own
    assert report["reference"].startswith("none") and 0 < report["partials"] <= report["updates"]
    assert report["partial_latency_ms"]["p50"] < 1000


@pytest.mark.parametrize("counts", [["3", "2"], ["2", "2"], ["0", "4"]])
def test_the_counts_of_clients_ascend_from_one(bench_server, counts, capsys):
    with pytest.raises(SystemExit):
        bench_server._arguments(["--clients", *counts])
    assert "--clients must be ascending counts >= 1" in capsys.readouterr().err
