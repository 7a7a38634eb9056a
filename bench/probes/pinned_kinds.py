"""What a ``non_blocking`` host->device copy costs the host, by the kind of page-locked memory it reads.

Two questions from the transfer runs (bench/results/transfer_h200_run5.json, commit 3547bb8):

1. A bare 64 MiB copy from torch's pinned memory (``cudaHostAlloc``) costs the host ~0.3 ms, and
   16 MiB ~0.1 ms: the submit grows with the size. Is that the driver walking 4 KiB pages? Then
   memory registered with ``cudaHostRegister`` on 2 MiB (transparent huge) pages would cost less.
2. Could a minimal small-payload path (stage into a premade slot view, allocate, copy, record the
   slot's event) beat ``pin_memory()`` per copy (all C++: ~14 us for 16 KiB) on host time, and
   how much does the hidden event torch records for a copy from its own pinned memory cost?

Times p50/p99 host ms over REPS, idle (synchronised before each rep) and busy (~50 ms queued,
refilled every REFILL_EVERY reps), for:

- ``copy_<kind>``: ``dst.copy_(src, non_blocking=True)`` with ``src`` in memory of ``kind``:
  ``hostalloc`` (``torch.empty(pin_memory=True)``), ``registered_4k`` (an anonymous mapping with
  ``MADV_NOHUGEPAGE``, registered) and ``registered_2m`` (2 MiB aligned, ``MADV_HUGEPAGE``, registered);
- at small sizes also ``pin_per_copy``, ``to_device`` (audiomask's) and ``minimal_<kind>``.

Records the transparent-huge-page setting and how much of each mapping the kernel backed with huge pages.

Usage (H200): python3 bench/probes/pinned_kinds.py --out bench/probes/pinned_kinds_h200.json
"""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import torch
from _probe import REPS, out_path, time_calls

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, MiB, to_device
from audiomask.transfer.harness import QueueFiller, pin_per_copy

SIZES = (16 * KiB, 64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)
SMALL = 64 * KiB  # sizes up to this also time the small-payload variants
HUGE_PAGE = 2 * MiB
MINIMAL_SLOTS = 8


def registered(nbytes: int, huge: bool, keep: list) -> torch.Tensor:
    """A uint8 CPU tensor of ``nbytes`` in an anonymous mapping registered with cudaHostRegister."""
    span = nbytes + HUGE_PAGE
    mapping = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    whole = np.frombuffer(mapping, dtype=np.uint8)
    offset = (-whole.ctypes.data) % HUGE_PAGE if huge else 0
    array = whole[offset : offset + nbytes]
    array[:] = 1  # fault every page in before pinning
    error = torch.cuda.cudart().cudaHostRegister(array.ctypes.data, nbytes, 0)
    if int(error) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {error}")
    keep.append((mapping, whole))
    return torch.from_numpy(array)


def huge_kib(address: int) -> int:
    """AnonHugePages (KiB) of the mapping holding ``address``, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def minimal_copy(payload: np.ndarray, slots: list[torch.Tensor]):
    """The least a ring's small-payload copy does: stage into a premade view, allocate, copy, record."""
    views = [(t, t.numpy(), torch.cuda.Event()) for t in slots]
    stream = torch.cuda.current_stream()
    turn = iter(range(10**9))

    def call() -> torch.Tensor:
        tensor, array, event = views[next(turn) % len(views)]
        result = torch.empty(payload.shape, dtype=torch.uint8, device="cuda")
        np.copyto(array, payload)
        result.copy_(tensor, non_blocking=True)
        event.record(stream)
        return result

    return call


def variants(nbytes: int, sources: dict[str, torch.Tensor], rng: np.random.Generator, keep: list) -> dict:
    """The timed calls for one size: bare copies from each memory kind, and at small sizes the whole paths."""
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    calls = {f"copy_{kind}": (lambda t=t: dst.copy_(t, non_blocking=True)) for kind, t in sources.items()}
    if nbytes > SMALL:
        return calls
    payload = rng.integers(0, 256, nbytes, dtype=np.uint8)
    payload_tensor = torch.from_numpy(payload)
    calls["pin_per_copy"] = lambda: pin_per_copy(payload_tensor, "cuda")
    calls["to_device"] = lambda: to_device(payload, "cuda")
    hostalloc = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(MINIMAL_SLOTS)]
    calls["minimal_hostalloc"] = minimal_copy(payload, hostalloc)
    calls["minimal_registered_4k"] = minimal_copy(
        payload, [registered(nbytes, False, keep) for _ in range(MINIMAL_SLOTS)]
    )
    return calls


def main() -> int:
    out = out_path(__doc__)
    filler = QueueFiller("cuda")
    rng = np.random.default_rng(0)
    keep: list = []
    thp = {
        name: Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().strip()
        for name in ("enabled", "defrag")
        if Path(f"/sys/kernel/mm/transparent_hugepage/{name}").exists()
    }
    rows = []
    for nbytes in SIZES:
        sources = {
            "hostalloc": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
            "registered_4k": registered(nbytes, False, keep),
            "registered_2m": registered(nbytes, True, keep),
        }
        backing = {kind: huge_kib(t.data_ptr()) for kind, t in sources.items()}
        calls = variants(nbytes, sources, rng, keep)
        for name, call in calls.items():
            for busy in (False, True):
                row = {
                    "variant": name,
                    "bytes": nbytes,
                    "busy": busy,
                    **time_calls(lambda _, call=call: call(), busy, filler),
                }
                if name.startswith("copy_"):
                    row["anon_huge_kib"] = backing[name.removeprefix("copy_")]
                rows.append(row)
                print(
                    {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()},
                    flush=True,
                )
    write_result(
        out,
        {
            "environment": capture_environment(sys.argv),
            "thp": thp,
            "reps": REPS,
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
