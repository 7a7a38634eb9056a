"""PNG plots of a latency benchmark report (matplotlib, the optional ``plot`` extra), one per section.

``write_plots(report, json_path)`` writes ``<stem>_<section>.png`` beside
``json_path`` for every section the report holds and returns their paths;
it raises ``ImportError`` where matplotlib is missing.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_plots"]

DPI = 120
FIGURE_SIZE = (11.0, 4.2)  # inches: two panels side by side


def _bytes_label(nbytes: int) -> str:
    """``16384 -> "16 KiB"``, ``1048576 -> "1 MiB"``."""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def _transfer(report: dict, axes_pair: object) -> None:
    entries = report["transfer"]
    host_axes, end_to_end_axes = axes_pair  # type: ignore[misc]
    states = {e.get("gpu_state", e["condition"]) for e in entries}  # reports before busy_steady: condition only
    condition = next((state for state in ("busy_steady", "busy") if state in states), "idle")
    for strategy in dict.fromkeys(e["strategy"] for e in entries):
        rows = [e for e in entries if e["strategy"] == strategy and e.get("gpu_state", e["condition"]) == condition]
        host_axes.plot([e["bytes"] for e in rows], [e["host_ms_p99"] for e in rows], marker="o", label=strategy)
        with_end_to_end = [e for e in rows if "end_to_end_ms_p50" in e]
        end_to_end_axes.plot(
            [e["bytes"] for e in with_end_to_end],
            [e["end_to_end_ms_p50"] for e in with_end_to_end],
            marker="o",
            label=strategy,
        )
    host_axes.set_title(f"host time per chunk, p99 (GPU {condition})")
    end_to_end_axes.set_title("lengths on the host -> mask on the device, p50")
    sizes = sorted({e["bytes"] for e in entries})
    for axes in (host_axes, end_to_end_axes):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xticks(sizes, [_bytes_label(n) for n in sizes])
        axes.set_xlabel("payload (one chunk's mask)")
        axes.set_ylabel("ms")
        axes.legend(fontsize="small")


def _pipeline(report: dict, axes_pair: object) -> None:
    pipeline = report["pipeline"]
    bars_axes, cycles_axes = axes_pair  # type: ignore[misc]
    bars = {
        "serial wall": (pipeline["serial_wall_s"], "grey"),
        "overlapped (thread)": (pipeline["pipelined_wall_s"], "tab:green"),
        "overlapped (process)": (pipeline.get("process_wall_s"), "tab:olive"),  # reports from 34fc93f on
        "serial T_cpu": (pipeline["serial_cpu_s"], "tab:blue"),
        "serial T_gpu": (pipeline["serial_gpu_s"], "tab:orange"),
    }
    shown = {name: bar for name, bar in bars.items() if bar[0] is not None}
    bars_axes.bar(list(shown), [value for value, _ in shown.values()], color=[color for _, color in shown.values()])
    bars_axes.set_ylabel("s")
    bars_axes.set_title(f"{pipeline['model']}, B={pipeline['batch']}: overlap {pipeline['overlap']:.2f}")
    bars_axes.tick_params(axis="x", labelrotation=20)
    calibration = pipeline["calibration"]
    batches = [row["batch"] for row in calibration]
    cycles_axes.plot(batches, [row["cpu_s"] for row in calibration], marker="o", label="front end (cpu_s)")
    cycles_axes.plot(batches, [row["gpu_s"] for row in calibration], marker="o", label="encoder (gpu_s)")
    cycles_axes.set_xscale("log", base=2)
    cycles_axes.set_xlabel("streams (B)")
    cycles_axes.set_ylabel("s per calibration run")
    cycles_axes.set_title("calibration: where CPU and GPU time meet")
    cycles_axes.legend(fontsize="small")


def _latency(report: dict, axes_pair: object) -> None:
    compute_axes, total_axes = axes_pair  # type: ignore[misc]
    for model in dict.fromkeys(row["model"] for row in report["latency"]):
        rows = [row for row in report["latency"] if row["model"] == model]
        chunks = [row["chunk_ms"] for row in rows]
        compute_axes.plot(chunks, [row["compute_ms_p50"] for row in rows], marker="o", label=f"{model} p50")
        compute_axes.plot(
            chunks, [row["compute_ms_p99"] for row in rows], marker="x", linestyle="--", label=f"{model} p99"
        )
        total_axes.plot(chunks, [row["first_partial_ms"] for row in rows], marker="o", label=f"{model} first partial")
    chunks = sorted({row["chunk_ms"] for row in report["latency"]})
    total_axes.plot(
        chunks,
        [c + report["latency"][0]["lookahead_ms"] for c in chunks],
        color="black",
        linestyle=":",
        label="algorithmic (chunk + lookahead)",
    )
    compute_axes.set_title("compute latency per chunk, one stream")
    total_axes.set_title("first-partial latency")
    for axes in (compute_axes, total_axes):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("chunk ms")
        axes.set_ylabel("ms")
        axes.legend(fontsize="small")


def _throughput(report: dict, axes_pair: object) -> None:
    latency_axes, bars_axes = axes_pair  # type: ignore[misc]
    labels, streams, limits = [], [], []
    for run in report["throughput"]:
        label = f"{run['model']}/{run['path']}"
        measured = sorted((p for p in run["probes"] if "chunk_ms_p99" in p), key=lambda p: p["streams"])
        latency_axes.plot(
            [p["streams"] for p in measured],
            [p["chunk_ms_p99"] / run["chunk_ms"] for p in measured],
            marker="o",
            label=label,
        )
        labels.append(label)
        streams.append(run["max_streams"])
        limits.append(run.get("limiting_resource"))  # older reports have none
    latency_axes.axhline(1.0, color="black", linestyle=":", label="real time (p99 = chunk duration)")
    latency_axes.set_xscale("log", base=2)
    latency_axes.set_yscale("log")
    latency_axes.set_xlabel("concurrent streams")
    latency_axes.set_ylabel("p99 chunk latency / chunk duration")
    latency_axes.set_title("probes")
    latency_axes.legend(fontsize="small")
    bars_axes.barh(labels, streams, color="tab:green")
    bars_axes.set_xlabel("concurrent real-time streams")
    bars_axes.set_title("capacity (what stops it)")
    for index, (value, limit) in enumerate(zip(streams, limits)):
        bars_axes.text(value, index, f" {value:,}" + (f" ({limit})" if limit else ""), va="center")


_SECTIONS = {"transfer": _transfer, "pipeline": _pipeline, "latency": _latency, "throughput": _throughput}


def write_plots(report: dict, json_path: Path) -> list[str]:
    """One PNG per non-empty section of ``report``, named after ``json_path``; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    json_path = Path(json_path)
    environment = report["environment"]
    where = environment.get("gpu") or f"CPU ({environment.get('cpu_count')} cores)"
    written = []
    for section, draw in _SECTIONS.items():
        if not report.get(section):
            continue
        figure, axes_pair = plt.subplots(1, 2, figsize=FIGURE_SIZE)
        draw(report, axes_pair)
        figure.suptitle(f"audiomask {section}: {where}, {environment['date'][:10]}", fontsize="medium")
        figure.tight_layout()
        path = json_path.with_name(f"{json_path.stem}_{section}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=DPI)
        plt.close(figure)
        written.append(str(path))
    return written
