"""A driver's front-end stage in processes of their own: features computed beside the main thread, not under its GIL.

Why: a streaming driver computes cycle N+1's features while it launches cycle
N's encoder step and decodes cycle N-1. On a worker thread the two share one
interpreter lock, and every torch call of the front end hands it over and
takes it back: a main thread running Python at the same time makes each
hand-back wait, whatever torch's thread count, the kind of wait or the switch
interval, and a front-end cycle then costs many times its time alone
(figures: docs/defaults.md). A process
has its own interpreter.

:class:`FeatureProcess` splits the slots over ``workers`` spawned processes,
each owning a fixed contiguous piece of every lane of them (a driver's
lanes: groups of slots stepped together) with a
:class:`~audiomask.features.slots.SlotFeatures` of its own per piece (framers
and front-end state of its slots only), so the stage scales with the host's
cores and a cycle over one lane keeps every process busy: a process's torch
threads speed up its batched computation, and the Python it runs per slot (for
a stream's first and last blocks) runs on one core whatever its threads
(:data:`CORES_PER_WORKER`). Samples, cycles and features are
shared memory (torch tensors shared with the processes): the driver writes
each slot's samples into its ring (:class:`~audiomask.features.slots.SlotSamples`)
as they arrive, a cycle is a few ``(B,)`` arrays naming each slot's block
there, and every process writes its slice of the cycle's feature batch
straight into the one batch the caller reads. Cycle descriptions and feature
batches are three buffers taken in turn: while the caller reads cycle N's
features, the processes compute N+1 and have N+2 queued, so that they never
wait for the caller between cycles. Each process's pipe carries one byte each
way per cycle: a pickled message would cost its packing and unpacking on the
side that paces the pipeline. Up to ``MAX_IN_FLIGHT`` cycles may be
submitted before the first :meth:`~FeatureProcess.result` is taken; results
come in submission order. How close the overlapped driver with such a process
comes to max(front end, encoder step): docs/benchmarks.md, the pipeline of
``latency_h200.json``. Starting a process costs an interpreter and torch's
import (seconds, once per driver) and that interpreter's memory.

Every process computes its slots' frames exactly as one process computing
all of them would (see :mod:`audiomask.features.slots`): the features are
the same bit for bit whatever the number of processes, given the same torch
threads in each.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
import torch
import torch.multiprocessing  # registers the reductions that share tensors' memory with a spawned process

from audiomask.checks import check_int
from audiomask.features.frontend import Frontend
from audiomask.features.slots import SlotCycle, SlotFeatures, SlotSamples

__all__ = [
    "CORES_PER_WORKER",
    "MAX_IN_FLIGHT",
    "START_TIMEOUT_S",
    "CycleFeatures",
    "FeatureProcess",
    "available_cores",
    "default_threads",
    "default_workers",
    "lane_bounds",
]

START_TIMEOUT_S = 120.0  # an interpreter and torch's import, on a loaded machine
MAX_IN_FLIGHT = 2  # cycles submitted and not yet taken: one computing, one queued behind it
_BUFFERS = MAX_IN_FLIGHT + 1  # and the one the caller reads
# Default: one front-end process per this many cores, which its torch threads use (figures: docs/defaults.md
# ).
CORES_PER_WORKER = 4
_CYCLE_ROWS = len(dataclasses.fields(SlotCycle))  # a cycle's (B,) arrays, one row each
_WALL, _CPU = range(2)  # a process's seconds per cycle: wall time, CPU time (all its threads)


# The pipe's messages. To a process: one byte, the buffer of the cycle to compute, or _STOP.
# From it: _DONE (the cycle, or its start-up) or _FAILED followed by the error's text.
_STOP, _DONE, _FAILED = b"", b"\x00", b"\x01"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where that is unknown)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def lane_bounds(batch_size: int, lanes: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of ``lanes`` contiguous lanes of ``batch_size`` slots, sizes differing by one at most.

    >>> lane_bounds(10, 3)
    [(0, 3), (3, 6), (6, 10)]
    """
    return [(lane * batch_size // lanes, (lane + 1) * batch_size // lanes) for lane in range(lanes)]


def default_workers(batch_size: int, cores: int | None = None) -> int:
    """Front-end processes for ``batch_size`` slots on ``cores`` cores (default :func:`available_cores`).

    One per :data:`CORES_PER_WORKER` cores, at least one, never more than the slots.

    >>> default_workers(256, cores=16), default_workers(256, cores=2), default_workers(3, cores=64)
    (4, 1, 3)
    """
    cores = available_cores() if cores is None else cores
    return max(1, min(batch_size, cores // CORES_PER_WORKER))


def default_threads(workers: int, cores: int | None = None) -> int:
    """Torch intra-op threads of each of ``workers`` front-end processes: the cores shared out, at most this
    process's own thread count, at least one.

    >>> import torch
    >>> default_threads(4, cores=16) == min(4, torch.get_num_threads())
    True
    """
    cores = available_cores() if cores is None else cores
    return max(1, min(torch.get_num_threads(), cores // workers))


@dataclass(frozen=True)
class CycleFeatures:
    """One cycle's output of the front-end stage."""

    features: np.ndarray  # float32, SlotFeatures.shape: the chunk batch (zero past each slot's count)
    counts: np.ndarray  # int64 (B,): frames per slot
    seconds: float  # the stage's wall time: its slowest process's
    cpu_s: float  # CPU seconds of the stage: every process, all its threads


@dataclass(frozen=True)
class _Buffers:
    """The memory shared with the processes; the per-cycle ones ``_BUFFERS`` deep, indexed by buffer first.

    Torch tensors (what crosses to a process), or numpy views of them (:meth:`arrays`).
    """

    samples: torch.Tensor | np.ndarray  # float32 (B, capacity): each slot's ring, SlotSamples' memory
    cycles: torch.Tensor | np.ndarray  # int64 (_CYCLE_ROWS, B): SlotCycle.rows()
    features: torch.Tensor | np.ndarray  # float32, SlotFeatures.shape: the front end's layout of a chunk batch
    counts: torch.Tensor | np.ndarray  # int64 (B,): frames per slot
    seconds: torch.Tensor | np.ndarray  # float64 (workers, 2): each process's wall and CPU seconds

    @classmethod
    def allocate(cls, batch_size: int, capacity: int, features_shape: tuple[int, int, int], workers: int) -> _Buffers:
        def shared(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype).share_memory_()

        return cls(
            shared(batch_size, capacity, dtype=torch.float32),
            shared(_BUFFERS, _CYCLE_ROWS, batch_size, dtype=torch.int64),
            shared(_BUFFERS, *features_shape, dtype=torch.float32),
            shared(_BUFFERS, batch_size, dtype=torch.int64),
            shared(_BUFFERS, workers, 2, dtype=torch.float64),
        )

    def arrays(self) -> _Buffers:
        """The same memory as numpy arrays, each a view that holds it (not ``dataclasses.astuple``: it copies)."""
        return _Buffers(*(getattr(self, field.name).numpy() for field in dataclasses.fields(self)))


def _serve(
    connection: Connection,
    frontend: Frontend,
    chunk_frames: int,
    buffers: _Buffers,
    worker: int,
    ranges: list[tuple[int, int]],
    threads: int,
) -> None:
    """A process: compute its slot ``ranges`` (each ``[lo, hi)``) of each cycle the pipe names until _STOP.

    A range none of whose slots advances or joins is skipped when the process owns several (one per lane):
    its rows keep their last features and their counts read 0.
    """
    torch.set_num_threads(threads)
    shared = buffers.arrays()  # the caller's memory
    stages = [
        (lo, hi, SlotFeatures(frontend, hi - lo, chunk_frames), SlotSamples(shared.samples[lo:hi])) for lo, hi in ranges
    ]
    connection.send_bytes(_DONE)
    while True:
        try:
            message = connection.recv_bytes()
        except EOFError:
            message = _STOP
        if message == _STOP:
            # At once: the interpreter's teardown with torch loaded costs a fraction of a second a
            # process, and all it holds (shared memory, the pipe) the kernel frees.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        buffer = message[0]
        started, cpu_started = time.perf_counter(), time.process_time()
        try:
            for lo, hi, stage, samples in stages:
                cycle = SlotCycle.from_rows(shared.cycles[buffer, :, lo:hi])
                if len(stages) > 1 and not (cycle.active.any() or cycle.join.any()):
                    shared.counts[buffer, lo:hi] = 0
                    continue
                _, counts = stage.compute_cycle(samples, cycle, shared.features[buffer, lo:hi])
                shared.counts[buffer, lo:hi] = counts
        except Exception as error:  # noqa: BLE001 (any failure goes back to the caller, who raises it)
            connection.send_bytes(_FAILED + f"{type(error).__name__}: {error}".encode())
            continue
        shared.seconds[buffer, worker] = time.perf_counter() - started, time.process_time() - cpu_started
        connection.send_bytes(_DONE)


def _shutdown(processes: list[multiprocessing.process.BaseProcess], connections: list[Connection]) -> None:
    """Ask every process to stop (then make it), and close the pipes."""
    for process, connection in zip(processes, connections):
        if process.is_alive():
            try:
                connection.send_bytes(_STOP)
            except OSError:  # BrokenPipeError among them
                pass
    for process in processes:
        if process.pid is None:  # never started (an earlier one failed to)
            continue
        process.join(timeout=5)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
    for connection in connections:
        connection.close()


class FeatureProcess:
    """:class:`~audiomask.features.slots.SlotFeatures` of ``batch_size`` slots in ``workers`` spawned processes.

    The slots form ``lanes`` contiguous lanes (sizes differing by one at
    most; a driver steps a lane's slots together), and process ``w`` owns the
    ``w``-th of ``workers`` contiguous pieces of every lane
    (:attr:`ranges` ``[w]``), so that a cycle over one lane's slots keeps
    every process busy and takes about ``1 / lanes`` of a full cycle's time.
    The caller writes each slot's samples into :attr:`samples` (its ring) and
    names each cycle's blocks there with a
    :class:`~audiomask.features.slots.SlotCycle`.

    Args:
        frontend: the front end (pickled into each process).
        batch_size: slots, ``B``.
        chunk_frames: frames per slot per cycle at most.
        capacity: samples per slot's ring (a block is at most this long).
        threads: torch intra-op threads of each process (default :func:`default_threads`).
        workers: processes, ``1 <= workers <= batch_size // lanes`` (default :func:`default_workers`).
        lanes: how many groups of slots cycles advance together (equal sizes, see :func:`lane_bounds`), or
            each lane's size in slot order (summing to ``batch_size``).

    Raises :class:`RuntimeError` when a process does not start, fails on a
    cycle (with its error) or dies. Call :meth:`close` when done (also a
    context manager); the processes are also stopped when the object is
    collected and at exit.
    """

    def __init__(
        self,
        frontend: Frontend,
        batch_size: int,
        chunk_frames: int,
        capacity: int,
        threads: int | None = None,
        workers: int | None = None,
        lanes: int | Sequence[int] = 1,
    ) -> None:
        batch_size = check_int("batch_size", batch_size, minimum=1)
        if isinstance(lanes, Sequence):
            sizes = [check_int("lanes", size, minimum=1) for size in lanes]
            if sum(sizes) != batch_size:
                raise ValueError(f"lanes must sum to batch_size ({batch_size}), got {sizes}")
            ends = np.cumsum([0, *sizes]).tolist()
            bounds = list(zip(ends[:-1], ends[1:]))
        else:
            bounds = lane_bounds(batch_size, check_int("lanes", lanes, minimum=1, maximum=batch_size))
        narrowest = min(hi - lo for lo, hi in bounds)  # the fewest slots of a lane
        workers = default_workers(narrowest) if workers is None else check_int("workers", workers, minimum=1)
        if workers > narrowest:
            raise ValueError(
                f"workers must be at most the slots of a lane ({narrowest} = the narrowest lane's): each owns "
                f"slots of every lane, got {workers}"
            )
        threads = default_threads(workers) if threads is None else check_int("threads", threads, minimum=1)
        self.batch_size, self.chunk_frames, self.capacity = batch_size, chunk_frames, capacity
        self.workers, self.threads = workers, threads
        self.lanes = bounds  # each lane's [lo, hi)
        # Each process's [lo, hi) ranges: its piece of every lane.
        self.ranges = [
            [(lo + worker * (hi - lo) // workers, lo + (worker + 1) * (hi - lo) // workers) for lo, hi in bounds]
            for worker in range(workers)
        ]
        # Shared with the processes (torch moves their memory's file descriptors to them); freed with the last
        # reference on either side, so features handed out stay readable after close().
        shape = SlotFeatures(frontend, batch_size, chunk_frames).shape
        buffers = _Buffers.allocate(batch_size, capacity, shape, workers)
        self._shared = buffers.arrays()
        self.samples = self._shared.samples  # (B, capacity) float32: the slots' rings, written by the caller
        # (_BUFFERS, *shape) float32: every result's features are a view of it (for a caller that page-locks it).
        self.feature_memory: torch.Tensor = buffers.features  # type: ignore[assignment]
        context = torch.multiprocessing.get_context("spawn")  # fork would copy CUDA and OpenMP state it cannot use
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._connections: list[Connection] = []
        children = []
        for worker in range(workers):
            connection, child = context.Pipe()
            self._processes.append(
                context.Process(
                    target=_serve,
                    args=(child, frontend, chunk_frames, buffers, worker, self.ranges[worker], threads),
                    name=f"audiomask-features-{worker}",
                    daemon=True,
                )
            )
            self._connections.append(connection)
            children.append(child)
        self._in_flight: deque[int] = deque()  # buffers of the cycles submitted, oldest first
        self._next = 0
        self._last = -1  # the buffer of the last result taken
        self._readers: dict[int, object] = {}  # buffer -> what reads its features still (see read_until)
        # Stops the processes on close(), when the object is collected, or at exit.
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._connections)
        try:
            for process, child in zip(self._processes, children):
                process.start()
                child.close()
            deadline = time.monotonic() + START_TIMEOUT_S
            for worker, connection in enumerate(self._connections):
                if not connection.poll(max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(f"the feature processes did not start within {START_TIMEOUT_S:.0f} s")
                self._receive(worker, starting=True)
        except BaseException:
            self.close()
            raise

    def submit(self, cycle: SlotCycle) -> None:
        """Queue one cycle, behind those in flight (at most ``MAX_IN_FLIGHT``).

        The samples ``cycle`` names stay in :attr:`samples` until its :meth:`result` is taken.
        """
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            raise RuntimeError(f"{MAX_IN_FLIGHT} cycles are in flight: take a result() before submitting another")
        rows = cycle.rows()
        if rows.shape[1] != self.batch_size:
            raise ValueError(f"cycle must describe {self.batch_size} slots (batch_size), got {rows.shape[1]}")
        longest = int(cycle.length.max())
        if longest > self.capacity:
            raise ValueError(f"a block holds {longest} samples, more than capacity={self.capacity}")
        buffer = self._next
        reader = self._readers.pop(buffer, None)
        if reader is not None:  # a copy of an earlier result from this buffer: done long since, as a rule
            reader.synchronize()  # type: ignore[attr-defined]
        self._shared.cycles[buffer] = rows
        for worker, connection in enumerate(self._connections):
            try:
                connection.send_bytes(bytes((buffer,)))
            except OSError as error:  # BrokenPipeError among them
                raise self._died(worker) from error
        self._in_flight.append(buffer)
        self._next = (buffer + 1) % _BUFFERS

    def result(self) -> CycleFeatures:
        """The oldest cycle in flight's features; its ``features`` array stays valid until the next result.

        Blocks until every process has computed its slots of it. The array is a view of
        :attr:`feature_memory`; once the next result is taken, a submission may write it again (after
        :meth:`read_until`'s reader is done).
        """
        if not self._in_flight:
            raise RuntimeError("no cycle is in flight: submit() one first")
        buffer = self._last = self._in_flight.popleft()
        failures = [failure for worker in range(self.workers) if (failure := self._receive(worker))]
        if failures:
            raise RuntimeError(f"the feature process failed: {failures[0]}")
        shared = self._shared
        seconds = shared.seconds[buffer]
        return CycleFeatures(
            shared.features[buffer],
            shared.counts[buffer].copy(),
            float(seconds[:, _WALL].max()),
            float(seconds[:, _CPU].sum()),
        )

    def read_until(self, reader: object) -> None:
        """The last result's features are still read until ``reader`` is done (an asynchronous copy from them):
        the submission that would write their buffer again first calls ``reader.synchronize()``.

        ``reader``: e.g. the CUDA event after a ``non_blocking`` copy from page-locked :attr:`feature_memory`.
        """
        if self._last < 0:
            raise RuntimeError("no result was taken: nothing is being read")
        self._readers[self._last] = reader

    def _receive(self, worker: int, *, starting: bool = False) -> str | None:
        """Process ``worker``'s answer: ``None`` when done, its error's text when it failed."""
        try:
            message = self._connections[worker].recv_bytes()
        except (EOFError, OSError) as error:
            raise self._died(worker, starting) from error
        return message[len(_FAILED) :].decode() if message.startswith(_FAILED) else None

    def _died(self, worker: int, starting: bool = False) -> RuntimeError:
        process = self._processes[worker]
        process.join(timeout=1)
        which = "the feature process" if self.workers == 1 else f"the feature process {worker + 1} of {self.workers}"
        message = f"{which} died (exit code {process.exitcode})"
        if starting:  # the usual cause: spawn imports the parent's script again, and it starts another process
            message += (
                " while starting; its own error is printed above. A script that starts one must guard its "
                "entry point with `if __name__ == '__main__':` (multiprocessing's spawn imports it again)"
            )
        return RuntimeError(message)

    def close(self) -> None:
        """Stop the processes (idempotent; also done when the object is collected or the interpreter exits)."""
        self._finalizer()

    def __enter__(self) -> FeatureProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
