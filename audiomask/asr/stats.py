"""What a streaming driver measures: per-cycle timings, totals, and the CPU each stage costs per second of audio.

Two kinds of figures. *Seconds* per cycle are wall times of the stages as
the pipeline sees them (:meth:`RunStats.overlap` compares them). *CPU
seconds* are what each stage costs the host: the front end (every thread or
process it runs on), the driver's own host work (feeding samples, planning
the cycles, collecting and decoding their results) and the encoder step's
enqueue (the batch to the device, launching the step, head and argmax; on a CPU
device, computing them); :meth:`RunStats.cpu_per_audio_s` divides them by
the stream-seconds of audio the cycles carried, which is what sizes a host
for a number of real-time streams.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

__all__ = ["RECENT_CYCLES", "STAGES", "CycleTiming", "RunStats"]

RECENT_CYCLES = 4096  # per-cycle timings kept: a server running for days keeps totals, not every cycle
# The stages whose CPU time is counted: RunStats' total of each is named f"{stage}_cpu_s".
STAGES = ("frontend", "feed", "host", "enqueue")
MS_PER_S = 1000


@dataclass
class CycleTiming:
    """Seconds spent on one cycle (one encoder chunk step for all its streams)."""

    cycle: int
    streams: int  # slots the cycle advanced
    cpu_s: float  # front end: its wall time (a thread's, or its slowest process's)
    enqueue_s: float  # host time to stage, reset, launch the step, head and argmax
    encode_s: float  # the step on the device (CUDA events) or on the CPU (perf_counter)
    wait_s: float  # main thread blocked on the front end's features or on results
    audio_s: float = 0.0  # stream-seconds of audio in the cycle's blocks
    frontend_cpu_s: float = 0.0  # CPU seconds of the front end (a thread: that thread's only)
    # CPU seconds of the driver's main thread on this cycle, outside the enqueue and the waits for the device
    host_cpu_s: float = 0.0
    enqueue_cpu_s: float = 0.0  # CPU seconds of the main thread in the enqueue (on a CPU device: the step)
    # Of enqueue_cpu_s: the encoder step's call (its kernels launched, or on a CPU device computed). Where it
    # grows faster than the streams, the call waits for the device.
    step_cpu_s: float = 0.0
    skipped: int = 0  # occupied slots left out, their next block not there yet (0: a full cycle)


@dataclass
class RunStats:
    """Timings of the recent cycles, totals over every cycle, and the wall time of the driver's loops.

    ``cycles`` holds the last :data:`RECENT_CYCLES` :class:`CycleTiming` (older
    ones are dropped, so memory stays flat however long a driver runs);
    ``count``, ``chunks`` (stream-chunks encoded), ``partial`` (cycles that
    left some occupied slot out) and ``skipped`` (occupied slots left out,
    summed over the cycles; ``chunks / (chunks + skipped)`` is how full the
    cycles ran, against the streams present), ``cpu_s``, ``gpu_s``,
    ``audio_s`` and the CPU seconds of each stage count every cycle (``feed_cpu_s``:
    every :meth:`~audiomask.asr.driver.StreamingDriver.feed`). Given ``cycles``
    and no totals, the totals are computed from them.

    >>> stats = RunStats([CycleTiming(0, 2, cpu_s=2.0, enqueue_s=0.1, encode_s=3.0, wait_s=0.0)], wall_s=3.5)
    >>> stats.count, stats.chunks, stats.overlap()
    (1, 2, 0.75)
    >>> stats = RunStats([CycleTiming(0, 2, 0.1, 0.0, 0.0, 0.0, audio_s=2.0, frontend_cpu_s=0.1, host_cpu_s=0.02)])
    >>> stats.cpu_per_audio_s()
    {'frontend': 0.05, 'feed': 0.0, 'host': 0.01, 'enqueue': 0.0}
    """

    cycles: deque[CycleTiming] = field(default_factory=deque)
    wall_s: float = 0.0
    count: int = 0  # cycles run
    chunks: int = 0  # stream-chunks encoded: the sum of the cycles' streams
    partial: int = 0  # cycles that left some occupied slot out
    skipped: int = 0  # occupied slots left out, summed over the cycles
    cpu_s: float = 0.0  # front end's wall time, all cycles
    gpu_s: float = 0.0  # encoder step, all cycles
    audio_s: float = 0.0  # stream-seconds of audio, all cycles
    frontend_cpu_s: float = 0.0
    feed_cpu_s: float = 0.0  # the calls that queue samples (between cycles)
    host_cpu_s: float = 0.0
    enqueue_cpu_s: float = 0.0

    def __post_init__(self) -> None:
        given = list(self.cycles)
        self.cycles = deque(maxlen=RECENT_CYCLES)
        if self.count:
            self.cycles.extend(given)
            return
        for timing in given:
            self.record(timing)

    def record(self, timing: CycleTiming) -> None:
        """Add one cycle's timing."""
        self.cycles.append(timing)
        self.count += 1
        self.chunks += timing.streams
        self.partial += timing.skipped > 0
        self.skipped += timing.skipped
        self.cpu_s += timing.cpu_s
        self.gpu_s += timing.encode_s
        self.audio_s += timing.audio_s
        self.frontend_cpu_s += timing.frontend_cpu_s
        self.host_cpu_s += timing.host_cpu_s
        self.enqueue_cpu_s += timing.enqueue_cpu_s

    def set_encode(self, cycle: int, encode_s: float) -> None:
        """Set the encode time of cycle ``cycle`` once it is known (CUDA events are read one cycle later)."""
        for timing in reversed(self.cycles):
            if timing.cycle == cycle:
                self.gpu_s += encode_s - timing.encode_s
                timing.encode_s = encode_s
                return

    def recent(self, last: int, since: int = 0) -> dict[str, float]:
        """The last ``last`` cycles (of index ``since`` and later) in milliseconds: p50 and p99 of the front
        end's, the enqueue's and the step's time and of the wait for them, and the mean streams a cycle
        advanced (``{}`` before any).

        >>> stats = RunStats([CycleTiming(0, 1, 0.002, 0.001, 1.5, 0.0), CycleTiming(1, 4, 0.002, 0.001, 0.010, 0.0)])
        >>> stats.recent(8)["encode_ms_p50"], stats.recent(8, since=1)["encode_ms_p99"], stats.recent(8, since=2)
        (755.0, 10.0, {})
        """
        timings = self.since(since)[-last:]
        if not timings:
            return {}
        summary: dict[str, float] = {
            "cycles": len(timings),
            "streams_mean": round(float(np.mean([t.streams for t in timings])), 1),
        }
        for name, seconds in (
            ("frontend", [t.cpu_s for t in timings]),
            ("enqueue", [t.enqueue_s for t in timings]),
            ("encode", [t.encode_s for t in timings]),
            ("wait", [t.wait_s for t in timings]),
        ):
            p50, p99 = np.percentile(np.asarray(seconds) * MS_PER_S, (50, 99))
            summary |= {f"{name}_ms_p50": round(float(p50), 2), f"{name}_ms_p99": round(float(p99), 2)}
        return summary

    def since(self, cycle: int) -> list[CycleTiming]:
        """The kept timings of cycle ``cycle`` and later."""
        return [timing for timing in self.cycles if timing.cycle >= cycle]

    def overlap(self) -> float:
        """``(T_cpu + T_gpu - T_wall) / min(T_cpu, T_gpu)``: 1 = the shorter side fully hidden, 0 = serial."""
        shorter = min(self.cpu_s, self.gpu_s)
        return (self.cpu_s + self.gpu_s - self.wall_s) / shorter if shorter > 0 else 0.0

    def cpu_per_audio_s(self) -> dict[str, float]:
        """CPU seconds per stream-second of audio of each of :data:`STAGES` (0 before any audio).

        ``1 / sum(values)`` is how many real-time streams one core carries through them all.
        """
        return {stage: getattr(self, f"{stage}_cpu_s") / self.audio_s if self.audio_s else 0.0 for stage in STAGES}
