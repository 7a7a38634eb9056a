"""The ring's own Python cost per small copy, on a machine without a GPU: CUDA's streams and events faked.

On the H200, ``to_device`` of 16 KiB costs ~8 us more than a bare stage + allocate + copy + record
(bench/probes/pinned_kinds_h200.json, profile_small_to_device_h200.txt), and ``pin_memory()`` per
copy, all C++, is within that margin. That difference is Python, so it can be worked on anywhere:
this probe runs the lean small-copy path (``PinnedRing._copy_array``) and that floor on the CPU,
with a fake current stream and fake events whose completed query spins ``--query-us`` (the H200's
completed ``cudaEventQuery``: ~1.5 us, bench/probes/submit_floor_h200.txt), and reports the best
mean of several rounds of each, in us.

Usage: python3 bench/probes/ring_python_cost.py --out bench/probes/ring_python_cost_cpu_2core.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, PinnedRing
from audiomask.transfer import ring as ring_module

CALLS = 20_000
ROUNDS = 7
CPU = torch.device("cpu")


class FakeStream:
    stream_id, device_index, device_type = 1, 0, 1

    def query(self) -> bool:
        return True


class FakeEvent:
    query_s = 0.0

    def record(self, stream: object = None) -> None:
        pass

    def query(self) -> bool:
        end = time.perf_counter() + self.query_s
        while time.perf_counter() < end:
            pass
        return True

    def synchronize(self) -> None:
        pass


def best_us(call, calls: int = CALLS, rounds: int = ROUNDS) -> float:
    """The best of ``rounds`` means of ``calls`` back-to-back calls, in us."""
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        means.append((time.perf_counter() - start) / calls * 1e6)
    return min(means)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=16 * KiB)
    parser.add_argument("--query-us", type=float, default=1.5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    stream = FakeStream()
    FakeEvent.query_s = args.query_us / 1e6
    ring_module._get_current_stream = None  # the fakes below stand in for torch's C entry points
    torch.cuda.current_stream = lambda device=None: stream
    torch.cuda.Event = FakeEvent
    payload = np.random.default_rng(0).integers(0, 256, args.bytes, dtype=np.uint8)
    ring = PinnedRing()
    view = torch.empty(args.bytes, dtype=torch.uint8)
    view_array, event = view.numpy(), FakeEvent()

    def floor() -> None:
        result = torch.empty(payload.shape, dtype=torch.uint8, device=CPU)
        np.copyto(view_array, payload)
        result.copy_(view, non_blocking=True)
        event.record(stream)

    report = {
        "environment": capture_environment(sys.argv),
        "bytes": args.bytes,
        "query_us": args.query_us,
        "floor_us": best_us(floor),
        "lean_copy_us": best_us(lambda: ring._copy_array(payload, torch.uint8, CPU)),
    }
    report["python_over_floor_us"] = report["lean_copy_us"] - report["floor_us"]
    print({k: v for k, v in report.items() if k != "environment"})
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
