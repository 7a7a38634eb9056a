"""Soak the streaming driver: many live streams, >= 100,000 chunks, a checksum on every transfer.

A tiny random Phi-4MM encoder (:data:`audiomask.bench.models.TINY_PHI4MM`) and
CTC head run in a :class:`~audiomask.asr.driver.StreamingDriver` of
``streams`` slots. Streams come and go as on a server: each sends 0.3-5 s of
noise in pieces of 0.5-1.5 chunks per tick, then ends, and a new one opens in
its place, so slots are freed and reused all the time. Every tick feeds the
active streams and advances the driver (a cycle when every occupied slot has
its next chunk).

Every transfer is audited. Each :func:`~audiomask.transfer.to_device` call
made inside audiomask (the encoder's feature batches and masks) gets a
checksum of its host data, converted to the result's dtype, before the copy,
and one of the result computed where the result lives (on the device, after
the copy, on the same CUDA stream as the encoder step that reads it); each
:func:`~audiomask.transfer.to_host` call (the argmax ids, CUDA only) gets one
on the device and one of the host copy once its event has completed. The
checksum is a position-weighted sum of the payload's 16-bit words (exact
integers: any changed, lost or moved byte changes it). A mismatch counts as
a corrupted payload. On the CPU, where ``to_device`` copies without a ring,
the audit stages every copy through a :class:`~audiomask.transfer.PinnedRing`
of plain memory, so the ring's slot reuse is soaked as well.

RSS (and on CUDA torch's pinned host-memory statistics) is recorded at the
start, after warm-up, at every tenth of the run and at the end; the ring's
counters after warm-up and at the end (``grows`` must not move).

:func:`run_soak` returns the report; :func:`main` is the command line
(``scripts/soak.py``), which exits 1 when any payload was corrupted::

    python3 scripts/soak.py --device cpu --chunks 100000 --out bench/results/soak_cpu.json
    python3 scripts/soak.py --device cuda --chunks 100000 --out bench/results/soak_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

import audiomask
import audiomask.transfer
from audiomask.asr.driver import DriverStream, StreamingDriver
from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.models import TINY_PHI4MM
from audiomask.checks import check_int
from audiomask.constants import FRAME_MS, SAMPLE_RATE
from audiomask.models import Phi4MMEncoder
from audiomask.models.ctc import CTCHead
from audiomask.streaming import open_slots
from audiomask.transfer import PinnedRing, default_ring

__all__ = ["TransferAudit", "checksum", "main", "run_soak"]

CHUNK_TOKENS, LEFT_CHUNKS = 2, 2  # 160 ms chunks (2 tokens of 80 ms), 2 chunks of left context
CHUNK_MS = CHUNK_TOKENS * TINY_PHI4MM.time_reduction * FRAME_MS
VOCAB = 7
STREAM_SECONDS = (0.3, 5.0)  # each stream sends this much audio, uniformly drawn
PIECE_CHUNKS = (0.5, 1.5)  # each tick a stream sends this many chunks' worth of samples, uniformly drawn
WARMUP_FRACTION = 0.02  # of the chunks: allocator caches and the ring reach their working size
VERIFY_EVERY = 256  # device checksums are compared in batches of this many transfers (one sync each)
CHECKSUM_MODULUS = 65521  # weights 1 .. 65521 (a prime): a word moved by any distance changes the sum
SNAPSHOTS = 10  # RSS and ring snapshots over the run


def checksum(tensor: torch.Tensor) -> torch.Tensor:
    """Position-weighted sum of a tensor's 16-bit words (bytes for 1-byte dtypes), as an int64 0-d tensor.

    Computed where the tensor lives, without a sync. Exact: words < 2^15 times
    weights <= 65521 summed over up to 2^32 words stays below 2^63.
    """
    flat = tensor.detach().contiguous().reshape(-1)
    words = flat.view(torch.uint8) if flat.element_size() == 1 else flat.view(torch.int16)
    weights = torch.arange(words.numel(), device=words.device) % CHECKSUM_MODULUS + 1
    return (words.to(torch.int64) * weights).sum()


def host_payload(data: object, dtype: torch.dtype) -> torch.Tensor:
    """What ``to_device(data, dtype=dtype)`` must deliver: the host data converted to ``dtype`` on the CPU."""
    if isinstance(data, torch.Tensor):
        return data.detach().cpu().to(dtype)
    return torch.from_numpy(np.ascontiguousarray(np.asarray(data))).to(dtype)


@dataclasses.dataclass
class TransferAudit:
    """Checksums of every audiomask transfer; install with :meth:`installed`."""

    ring: PinnedRing | None  # staging ring forced on CPU copies (None: as audiomask calls it)
    corrupt: Callable[[torch.Tensor], None] | None = None  # fault injection for the negative control
    transfers: int = 0
    bytes: int = 0
    to_host_checked: int = 0
    corrupted: int = 0
    _pending: list[tuple[int, torch.Tensor]] = dataclasses.field(default_factory=list)
    _host_pending: tuple[torch.Tensor, torch.Tensor, object] | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[TransferAudit]:
        """Route every audiomask module's ``to_device`` / ``to_host`` through the audit while the block runs."""
        real_to_device, real_to_host = audiomask.transfer.to_device, audiomask.transfer.to_host
        patched = []
        for name, module in list(sys.modules.items()):
            if not name.startswith("audiomask") or name.startswith("audiomask.transfer"):
                continue
            for attribute, wrapper in (("to_device", self._to_device), ("to_host", self._to_host)):
                if getattr(module, attribute, None) in (real_to_device, real_to_host):
                    patched.append((module, attribute, getattr(module, attribute)))
                    setattr(module, attribute, wrapper)
        self._real = real_to_device, real_to_host
        try:
            yield self
        finally:
            for module, attribute, original in patched:
                setattr(module, attribute, original)
            self.verify()

    def _to_device(self, data: object, device: object, **kwargs: object) -> torch.Tensor:
        real_to_device = self._real[0]
        if self.ring is not None and kwargs.get("ring") is None:
            kwargs["ring"] = self.ring
        result = real_to_device(data, device, **kwargs)
        if self.corrupt is not None:
            self.corrupt(result)
        expected = checksum(host_payload(data, result.dtype)).item()
        self._pending.append((expected, checksum(result)))
        self.transfers += 1
        self.bytes += result.numel() * result.element_size()
        if len(self._pending) >= VERIFY_EVERY:
            self.verify()
        return result

    def _to_host(self, tensor: torch.Tensor, **kwargs: object) -> tuple[torch.Tensor, object]:
        self._verify_host()  # the previous result: read before the driver reuses its buffer
        host, done = self._real[1](tensor, **kwargs)
        self._host_pending = (checksum(tensor), host, done)
        return host, done

    def _verify_host(self) -> None:
        if self._host_pending is None:
            return
        on_device, host, done = self._host_pending
        if done is not None:
            done.synchronize()
        self.to_host_checked += 1
        self.corrupted += int(on_device.item() != checksum(host).item())
        self._host_pending = None

    def verify(self) -> None:
        """Compare every pending device checksum with its host checksum (one sync)."""
        if self._pending:
            expected = torch.tensor([e for e, _ in self._pending], dtype=torch.int64)
            received = torch.stack([r for _, r in self._pending]).cpu()
            self.corrupted += int((expected != received).sum())
            self._pending.clear()
        self._verify_host()


