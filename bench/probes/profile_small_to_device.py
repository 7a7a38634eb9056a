"""cProfile of to_device for a 16 KiB numpy payload on the current stream (H200: which calls cost what)."""
import cProfile, pstats, numpy as np, torch, time
from audiomask.transfer import to_device
a = np.random.default_rng(0).integers(0, 256, 16384, dtype=np.uint8)
for _ in range(2000): to_device(a, "cuda")
torch.cuda.synchronize()
s = time.perf_counter()
for _ in range(20000): to_device(a, "cuda")
print("to_device 16K mean us (back to back)", (time.perf_counter() - s) / 20000 * 1e6)
t = torch.from_numpy(a)
s = time.perf_counter()
for _ in range(20000): t.pin_memory().to("cuda", non_blocking=True)
print("pin_per_copy 16K mean us (back to back)", (time.perf_counter() - s) / 20000 * 1e6)
pr = cProfile.Profile(); pr.enable()
for _ in range(20000): to_device(a, "cuda")
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(14)
