"""What a transfer run must show: the measured guarantees of :mod:`audiomask.transfer` and the checks beside them.

Each check is ``{"ok": True, False or None (not measured), ...figures}``, keyed by what it claims,
computed from the entries of :func:`audiomask.bench.transfer.measure` (one per strategy, payload
size and GPU state).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from audiomask.bench.copy_timing import SETTLE_MS
from audiomask.transfer import KiB, MiB, parallel_copy_bytes

__all__ = [
    "AUDIOMASK_COPIES",
    "FLOORS",
    "JUDGED_CONDITIONS",
    "STEADY_MIN_QUEUE_MS",
    "guarantees",
    "in_place_p99",
    "staging_engine",
    "verdicts",
]

FLOORS = ("staging_numpy", "staging_torch", "bare_copy")  # rows of the floors ring copies are made of
AUDIOMASK_COPIES = ("ring", "ring_in_place")  # the strategies that are audiomask.transfer copies
# The states comparisons are judged in: the host never goes idle (a streaming server computing
# features) and a busy GPU has been busy a while.
JUDGED_CONDITIONS = ("idle", "busy_steady")
STEADY_MIN_QUEUE_MS = 40.0  # busy_steady holds when at least this much work was queued before every copy
OVERHEAD_BOUND_MS = 0.1  # to_device within this of its staging memcpy; the in-place submit under it
STALL_FROM_BYTES = 4 * MiB  # pageable non_blocking copies from this size wait for a busy stream
STALLED_FRACTION = 0.5  # a copy that returned after this fraction of the queue waited for it
IN_PLACE_P99_BOUND_MS = 0.1  # ring_in_place host p99 with the GPU busy, for payloads up to ...
PER_CHUNK_BYTES = 1 * MiB  # ... this size: one chunk's masks
LOWEST_P99_FROM_BYTES = 64 * KiB  # from this size ring_in_place has the lowest busy p99 of all strategies
ENGINE_TIE = 0.25  # staging engines whose worst p99 differ by less than this are a tie (then p50 decides)


def staging_engine(nbytes: int) -> str:
    """The floor row of the engine ``stage_copy`` uses for a uint8 payload of ``nbytes``."""
    return "staging_numpy" if nbytes < parallel_copy_bytes() else "staging_torch"


def _rows(entries: list[dict]) -> tuple[dict[tuple[str, int, str], dict], list[int]]:
    """The entries by ``(strategy, bytes, gpu_state)``, and the sizes measured, ascending."""
    return {(e["strategy"], e["bytes"], e["gpu_state"]): e for e in entries}, sorted({e["bytes"] for e in entries})


def in_place_p99(entries: list[dict], state: str, label: str) -> dict[str, dict]:
    """The check that ``ring_in_place`` host p99 is <= ``IN_PLACE_P99_BOUND_MS`` for payloads <= 1 MiB in ``state``."""
    row, sizes = _rows(entries)
    in_place = {n: row["ring_in_place", n, state]["host_ms_p99"] for n in sizes if n <= PER_CHUNK_BYTES}
    key = f"ring_in_place host p99 <= {IN_PLACE_P99_BOUND_MS} ms with the GPU busy ({label}), payloads <= 1 MiB"
    return {key: {"ok": all(value <= IN_PLACE_P99_BOUND_MS for value in in_place.values()), "ms": in_place}}


def guarantees(entries: list[dict], busy_ms: float, state: str = "busy_steady") -> dict[str, dict]:
    """The measured guarantees of :mod:`audiomask.transfer`, judged with the GPU running a long queue (``state``).

    No audiomask copy waits for the queue at any size, while pageable ``non_blocking`` copies from
    ``STALL_FROM_BYTES`` do (the negative control: ``ok`` None where no such size was measured);
    ``ring_in_place`` host p99 is <= ``IN_PLACE_P99_BOUND_MS`` for payloads <= 1 MiB; from
    ``LOWEST_P99_FROM_BYTES`` ``ring_in_place`` has the lowest host p99 of all strategies measured
    (floors excepted; a tie counts as lowest). ``entries`` must hold ``pageable``, ``ring`` and
    ``ring_in_place`` in ``state`` at every size.
    """
    row, sizes = _rows(entries)
    names = list(dict.fromkeys(e["strategy"] for e in entries if e["strategy"] not in FLOORS))
    still_busy = {f"{name}/{n}": row[name, n, state]["queue_still_busy"] for name in AUDIOMASK_COPIES for n in sizes}
    stalls = {n: row["pageable", n, state]["host_ms_p50"] for n in sizes if n >= STALL_FROM_BYTES}
    stalled = all(value >= STALLED_FRACTION * busy_ms for value in stalls.values()) if stalls else None
    lowest = {
        n: {name: row[name, n, state]["host_ms_p99"] for name in names} for n in sizes if n >= LOWEST_P99_FROM_BYTES
    }
    return {
        f"no audiomask copy waited for the GPU queue, at any size ({state})": {
            "ok": all(value == 1.0 for value in still_busy.values()),
            "fraction of copies with the queue still busy after": still_busy,
        },
        f"pageable non_blocking >= {STALL_FROM_BYTES // MiB} MiB waits for the GPU queue ({state}; negative control)": {
            "ok": stalled,
            "host ms p50": stalls,
        },
        **in_place_p99(entries, state, state),
        f"ring_in_place has the lowest host p99 of all strategies from {LOWEST_P99_FROM_BYTES // KiB} KiB ({state})": {
            "ok": all(times["ring_in_place"] <= min(times.values()) for times in lowest.values()),
            "ms": lowest,
        },
    }


def verdicts(entries: list[dict], busy_ms: float) -> dict[str, dict]:
    """:func:`guarantees`, then the overheads against the measured floors and whether the states held.

    A check is judged in :data:`JUDGED_CONDITIONS` (a busy GPU is ``busy_steady``); where it
    matters, the same check in ``busy_hot`` and ``busy`` follows it, marked as reported.
    """
    row, sizes = _rows(entries)
    judged = JUDGED_CONDITIONS
    reported = {
        "busy_hot": f"{SETTLE_MS:g} ms after work is queued on an idle GPU; reported",
        "busy": f"right after a {busy_ms:.0f} ms host block; reported",
    }
    bound = OVERHEAD_BOUND_MS

    def p50(name: str, n: int, condition: str) -> float:
        return row[name, n, condition]["host_ms_p50"]

    def per_size(value: Callable[[int, str], object], states: Sequence[str]) -> dict[str, object]:
        return {f"{n}/{c}": value(n, c) for n in sizes for c in states}

    def within_staging(states: Sequence[str]) -> dict:
        over = per_size(lambda n, c: p50("ring", n, c) - p50(staging_engine(n), n, c), states)
        return {
            "ok": all(value <= bound for value in over.values()),  # type: ignore[operator]
            "overhead ms (to_device - staging, staging timed in the same state)": over,
        }

    def submit_under(states: Sequence[str]) -> dict:
        submits = per_size(lambda n, c: p50("ring_in_place", n, c), states)
        return {"ok": all(value < bound for value in submits.values()), "submit ms": submits}  # type: ignore[operator]

    floors = per_size(
        lambda n, c: {"staging": p50(staging_engine(n), n, c), "bare_copy": p50("bare_copy", n, c)}, judged
    )
    over_floor = per_size(
        lambda n, c: p50("ring", n, c) - p50(staging_engine(n), n, c) - p50("bare_copy", n, c), judged
    )
    submit_over_copy = per_size(lambda n, c: p50("ring_in_place", n, c) - p50("bare_copy", n, c), judged)
    engines = per_size(
        lambda n, c: {
            "numpy p99": row["staging_numpy", n, c]["host_ms_p99"],
            "torch p99": row["staging_torch", n, c]["host_ms_p99"],
            "stage_copy uses": staging_engine(n),
        },
        judged,
    )

    def engine_ok(n: int) -> bool:
        worst = {name: max(row[f"staging_{name}", n, c]["host_ms_p99"] for c in judged) for name in ("numpy", "torch")}
        used = staging_engine(n).removeprefix("staging_")
        return worst[used] <= min(worst.values()) * (1 + ENGINE_TIE)

    still_busy = {
        f"{name}/{n}/{c}": row[name, n, c]["queue_still_busy"]
        for name in AUDIOMASK_COPIES
        for n in sizes
        for c in ("busy", "busy_hot", "busy_steady")
    }
    queue_effect = {
        f"{name}/{n}": p50(name, n, "busy") - p50(name, n, "waited")
        for name in ("ring", "ring_in_place", "pageable")
        for n in sizes
    }
    # pageable, the negative control, may wait for the queue at any size (the driver's own staging
    # buffers absorb only small payloads, and not always), and so drain it: the state must hold for the others.
    steady = [e for e in entries if e["gpu_state"] == "busy_steady" and e["strategy"] != "pageable"]
    steady_gaps = {f"{e['strategy']}/{e['bytes']}": e["gpu_idle_gaps"] for e in steady}
    return {
        **guarantees(entries, busy_ms),
        f"to_device within {bound} ms of its staging memcpy at every size (busy_steady, p50)": within_staging(
            ("busy_steady",)
        ),
        f"to_device within {bound} ms of its staging memcpy at every size (busy_hot: {reported['busy_hot']}, p50)": (
            within_staging(("busy_hot",))
        ),
        f"ring_in_place submit under {bound} ms at every size (busy_steady, p50)": submit_under(("busy_steady",)),
        **{
            f"ring_in_place submit under {bound} ms at every size ({state}: {why}, p50)": submit_under((state,))
            for state, why in reported.items()
        },
        f"to_device within {bound} ms of staging + bare copy at every size (idle and busy_steady, p50)": {
            "ok": all(value <= bound for value in over_floor.values()),  # type: ignore[operator]
            "overhead ms (to_device - staging - bare_copy)": over_floor,
            "floors ms": floors,
        },
        f"ring_in_place submit within {bound} ms of the bare copy at every size (idle and busy_steady, p50)": {
            "ok": all(value <= bound for value in submit_over_copy.values()),  # type: ignore[operator]
            "overhead ms (submit - bare_copy)": submit_over_copy,
        },
        f"stage_copy's engine has the lower worst-case staging p99 (idle or busy_steady) at every size, "
        f"or one within {ENGINE_TIE:.0%} of the other's": {
            "ok": all(engine_ok(n) for n in sizes),
            "ms": engines,
        },
        f"to_device and ring_in_place host time does not depend on the GPU queue: busy p50 within {bound} ms "
        "of the same host wait with an idle GPU, at every size": {
            "ok": all(value <= bound for key, value in queue_effect.items() if not key.startswith("pageable")),
            "busy - waited p50 ms (pageable shown as the control)": queue_effect,
        },
        "ring copies never waited for the busy queue (busy, busy_hot, busy_steady)": {
            "ok": all(value == 1.0 for value in still_busy.values()),
            "fraction of copies with the queue still busy after": still_busy,
        },
        f"busy_steady held: >= {STEADY_MIN_QUEUE_MS:g} ms of GPU work queued before every timed copy, and the "
        "GPU never went idle within a block (pageable, whose copies wait for the queue, excepted)": {
            "ok": bool(steady)
            and all(e["queue_ms_min"] >= STEADY_MIN_QUEUE_MS for e in steady)
            and not any(steady_gaps.values()),
            "queue ms before a copy, min": {f"{e['strategy']}/{e['bytes']}": e["queue_ms_min"] for e in steady},
            "GPU idle gaps": steady_gaps,
        },
    }