def rss_bytes() -> int:
    """This process's resident set size in bytes (Linux: ``/proc/self/status``)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def memory_snapshot(chunks: int, rings: list[PinnedRing]) -> dict:
    """RSS, the rings' counters and (on CUDA) torch's pinned host-memory statistics, after ``chunks``."""
    snapshot = {"chunks": chunks, "rss_bytes": rss_bytes()}
    snapshot["rings"] = [dataclasses.asdict(ring.stats()) for ring in rings]
    snapshot["pinned_bytes"] = sum(ring.stats().pinned_bytes for ring in rings)
    if torch.cuda.is_available() and hasattr(torch.cuda, "host_memory_stats"):  # torch >= 2.6
        stats = torch.cuda.host_memory_stats()
        snapshot["cuda_host_memory"] = {k: v for k, v in stats.items() if k.endswith(".current") or "peak" in k}
        snapshot["cuda_allocated_bytes"] = torch.cuda.memory_allocated()
    return snapshot


def run_soak(
    device: str = "cpu",
    chunks: int = 100_000,
    streams: int = 16,
    seed: int = 0,
    corrupt: Callable[[torch.Tensor], None] | None = None,
) -> dict:
    """Drive at least ``chunks`` stream-chunks through a driver of ``streams`` slots; the report (JSON-ready).

    ``device``: ``"cpu"`` or a CUDA device; ``corrupt(result)`` is called on every delivered
    ``to_device`` result before its checksum (fault injection: a control that the audit counts damage).
    """
    chunks = check_int("chunks", chunks, minimum=1)
    streams = check_int("streams", streams, minimum=1)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    encoder = Phi4MMEncoder(TINY_PHI4MM).eval().to(device)  # random weights: PyTorch's initialisation
    head = CTCHead(encoder.config.hidden_size, VOCAB).eval().to(device)
    driver = StreamingDriver(open_slots(encoder, streams, chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS), head)
    target = torch.device(device)
    ring = PinnedRing() if target.type == "cpu" else None  # CPU copies take no ring: the audit stages them
    rings = [ring] if ring is not None else [default_ring(target)]
    audit = TransferAudit(ring, corrupt)
    snapshots = [memory_snapshot(0, rings)]
    active: list[tuple[DriverStream, np.ndarray, int]] = []  # stream, its samples, samples sent
    opened = finished = tokens = 0
    done_chunks = warmup_chunks = 0
    warm = None
    started = time.perf_counter()
    with audit.installed():
        while done_chunks < chunks:
            while len(active) < streams:  # a new caller in every free place
                seconds = rng.uniform(*STREAM_SECONDS)
                samples = (10.0 ** rng.uniform(-3, -0.5) * rng.standard_normal(int(seconds * SAMPLE_RATE))).astype(
                    np.float32
                )
                active.append((driver.open(f"caller-{opened}"), samples, 0))
                opened += 1
            still = []
            for stream, samples, sent in active:
                if not stream.ended:
                    piece = int(rng.uniform(*PIECE_CHUNKS) * driver.block_samples)
                    driver.feed(stream, samples[sent : sent + piece])
                    sent += piece
                    if sent >= len(samples):
                        driver.end(stream)
                still.append((stream, samples, sent))
            before = driver.stats.chunks
            driver.advance()
            done_chunks += driver.stats.chunks - before
            active = []
            for stream, samples, sent in still:
                if stream.done:
                    finished += 1
                    tokens += stream.tokens
                else:
                    active.append((stream, samples, sent))
            if warm is None and done_chunks >= WARMUP_FRACTION * chunks:
                audit.verify()
                warm = memory_snapshot(done_chunks, rings)
                warmup_chunks = done_chunks
                snapshots.append(warm)
            elif warm is not None and done_chunks >= snapshots[-1]["chunks"] + chunks / SNAPSHOTS:
                snapshots.append(memory_snapshot(done_chunks, rings))
        for stream, _, _ in active:  # end the callers still talking, so every payload is checked
            driver.end(stream)
        before = driver.stats.chunks
        driver.advance()
        done_chunks += driver.stats.chunks - before
        finished += sum(stream.done for stream, _, _ in active)
    driver.close()
    seconds = time.perf_counter() - started
    end = memory_snapshot(done_chunks, rings)
    snapshots.append(end)
    warm = warm or snapshots[0]
    ring_start, ring_end = warm["rings"][0], end["rings"][0]
    return {
        "device": str(target),
        "streams": streams,
        "chunk_ms": CHUNK_MS,
        "seed": seed,
        "chunks": done_chunks,
        "cycles": driver.stats.count,
        "streams_opened": opened,
        "streams_finished": finished,
        "tokens": tokens,
        "transfers_checked": audit.transfers,
        "bytes_checked": audit.bytes,
        "to_host_checked": audit.to_host_checked,
        "corrupted_payloads": audit.corrupted,
        "seconds": seconds,
        "chunks_per_s": done_chunks / seconds,
        "warmup_chunks": warmup_chunks,
        "rss_bytes": {"start": snapshots[0]["rss_bytes"], "after_warmup": warm["rss_bytes"], "end": end["rss_bytes"]},
        "rss_growth_after_warmup_bytes": end["rss_bytes"] - warm["rss_bytes"],
        "pinned_bytes": {"after_warmup": warm["pinned_bytes"], "end": end["pinned_bytes"]},
        "ring_grows_after_warmup": ring_end["grows"] - ring_start["grows"],
        "ring_slots": {"after_warmup": ring_start["slots"], "end": ring_end["slots"]},
        "ring_slot_waits": ring_end["slot_waits"],
        "stats_cycles_kept": len(driver.stats.cycles),  # RunStats keeps the last RECENT_CYCLES timings
        "snapshots": snapshots,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``argv`` without the program name; default ``sys.argv[1:]``); 1 if a payload was corrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--chunks", type=int, default=100_000, help="stream-chunks to run (default 100000)")
    parser.add_argument("--streams", type=int, default=16, help="driver slots, all kept busy (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a tiny model)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine")
    torch.set_num_threads(args.threads)
    report = run_soak(args.device, args.chunks, args.streams, args.seed)
    summary = {k: v for k, v in report.items() if k != "snapshots"}
    print("\n".join(f"{key}: {value}" for key, value in summary.items()))
    if args.out is not None:
        write_result(args.out, {**capture_environment(sys.argv), **report})  # the process's command line
    return 1 if report["corrupted_payloads"] else 0
