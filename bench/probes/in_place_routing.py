"""Should a mask built in place ride the consumer's stream up to 1 MiB, instead of the copy stream from 64 KiB?

#7 asks the in-place submit of per-chunk payloads (<= 1 MiB) for host p99 <= 0.1 ms with the GPU busy;
the transfer runs found 0.089-0.143 ms at 256 KiB-1 MiB (bench/results/transfer_h200.json,
transfer_h200_run7.json), where the submit goes to the copy stream (a stream switch, an allocation in
the copy stream's pool, the cross-stream wait and ``record_stream``); at 16-64 KiB it rides the
consumer (one ``Tensor.to``) at 0.04-0.06 ms p99. This probe times, with the transfer benchmark's own
harness and states (idle; busy_steady: >= 40 ms queued before every copy, host work between copies):

- ``ring_in_place``: ``Staged.to(device)``, routed as shipped;
- ``in_place_on_consumer``: ``Staged.to(device, stream=<current stream>)``: the copy in the consumer's
  order, whatever it holds;

and the time to build the mask into the leased slot (``build_ms_p50``: the slots a busy consumer holds
stay leased ~40 ms, so more of them are in use and each is touched colder), and the ring's pinned bytes
and growth after each block. Usage (H200):
python3 bench/probes/in_place_routing.py --out bench/probes/in_place_routing_h200.json
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import torch
from _probe import out_path

from audiomask.bench import transfer as transfer_bench
from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, MiB, PinnedRing

SIZES = (64 * KiB, 256 * KiB, 1 * MiB)
REPEATS = transfer_bench.Repeats(idle=400, busy=30, steady=400, gpu=2, staging=0, warmup=3)


def main() -> int:
    out = out_path(__doc__)
    device = torch.device("cuda", 0)
    rng = np.random.default_rng(0)
    rows = []
    for routing in ("ring_in_place", "in_place_on_consumer"):
        ring = PinnedRing()
        strategies = transfer_bench.make_strategies(device, ring, rng)
        if routing == "in_place_on_consumer":
            shipped = strategies["ring_in_place"]
            strategies[routing] = transfer_bench.Strategy(
                routing,
                False,
                lambda case, stream, staged: staged.to(device, stream=torch.cuda.current_stream(device)),  # type: ignore[attr-defined]
                shipped.prepare,
                shipped.finish,
            )
            strategies["ring_in_place"] = strategies[routing]  # prepare_in_place logs its build time there
        for nbytes in SIZES:
            case = transfer_bench.make_case(nbytes, rng)
            entries = transfer_bench.measure(
                [case], ["ring_in_place"], strategies, REPEATS, transfer_bench.BUSY_MS, device,
                conditions=("idle", "busy_steady"),
            )  # fmt: skip
            stats = ring.stats()
            for entry in entries:
                row = {
                    "routing": routing,
                    "bytes": nbytes,
                    "state": entry["gpu_state"],
                    "host_ms_p50": entry["host_ms_p50"],
                    "host_ms_p99": entry["host_ms_p99"],
                    "build_ms_p50": entry.get("build_ms_p50"),
                    "pinned_bytes": stats.pinned_bytes,
                    "grows": stats.grows,
                }
                rows.append(row)
                print(row, flush=True)
    write_result(
        out, {"environment": capture_environment(sys.argv), "repeats": dataclasses.asdict(REPEATS), "rows": rows}
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
