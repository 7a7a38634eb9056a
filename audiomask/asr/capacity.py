"""What a recognizer's slots need, checked before anything large is allocated: caches and rings.

:func:`open_fitting` opens an encoder's ``max_streams`` slots only
once their state fits in the memory free on their device (and the driver's
sample rings and feature batches on the host). The state comes from the
configuration's :class:`~audiomask.streaming.ChunkPlan`, whose family counts
it from the config (its chunk and context were bounded when it was made:
:data:`MAX_CHUNK_MS`, :data:`MAX_CONTEXT_MS`); no slots are opened to measure it.
"""

from __future__ import annotations

import os

import torch

from audiomask.asr.model import ASRModel
from audiomask.asr.planner import slot_host_bytes
from audiomask.checks import check_int
from audiomask.features.process import lane_bounds
from audiomask.streaming import ChunkPlan, EncoderSlots, open_slots
from audiomask.streaming.plan import MAX_CHUNK_MS, MAX_CONTEXT_MS, MS_PER_S

__all__ = [
    "CPU_LANES",
    "DEFAULT_MAX_STREAMS",
    "MAX_CHUNK_MS",
    "MAX_CONTEXT_MS",
    "MS_PER_S",
    "default_lanes",
    "free_bytes",
    "open_fitting",
]

# A recognizer's encoder slots unless told: streams of several threads each hold one at once.
DEFAULT_MAX_STREAMS = 4
# On the CPU a chunk step costs a fixed part (its Python and kernel dispatch) and a part per slot, and it computes
# every slot of its lane (static shapes). So by default the slots of a CPU recognizer form up to this many lanes: a
# stream alone costs a step of a lane's few slots (one slot up to 16 streams, 4 of 64), and 64 streams fed at once
# cost 16 steps a chunk instead of one step of all 64 (figures: docs/defaults.md).
CPU_LANES = 16
_GiB = 2**30
_KiB = 1024


def open_fitting(
    model: ASRModel, device: torch.device, max_streams: int, plan: ChunkPlan, lanes: int = 1
) -> list[EncoderSlots]:
    """The encoder's slots of ``plan``, ``max_streams`` in all, once their state is known to fit.

    ``lanes`` batches of slots (a driver's lanes), their sizes differing by one at most
    (:func:`~audiomask.features.process.lane_bounds`); one batch by default. Each
    lane holds the plan's ``shared_bytes`` and each slot its ``slot_bytes`` on
    ``device``, and :func:`~audiomask.asr.planner.slot_host_bytes` on the host;
    more than is free raises ``ValueError`` naming what to reduce, before allocating.
    """
    per_slot = (plan.slot_bytes, slot_host_bytes(model.frontend, plan.chunk_frames))
    places = [(device, per_slot[0], plan.shared_bytes), (torch.device("cpu"), per_slot[1], 0)]
    if device.type == "cpu":  # one memory
        places = [(device, sum(per_slot), plan.shared_bytes)]
    for place, slot_bytes, shared_bytes in places:
        _check_fits(place, max_streams, slot_bytes, lanes * shared_bytes, plan)  # each lane has its own
    return [open_slots(model.encoder, hi - lo, plan=plan) for lo, hi in lane_bounds(max_streams, lanes)]


def default_lanes(max_streams: int, device: torch.device, frontend_workers: int | None = None) -> tuple[int, int]:
    """``(lanes, slots)`` of a recognizer asked for ``max_streams`` slots on ``device`` and no lanes.

    One lane on CUDA (a step there costs its kernel launches, whatever its slots). On the CPU lanes of
    ``ceil(max_streams / CPU_LANES)`` slots, none narrower than ``frontend_workers`` (each front-end process
    owns slots of every lane), all of one width: ``slots`` is ``max_streams`` rounded up to a multiple of
    ``lanes``, so that a stream's step computes as many rows whichever lane it joins (its outputs are the same
    to the bit whatever the other streams do).

    >>> cpu = torch.device("cpu")
    >>> default_lanes(64, cpu), default_lanes(4, cpu), default_lanes(17, cpu), default_lanes(64, cpu, 8)
    ((16, 64), (4, 4), (9, 18), (8, 64))
    >>> default_lanes(64, torch.device("cuda"))
    (1, 64)
    """
    if device.type != "cpu":
        return 1, max_streams
    workers = 1 if frontend_workers is None else check_int("frontend_workers", frontend_workers, minimum=1)
    width = min(max_streams, max(-(-max_streams // CPU_LANES), workers))
    lanes = -(-max_streams // width)
    return lanes, lanes * -(-max_streams // lanes)


def _check_fits(place: torch.device, max_streams: int, slot_bytes: int, shared_bytes: int, plan: ChunkPlan) -> None:
    """``ValueError`` naming the argument to reduce when ``max_streams`` slots do not fit in ``place``'s free memory."""
    free = free_bytes(place)
    need = shared_bytes + max_streams * slot_bytes
    if need <= free:
        return
    settings = f"chunk_ms={plan.chunk_ms}, left_chunks={plan.left_chunks}"
    fit = (free - shared_bytes) // slot_bytes if slot_bytes > 0 else 0
    if fit < 1:
        raise ValueError(
            f"{settings}: one stream's state takes {slot_bytes:,} bytes on {place} beside {shared_bytes:,} shared, "
            f"more than the {free:,} bytes free there: reduce chunk_ms or left_chunks"
        )
    raise ValueError(
        f"max_streams={max_streams}: the streams' state takes about {need / _GiB:.1f} GiB on {place} "
        f"({slot_bytes:,} bytes a stream at {settings}), more than the {free / _GiB:.1f} GiB free there: "
        f"at most {fit} streams fit"
    )


def free_bytes(place: torch.device) -> int:
    """Bytes free for new allocations: on a CUDA device (its own and its allocator's cache, within this
    process's share of the device, :func:`torch.cuda.set_per_process_memory_fraction`), or the host's."""
    if place.type == "cuda":
        place = torch.device("cuda", torch.cuda.current_device() if place.index is None else place.index)
        free, total = torch.cuda.mem_get_info(place)
        allocated = torch.cuda.memory_allocated(place)
        share = int(torch.cuda.get_per_process_memory_fraction(place) * total) - allocated
        return max(0, min(free + torch.cuda.memory_reserved(place) - allocated, share))
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * _KiB  # kB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
