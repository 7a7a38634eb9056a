"""Which first-use costs wait for a busy GPU queue? Host ms of each, behind ~50 ms of queued work.

Usage (H200): python3 bench/probes/first_use.py
"""

import time

import torch

from audiomask.transfer.harness import QueueFiller

filler = QueueFiller("cuda")


def behind_queue(name, action):
    torch.cuda.synchronize()
    filler.fill(50.0)
    start = time.perf_counter()
    result = action()
    elapsed = (time.perf_counter() - start) * 1e3
    waited = torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    print(f"{name:55s} {elapsed:8.3f} ms  queue drained by then: {waited}")
    return result


stream = behind_queue("new torch.cuda.Stream()", lambda: torch.cuda.Stream())
for mib in (1, 8, 64):
    n = mib << 20

    def allocate_on_fresh_pool(n=n):
        with torch.cuda.stream(stream):
            return torch.empty(n, dtype=torch.uint8, device="cuda")

    kept = behind_queue(f"first {mib} MiB allocation on the new stream (new segment)", allocate_on_fresh_pool)
    del kept
    behind_queue("same allocation again (cached block)", allocate_on_fresh_pool)
behind_queue("pinned host allocation 8 MiB (new)", lambda: torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True))
behind_queue("cuda event create+record", lambda: torch.cuda.Event().record(stream))
