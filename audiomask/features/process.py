"""A driver's front-end stage in a process of its own: features computed beside the main thread, not under its GIL.

Why: a streaming driver computes cycle N+1's features while it launches cycle
N's encoder step and decodes cycle N-1. On a worker thread the two share one
interpreter lock, and every torch call of the front end hands it over and
takes it back: a main thread running Python at the same time makes each
hand-back wait (a pure-Python loop on the main thread took a B = 16
front-end cycle from 2.2 to 496 ms on the H200, from 1.8 to 461 ms on a
2-core CPU, where in a process it took 1.5 ms; the overlapped driver's front
end ran 1.7-2.3x slower than alone on the H200, whatever torch's thread
count, the kind of wait or the switch interval). A process has its own
interpreter.

:class:`FeatureProcess` keeps a :class:`~audiomask.features.slots.SlotFeatures`
in a spawned process. Samples go in and features come out through shared
memory (torch tensors shared with the process), three buffers of each taken
in turn: while the caller reads cycle N's features, the process computes N+1
and has N+2 queued, so that it never waits for the caller between cycles.
Each cycle's description (slots, block lengths, flags) and its results
(frame counts, compute time) are in shared memory too: the pipe carries one
byte each way (a pickled message cost ~50 us a cycle to pack and unpack, on
the side that paces the pipeline). Up to ``MAX_IN_FLIGHT`` cycles may be
submitted before the first :meth:`result` is taken; results come in
submission order. On the H200 the driver with this stage ran within 3 % of
max(front end, encoder step). Starting the process costs an
interpreter and torch's import (seconds, once per driver) and that
interpreter's memory.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
import torch
import torch.multiprocessing  # registers the reductions that share tensors' memory with a spawned process

from audiomask.features.frontend import Frontend
from audiomask.features.slots import SlotFeatures

__all__ = ["MAX_IN_FLIGHT", "START_TIMEOUT_S", "FeatureProcess"]

START_TIMEOUT_S = 120.0  # an interpreter and torch's import, on a loaded machine
MAX_IN_FLIGHT = 2  # cycles submitted and not yet taken: one computing, one queued behind it
_BUFFERS = MAX_IN_FLIGHT + 1  # and the one the caller reads


# The pipe's messages. To the process: one byte, the buffer of the cycle to compute, or _STOP.
# From it: _DONE (the cycle, or its start-up) or _FAILED followed by the error's text.
_STOP, _DONE, _FAILED = b"", b"\x00", b"\x01"
_SLOTS, _LENGTHS, _FINAL, _JOINS = range(4)  # rows of a cycle's description


@dataclass(frozen=True)
class _Buffers:
    """The memory shared with the process, ``_BUFFERS`` of each, indexed by buffer first.

    Torch tensors (what crosses to the process), or numpy views of them (:meth:`arrays`).
    """

    samples: torch.Tensor | np.ndarray  # float32 (B, block_samples): each slot's new samples, from its row's start
    plans: torch.Tensor | np.ndarray  # int64 (4, B): slots, block lengths, final flags, joins (first `sizes` entries)
    sizes: torch.Tensor | np.ndarray  # int64 (2,): how many slots, how many joins
    features: torch.Tensor | np.ndarray  # float32, SlotFeatures.shape: the front end's layout of a chunk batch
    counts: torch.Tensor | np.ndarray  # int64 (B,): frames per slot
    cpu_s: torch.Tensor | np.ndarray  # float64 (): the compute's seconds

    @classmethod
    def allocate(cls, batch_size: int, block_samples: int, features_shape: tuple[int, int, int]) -> _Buffers:
        def shared(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(_BUFFERS, *shape, dtype=dtype).share_memory_()

        return cls(
            shared(batch_size, block_samples, dtype=torch.float32),
            shared(4, batch_size, dtype=torch.int64),
            shared(2, dtype=torch.int64),
            shared(*features_shape, dtype=torch.float32),
            shared(batch_size, dtype=torch.int64),
            shared(dtype=torch.float64),
        )

    def arrays(self) -> _Buffers:
        """The same memory as numpy arrays, each a view that holds it (not ``dataclasses.astuple``: it copies)."""
        return _Buffers(*(getattr(self, field.name).numpy() for field in dataclasses.fields(self)))


def _serve(
    connection: Connection, frontend: Frontend, batch_size: int, chunk_frames: int, buffers: _Buffers, threads: int
) -> None:
    """The process: compute each cycle the pipe names until it says _STOP (or closes)."""
    torch.set_num_threads(threads)
    shared = buffers.arrays()  # the caller's memory
    stage = SlotFeatures(frontend, batch_size, chunk_frames)
    connection.send_bytes(_DONE)
    while True:
        try:
            message = connection.recv_bytes()
        except EOFError:
            return
        if message == _STOP:
            return
        buffer = message[0]
        started = time.perf_counter()
        try:
            plan, (slots, joins) = shared.plans[buffer], shared.sizes[buffer]
            blocks = [shared.samples[buffer, row, :length] for row, length in enumerate(plan[_LENGTHS, :slots])]
            final = plan[_FINAL, :slots].astype(bool)
            _, counts = stage.compute(
                plan[_SLOTS, :slots], blocks, final, plan[_JOINS, :joins], shared.features[buffer]
            )
        except Exception as error:  # noqa: BLE001 (any failure goes back to the caller, who raises it)
            connection.send_bytes(_FAILED + f"{type(error).__name__}: {error}".encode())
            continue
        shared.counts[buffer] = counts
        shared.cpu_s[buffer] = time.perf_counter() - started
        connection.send_bytes(_DONE)


def _shutdown(process: multiprocessing.process.BaseProcess, connection: Connection) -> None:
    """Ask ``process`` to stop (then make it), and close the pipe."""
    if process.is_alive():
        try:
            connection.send_bytes(_STOP)
        except OSError:  # BrokenPipeError among them
            pass
        process.join(timeout=5)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
    connection.close()


class FeatureProcess:
    """:class:`~audiomask.features.slots.SlotFeatures` of ``batch_size`` slots in a spawned process.

    Args:
        frontend: the front end (pickled into the process).
        batch_size: slots, ``B``.
        chunk_frames: frames per slot per cycle at most.
        block_samples: samples per slot per cycle at most (a stream's first block).
        threads: torch intra-op threads of the process (default: this process's).

    Raises :class:`RuntimeError` when the process does not start, fails on a
    cycle (with its error) or dies. Call :meth:`close` when done (also a
    context manager).
    """

    def __init__(
        self, frontend: Frontend, batch_size: int, chunk_frames: int, block_samples: int, threads: int | None = None
    ) -> None:
        self.batch_size, self.chunk_frames, self.block_samples = batch_size, chunk_frames, block_samples
        # Shared with the process (torch moves their memory's file descriptors to it); freed with the last
        # reference on either side, so features handed out stay readable after close().
        buffers = _Buffers.allocate(batch_size, block_samples, SlotFeatures(frontend, batch_size, chunk_frames).shape)
        self._shared = buffers.arrays()
        context = torch.multiprocessing.get_context("spawn")  # fork would copy CUDA and OpenMP state it cannot use
        self._connection, child = context.Pipe()
        threads = torch.get_num_threads() if threads is None else threads
        self._process = context.Process(
            target=_serve,
            args=(child, frontend, batch_size, chunk_frames, buffers, threads),
            name="audiomask-features",
            daemon=True,
        )
        self._in_flight: deque[int] = deque()  # buffers of the cycles submitted, oldest first
        self._next = 0
        # Stops the process on close(), when the object is collected, or at exit.
        self._finalizer = weakref.finalize(self, _shutdown, self._process, self._connection)
        try:
            self._process.start()
            child.close()
            if not self._connection.poll(START_TIMEOUT_S):
                raise RuntimeError(f"the feature process did not start within {START_TIMEOUT_S:.0f} s")
            self._receive(starting=True)
        except BaseException:
            self.close()
            raise

    def submit(self, slots: np.ndarray, blocks: Sequence[np.ndarray], final: np.ndarray, joins: np.ndarray) -> None:
        """Queue one cycle (see :meth:`SlotFeatures.compute`), behind those in flight (at most ``MAX_IN_FLIGHT``)."""
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            raise RuntimeError(f"{MAX_IN_FLIGHT} cycles are in flight: take a result() before submitting another")
        if len(blocks) > self.batch_size:
            raise ValueError(f"blocks must hold at most {self.batch_size} entries (batch_size), got {len(blocks)}")
        if not len(slots) == len(blocks) == len(final):
            raise ValueError(
                f"slots, blocks and final must have one entry per slot, got {len(slots)}, {len(blocks)}, {len(final)}"
            )
        buffer, shared = self._next, self._shared
        lengths = np.array([len(block) for block in blocks], np.int64)
        if lengths.size and lengths.max() > self.block_samples:
            raise ValueError(f"a block holds {lengths.max()} samples, more than block_samples={self.block_samples}")
        for row, block in enumerate(blocks):
            shared.samples[buffer, row, : len(block)] = block
        plan, count = shared.plans[buffer], len(blocks)
        plan[_SLOTS, :count], plan[_LENGTHS, :count], plan[_FINAL, :count] = slots, lengths, final
        plan[_JOINS, : len(joins)] = joins
        shared.sizes[buffer] = count, len(joins)
        try:
            self._connection.send_bytes(bytes((buffer,)))
        except OSError as error:  # BrokenPipeError among them
            raise self._died() from error
        self._in_flight.append(buffer)
        self._next = (buffer + 1) % _BUFFERS

    def result(self) -> tuple[np.ndarray, np.ndarray, float]:
        """The oldest cycle in flight's ``(features, counts, cpu_s)``; ``features`` stays valid until the next result.

        Blocks until the process has computed it.
        """
        if not self._in_flight:
            raise RuntimeError("no cycle is in flight: submit() one first")
        buffer = self._in_flight.popleft()
        self._receive()
        shared = self._shared
        return shared.features[buffer], shared.counts[buffer].copy(), float(shared.cpu_s[buffer])

    def _receive(self, *, starting: bool = False) -> None:
        try:
            message = self._connection.recv_bytes()
        except (EOFError, OSError) as error:
            raise self._died(starting) from error
        if message.startswith(_FAILED):
            raise RuntimeError(f"the feature process failed: {message[len(_FAILED) :].decode()}")

    def _died(self, starting: bool = False) -> RuntimeError:
        self._process.join(timeout=1)
        message = f"the feature process died (exit code {self._process.exitcode})"
        if starting:  # the usual cause: spawn imports the parent's script again, and it starts another process
            message += (
                " while starting; its own error is printed above. A script that starts one must guard its "
                "entry point with `if __name__ == '__main__':` (multiprocessing's spawn imports it again)"
            )
        return RuntimeError(message)

    def close(self) -> None:
        """Stop the process (idempotent; also done when the object is collected or the interpreter exits)."""
        self._finalizer()

    def __enter__(self) -> FeatureProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
