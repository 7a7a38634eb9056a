"""The latency benchmark's report (:mod:`audiomask.bench.latency`) as fixed-width tables on stdout."""

from __future__ import annotations

from collections.abc import Sequence

from audiomask.bench import transfer as transfer_bench
from audiomask.transfer import MiB

__all__ = ["print_tables"]

GIGA = 1e9  # FLOP per GFLOP


def _cell(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _print_throughput(rows: Sequence[dict]) -> None:
    """One line per search: capacity, the costs per cycle at the deciding probe, memory, cores, what stops it."""
    print(
        f"\n{'throughput':<16}{'path':<14}{'chunk ms':>9}{'streams':>9}{'p99 ms':>9}{'first fail':>11}"
        f"{'at N':>7}{'gpu ms':>9}{'fe ms':>8}{'host ms':>9}{'feed/enq(step)/loop':>21}{'MiB/stream':>11}  {'cores (torch+fe)':<18}"
        f"{'search ended':<14}limiting resource"
    )
    for row in rows:
        costs = row.get("cycle_costs") or {}
        per_stream = row.get("bytes_per_stream")
        cores = row.get("host_cores", {})
        cores_cell = f"{cores['allowed']} ({cores['torch_threads']}+{cores['frontend_processes']})" if cores else "-"
        split = costs.get("host_cpu_ms_per_cycle")
        # search.HOST_STAGES, the enqueue's step part (search.ENQUEUE_STEP) in brackets
        split_cell = "{feed:.0f}/{enqueue:.0f}({step:.0f})/{loop:.0f}".format_map(split) if split else "-"
        processes = row.get("driver_processes", 1)
        path = row["path"] if processes == 1 else f"{row['path']} x{processes}"  # drivers, one a process
        print(
            f"{row['model']:<16}{path:<14}{row['chunk_ms']:>9}{row['max_streams']:>9}"
            f"{_cell(row['max_streams_chunk_ms_p99'], '.1f'):>9}{row['first_failing']!s:>11}"
            f"{costs.get('streams', '-')!s:>7}{_cell(costs.get('gpu_ms_per_cycle'), '.1f'):>9}"
            f"{_cell(costs.get('frontend_ms_per_cycle'), '.1f'):>8}{_cell(costs.get('host_ms_per_cycle'), '.1f'):>9}"
            f"{split_cell:>21}"
            f"{_cell(None if per_stream is None else per_stream / MiB, '.2f'):>11}  {cores_cell:<18}"
            f"{row['limited_by']:<14}{row.get('limiting_resource') or '-'}"
        )


def _print_limits(rows: Sequence[dict]) -> None:
    """One line per search: the encoder's FLOPs per audio second, the TFLOPS achieved at the probe of the
    throughput table's costs and their fraction of the device's dense bf16 peak, the compute and memory limits
    (:mod:`audiomask.bench.limits`), the state per stream they count, and the row's streams as a fraction of the
    nearer limit; ``n/a`` where the device has no known peak or no device memory (the CPU)."""
    print(
        f"\n{'limits':<16}{'path':<14}{'GFLOP/audio s':>14}{'TFLOPS':>9}{'of peak':>9}{'compute limit':>15}"
        f"{'MiB state':>11}{'memory limit':>14}  of nearer limit"
    )
    for row in rows:
        nearer = row["nearer_limit"]
        print(
            f"{row['model']:<16}{row['path']:<14}{row['flop_per_audio_s'] / GIGA:>14.3f}"
            f"{_cell(row['achieved_tflops'], '.2f'):>9}{_cell(row['fraction_of_peak'], '.1%', 'n/a'):>9}"
            f"{_cell(row['compute_limit_streams'], ',', 'n/a'):>15}{row['state_bytes_per_stream'] / MiB:>11.3f}"
            f"{_cell(row['memory_limit_streams'], ',', 'n/a'):>14}  "
            + ("n/a" if nearer is None else f"{row['fraction_of_nearer_limit']:.1%} ({nearer})")
        )


def print_tables(report: dict) -> None:
    """The report's figures as fixed-width tables on stdout."""
    if report["transfer"]:
        print("\ntransfer (ms; e2e = lengths on the host -> mask on the device, idle GPU)")
        transfer_bench.print_table(report["transfer"])
    pipeline = report["pipeline"]
    if pipeline:
        print(
            f"\npipeline ({pipeline['model']}, B={pipeline['batch']}, {pipeline['cycles']} cycles of "
            f"{pipeline['chunk_ms']} ms): serial {pipeline['serial_wall_s']:.3f} s, overlapped "
            f"{pipeline['pipelined_wall_s']:.3f} s (x{pipeline['speedup']:.2f}); cpu {pipeline['cpu_s']:.3f} s, "
            f"gpu {pipeline['gpu_s']:.3f} s, overlap {pipeline['overlap']:.2f}, wall / max(cpu, gpu) "
            f"{pipeline['pipelined_over_max_of_sums']:.2f}; host per chunk p50 {pipeline['host_ms_per_chunk_p50']:.2f} "
            f"/ p99 {pipeline['host_ms_per_chunk_p99']:.2f} ms"
        )
        if "pipelined_wall_s_spread" in pipeline:
            spreads = ", ".join(
                f"{mode} {pipeline[f'{mode}_wall_s_spread']:.1%}" for mode in ("serial", "pipelined", "process")
            )
            print(f"  {pipeline['repeats']} repeats of each mode, (max - min) / median: {spreads}")
        if "process_wall_s" in pipeline:  # reports from 34fc93f on
            print(
                f"  front end in its own process: {pipeline['process_wall_s']:.3f} s "
                f"(x{pipeline['process_speedup']:.2f}); cpu {pipeline['process_cpu_s']:.3f} s, gpu "
                f"{pipeline['process_gpu_s']:.3f} s, overlap {pipeline['process_overlap']:.2f}, wall / max(cpu, gpu) "
                f"{pipeline['process_over_max_of_sums']:.2f} (/ the serial run's max {pipeline['process_over_serial_max']:.2f})"
            )
    if report["latency"]:
        print(
            f"\n{'latency':<14}{'chunk ms':>9}{'left':>6}{'algo ms':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
            f"{'first partial':>15}{'RTF':>8}"
        )
        for row in report["latency"]:
            print(
                f"{row['model']:<14}{row['chunk_ms']:>9}{row['left_chunks']:>6}{row['algorithmic_latency_ms']:>9.0f}"
                f"{row['compute_ms_p50']:>9.2f}{row['compute_ms_p95']:>9.2f}{row['compute_ms_p99']:>9.2f}"
                f"{row['first_partial_ms']:>15.1f}{row['rtf']:>8.4f}"
            )
    if report["throughput"]:
        _print_throughput(report["throughput"])
        _print_limits(report["throughput"])
