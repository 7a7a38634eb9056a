"""Why ``to_device`` got slower in the latency run of cc35bb8: the consumer-stream path, or a ring of many slots?

The run (bench/results/latency_h200.json) found ``to_device`` 2-4x slower than the session before from
64 KiB up, idle too, where the copy path had not changed; the ring had grown many small slots in the
busy states (copies riding the busy consumer hold their slots until the queue reaches them), and it
hands out the least recently released idle slot, so a pool of many slots is walked round, cache-cold.
This probe times, in one process, p50/p99 host ms over many reps:

- ``to_device`` of a numpy payload and the submit of a slot filled in place (untimed fill),
- idle (synchronised before each rep) and busy (~50 ms queued, refilled every 20 reps),
- for three rings: ``copy_stream_all`` (``consumer_copy_bytes=0``: every copy may take the copy
  stream, the old behaviour), ``consumer_small`` (the ring's default ``consumer_copy_bytes``: 1 MiB
  when bench/probes/ring_paths_h200.json was run, at commit 72ff121; 64 KiB since) and
  ``consumer_small_many_slots`` (the same, grown to 64 slots per size first, as a busy run leaves it;
  the slot choice was least recently released then, most recently released known idle since).

Usage (H200): python3 bench/probes/ring_paths.py --out bench/probes/ring_paths_h200.json
"""

from __future__ import annotations

import sys

import numpy as np
from _probe import REPS, out_path, time_calls

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, MiB, PinnedRing, to_device
from audiomask.transfer.harness import QueueFiller

SIZES = (16 * KiB, 64 * KiB, 256 * KiB, MiB)
MANY_SLOTS = 64


def grown(ring: PinnedRing) -> PinnedRing:
    """``ring`` after MANY_SLOTS copies of each size that rides the consumer were in flight at once (as busy leaves it)."""
    held = [ring.stage(n, np.uint8) for n in SIZES if n <= ring.consumer_copy_bytes for _ in range(MANY_SLOTS)]
    for staged in held:
        staged.release()
    return ring


def main() -> int:
    out = out_path(__doc__)
    filler = QueueFiller("cuda")
    rng = np.random.default_rng(0)
    rings = {
        "copy_stream_all": PinnedRing(consumer_copy_bytes=0),
        "consumer_small": PinnedRing(),
        "consumer_small_many_slots": grown(PinnedRing()),
    }
    rows = []
    for nbytes in SIZES:
        payload = rng.integers(0, 256, nbytes, dtype=np.uint8)
        for name, ring in rings.items():
            for busy in (False, True):
                submit = time_calls(
                    lambda staged: staged.to("cuda"), busy, filler, lambda ring=ring, n=nbytes: ring.stage(n, np.uint8)
                )
                copy = time_calls(lambda _, ring=ring, data=payload: to_device(data, "cuda", ring=ring), busy, filler)
                row = {
                    "ring": name,
                    "bytes": nbytes,
                    "busy": busy,
                    "to_device_p50": copy["p50"],
                    "to_device_p99": copy["p99"],
                    "submit_p50": submit["p50"],
                    "submit_p99": submit["p99"],
                    "slots": ring.stats().slots,
                }
                rows.append(row)
                print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    write_result(out, {"environment": capture_environment(sys.argv), "reps": REPS, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
