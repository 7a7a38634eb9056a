"""What a recognizer's streams need, checked before anything large is allocated: context, caches, rings.

:func:`open_fitting` opens an encoder's stream of ``max_streams`` slots only
once its chunk is at most :data:`MAX_CHUNK_MS` of audio, its attention
context at most :data:`MAX_CONTEXT_MS`, and its state fits in the memory
free on its device (and the driver's sample rings and feature batches on the
host). The state per slot is measured, not
modelled: the tensors and arrays of a one-slot and a two-slot stream of the
same settings (every family allocates its caches up front), whose difference
is one slot's and whose remainder is shared (position biases, tables).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from audiomask.asr.model import ASRModel
from audiomask.asr.planner import slot_host_bytes
from audiomask.checks import check_int
from audiomask.constants import FRAME_MS
from audiomask.features.frontend import Frontend
from audiomask.features.process import lane_bounds
from audiomask.streaming import EncoderStream, open_stream

__all__ = [
    "CPU_LANES",
    "DEFAULT_MAX_STREAMS",
    "MAX_CHUNK_MS",
    "MAX_CONTEXT_MS",
    "default_lanes",
    "free_bytes",
    "open_fitting",
    "state_bytes",
]

MS_PER_S = 1000
# Audio a stream's attention context spans, (left_chunks + 1) * chunk_ms: ten minutes (7,500 tokens of
# 80 ms) is far beyond any streaming setting; larger settings are refused before anything is allocated.
MAX_CONTEXT_MS = 10 * 60 * MS_PER_S
# Audio of one encoder chunk: a minute is far beyond any streaming setting (Qwen3-ASR's chunk is 1 s), and
# bounds what the stream of the config's left context, opened to learn it, allocates.
MAX_CHUNK_MS = 60 * MS_PER_S
# A recognizer's encoder slots unless told: streams of several threads each hold one at once.
DEFAULT_MAX_STREAMS = 4
# On the CPU a chunk step costs a fixed part (its Python and kernel dispatch) and a part per slot, and it computes
# every slot of its lane (static shapes): the shipped model's step took 9.3 ms for 1 slot, 14.7 for 4, 37.6 for 16
# and 134 for 64 (2-core AMD EPYC, one torch thread). So by default the slots of a CPU recognizer form up to this many
# lanes: a stream alone costs a step of a lane's few slots (one slot up to 16 streams, 4 of 64), and 64 streams
# fed at once cost 16 steps a chunk, about twice one step of all 64 (bench/results/server_cpu.json).
CPU_LANES = 16
_GiB = 2**30
_KiB = 1024


def open_fitting(
    model: ASRModel,
    device: torch.device,
    max_streams: int,
    chunk_ms: int | None,
    left_chunks: int | None,
    cuda_graph: bool | None,
    lanes: int = 1,
) -> list[EncoderStream]:
    """The encoder's streams of ``max_streams`` slots in all, once their context and memory are known to fit.

    ``lanes`` streams (a driver's lanes), their slots differing by one at most
    (:func:`~audiomask.features.process.lane_bounds`); one stream by default.

    ``chunk_ms`` is at most :data:`MAX_CHUNK_MS`; the context is checked on a
    one-slot stream of that chunk and the config's left context (small,
    whatever the arguments); the memory per slot then comes from one- and
    two-slot streams of the settings asked for.
    """
    if chunk_ms is not None:
        chunk_ms = check_int("chunk_ms", chunk_ms, minimum=1, maximum=MAX_CHUNK_MS)
    if left_chunks is not None:
        left_chunks = check_int("left_chunks", left_chunks, minimum=0)

    def stream_of(slots: int, left: int | None) -> EncoderStream:
        return open_stream(model.encoder, slots, chunk_ms=chunk_ms, left_chunks=left, cuda_graph=cuda_graph)

    probe = stream_of(1, None)
    chunk = probe.chunk_frames * FRAME_MS
    left = probe.left_chunk if left_chunks is None else left_chunks
    if left is not None and (left + 1) * chunk > MAX_CONTEXT_MS:
        raise ValueError(
            f"left_chunks={left} with chunk_ms={chunk}: a stream attends to (left_chunks + 1) * chunk_ms = "
            f"{(left + 1) * chunk} ms of audio, more than MAX_CONTEXT_MS = {MAX_CONTEXT_MS}"
        )
    one = probe if left_chunks is None else stream_of(1, left_chunks)
    del probe
    device_one, host_one = state_bytes(one)
    device_two, host_two = state_bytes(stream_of(2, left_chunks))
    per_slot = (device_two - device_one, host_two - host_one + slot_host_bytes(model.frontend, one.chunk_frames))
    shared = (device_one - per_slot[0], host_one - (host_two - host_one))
    del one
    places = [(device, per_slot[0], shared[0]), (torch.device("cpu"), per_slot[1], shared[1])]
    if device.type == "cpu":  # one memory
        places = [(device, per_slot[0] + per_slot[1], shared[0] + shared[1])]
    for place, slot_bytes, shared_bytes in places:
        _check_fits(place, max_streams, slot_bytes, lanes * shared_bytes, chunk, left)  # each lane has its own
    return [stream_of(hi - lo, left_chunks) for lo, hi in lane_bounds(max_streams, lanes)]


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


def _check_fits(
    place: torch.device, max_streams: int, slot_bytes: int, shared_bytes: int, chunk_ms: int, left: int | None
) -> None:
    """``ValueError`` naming the argument to reduce when ``max_streams`` slots do not fit in ``place``'s free memory."""
    free = free_bytes(place)
    need = shared_bytes + max_streams * slot_bytes
    if need <= free:
        return
    settings = f"chunk_ms={chunk_ms}, left_chunks={left}"
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


def state_bytes(stream: EncoderStream) -> tuple[int, int]:
    """Bytes of the tensors and arrays ``stream`` holds: ``(on its device, on the host)``; the encoder's own excluded."""
    seen: set[int] = set()
    totals = [0, 0]

    def add(value: object, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                totals[value.device.type == "cpu" and stream.device.type != "cpu"] += storage.nbytes()
        elif isinstance(value, np.ndarray):
            if id(value) not in seen:
                seen.add(id(value))
                totals[1] += value.nbytes
        elif isinstance(value, (list, tuple)) and depth:
            for item in value:
                add(item, depth - 1)
        elif hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, Frontend, type)) and depth:
            for item in vars(value).values():
                add(item, depth - 1)

    add(stream, 3)
    return totals[0], totals[1]


def free_bytes(place: torch.device) -> int:
    """Bytes free for new allocations: on a CUDA device (its own and its allocator's cache), or the host's."""
    if place.type == "cuda":
        free, _ = torch.cuda.mem_get_info(place)
        return free + torch.cuda.memory_reserved(place) - torch.cuda.memory_allocated(place)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * _KiB  # kB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
