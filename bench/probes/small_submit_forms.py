"""Does ``slot_view.to(device, non_blocking=True)`` submit a small payload faster than ``torch.empty`` + ``copy_``?

The ring's lean path for payloads up to 64 KiB (``PinnedRing._copy_on_consumer``) allocates the
result with ``torch.empty(..., device=...)`` and then calls ``copy_``: two Python-to-C++ calls,
with ``torch.empty``'s argument parsing. ``Tensor.to`` does both in one call, as ``pin_memory()``
per copy does. Times p50/p99 host ms (idle and behind a busy queue, see ``_probe.time_calls``) of:

- ``pin_per_copy``: ``t.pin_memory().to(device, non_blocking=True)`` (the vLLM approach);
- ``lean_empty_copy``: numpy memcpy into a premade pinned slot view, ``torch.empty`` + ``copy_``,
  the slot's event recorded (what the ring's lean path does, without its bookkeeping);
- ``lean_to``: the same with ``view.to(device, non_blocking=True)``;
- ``to_device``: audiomask's ``to_device`` (ring bookkeeping included).

Usage (H200): python3 bench/probes/small_submit_forms.py --out bench/probes/small_submit_forms_h200.json
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from _probe import out_path, time_calls

from audiomask.bench.environment import capture_environment, write_result
from audiomask.transfer import KiB, to_device
from audiomask.transfer.harness import QueueFiller, pin_per_copy

SIZES = (16 * KiB, 64 * KiB)
SLOTS = 64  # premade slots used in turn: a busy queue holds each copy's slot until it runs
REPS = 2000


def _lean_forms(nbytes: int) -> dict[str, object]:
    slots = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(SLOTS)]
    views = [slot.numpy() for slot in slots]
    events = [torch.cuda.Event() for _ in range(SLOTS)]
    turn = [0]

    def stage(payload: np.ndarray) -> tuple[torch.Tensor, torch.cuda.Event]:
        i = turn[0] = (turn[0] + 1) % SLOTS
        events[i].synchronize()  # a slot is reused only once its last copy has completed
        np.copyto(views[i], payload)
        return slots[i], events[i]

    def empty_copy(payload: np.ndarray) -> torch.Tensor:
        slot, event = stage(payload)
        result = torch.empty(slot.shape, dtype=slot.dtype, device="cuda")
        result.copy_(slot, non_blocking=True)
        event.record()
        return result

    def to(payload: np.ndarray) -> torch.Tensor:
        slot, event = stage(payload)
        result = slot.to("cuda", non_blocking=True)
        event.record()
        return result

    return {"lean_empty_copy": empty_copy, "lean_to": to}


def main() -> int:
    out = out_path(__doc__)
    filler = QueueFiller("cuda")
    rows = []
    for nbytes in SIZES:
        payload = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        tensor = torch.from_numpy(payload)
        forms = {
            "pin_per_copy": lambda _, t=tensor: pin_per_copy(t, "cuda"),
            **{name: (lambda _, f=f, p=payload: f(p)) for name, f in _lean_forms(nbytes).items()},
            "to_device": lambda _, p=payload: to_device(p, "cuda"),
        }
        for busy in (False, True):
            for name, call in forms.items():
                row = {
                    "bytes": nbytes,
                    "busy": busy,
                    "form": name,
                    **time_calls(call, busy, filler, reps=REPS),
                }
                rows.append(row)
                print(
                    f"{nbytes // KiB:>4} KiB {'busy' if busy else 'idle'} {name:<16} "
                    f"p50 {row['p50']:.4f} p99 {row['p99']:.4f} ms",
                    flush=True,
                )
    write_result(out, {"environment": capture_environment(sys.argv), "reps": REPS, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
