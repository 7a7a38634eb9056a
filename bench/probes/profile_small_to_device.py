"""cProfile of to_device for a 16 KiB numpy payload on the current stream (H200: which calls cost what)."""

import cProfile
import pstats
import time

import numpy as np
import torch

from audiomask.transfer import to_device

CALLS = 20_000

payload = np.random.default_rng(0).integers(0, 256, 16384, dtype=np.uint8)
for _ in range(2000):
    to_device(payload, "cuda")
torch.cuda.synchronize()
started = time.perf_counter()
for _ in range(CALLS):
    to_device(payload, "cuda")
print("to_device 16K mean us (back to back)", (time.perf_counter() - started) / CALLS * 1e6)
tensor = torch.from_numpy(payload)
started = time.perf_counter()
for _ in range(CALLS):
    tensor.pin_memory().to("cuda", non_blocking=True)
print("pin_per_copy 16K mean us (back to back)", (time.perf_counter() - started) / CALLS * 1e6)
profiler = cProfile.Profile()
profiler.enable()
for _ in range(CALLS):
    to_device(payload, "cuda")
profiler.disable()
pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
