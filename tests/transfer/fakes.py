"""Stand-ins shared by the transfer tests (imported as ``tests.transfer.fakes``).

:class:`FakeEvent` is a ``torch.cuda.Event`` that stays pending until the test
(or its ``synchronize``) completes it; :func:`small_ring` and
:func:`stage_pointer` make and use a small :class:`~audiomask.transfer.PinnedRing`;
:class:`FakeCuda` replaces ``torch.cuda``'s streams and events with
:class:`FakeStream` and :class:`FakeCudaEvent`, which log what a submit does,
while :data:`META` (the ``meta`` device) plays the GPU.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from audiomask.transfer import KiB, PinnedRing

META = torch.device("meta")  # plays the GPU: copies to it are host->device and move no data


class FakeEvent:
    """Stands in for torch.cuda.Event: pending until completed by the test or by synchronize()."""

    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def small_ring(
    num_slots: int = 2, slot_bytes: int = KiB, max_slots: int | None = None, consumer_copy_bytes: int = 0
) -> PinnedRing:
    """A ring of ``num_slots`` slots of ``slot_bytes``; by default every copy may take the copy stream."""
    return PinnedRing(
        slot_bytes=slot_bytes,
        num_slots=num_slots,
        max_pinned_bytes=slot_bytes * (max_slots or num_slots),
        consumer_copy_bytes=consumer_copy_bytes,
    )


def stage_pointer(ring: PinnedRing, event: FakeEvent | None = None, nbytes: int = 16) -> int:
    """Stage nbytes, note the slot's address, release the slot guarded by event."""
    staged = ring.stage(nbytes, np.uint8)
    pointer = staged.array.ctypes.data
    staged.release(event)
    return pointer


class FakeStream:
    """Stands in for torch.cuda.Stream: logs the waits queued on it; ``idle`` says whether its work has run."""

    made = 0  # streams made so far: each gets an id of its own, as torch's do

    def __init__(self, name: str, log: list[str], idle: bool = False) -> None:
        self.name = name
        self.log = log
        self.idle = idle  # whether all work queued on it has run
        FakeStream.made += 1
        self.stream_id, self.device_index, self.device_type = FakeStream.made, -1, 0

    def query(self) -> bool:
        return self.idle

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")

    def wait_event(self, event: FakeCudaEvent) -> None:
        self.log.append(f"{self.name} waits for {event.name}")


class FakeCudaEvent(FakeEvent):
    """A :class:`FakeEvent` that logs its records, queries and waits under its ``name``."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__()
        self.name = name
        self.log = log

    def record(self, stream: FakeStream) -> None:
        assert not self.waited or self.done, f"{self.name} re-recorded before its last record completed"
        self.done = False
        self.log.append(f"{self.name} recorded on {stream.name}")

    def query(self) -> bool:
        self.log.append(f"{self.name} queried")
        return super().query()

    def wait(self, stream: FakeStream) -> None:
        self.log.append(f"{stream.name} waits for {self.name}")


class FakeCuda:
    """torch.cuda's streams and events as stand-ins that log what the submit does; ``meta`` plays the GPU."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[str] = []
        self.events: list[FakeCudaEvent] = []
        self.consumer = self.current = FakeStream("consumer", self.log)
        real_empty, real_copy, real_to = torch.empty, torch.Tensor.copy_, torch.Tensor.to

        def empty(*args, **kwargs):
            if kwargs.get("device") is not None:
                self.log.append(f"allocate on {self.current.name}")
            return real_empty(*args, **kwargs)

        def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
            if dst.device.type == "meta":
                self.log.append(f"copy on {self.current.name}{' non_blocking' if non_blocking else ''}")
            return real_copy(dst, src, non_blocking)

        def to(src: torch.Tensor, *args, **kwargs) -> torch.Tensor:  # a host->meta .to(): allocation and copy
            result = real_to(src, *args, **kwargs)
            if result.device.type == "meta" and src.device.type != "meta":
                self.log.append(f"allocate on {self.current.name}")
                self.log.append(f"copy on {self.current.name}{' non_blocking' if kwargs.get('non_blocking') else ''}")
            return result

        monkeypatch.setattr(torch, "empty", empty)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, stream: self.log.append(f"used on {stream.name}"))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream("copy", self.log))
        monkeypatch.setattr(torch.cuda, "stream", self.stream)
        monkeypatch.setattr(torch.cuda, "set_stream", self.set_stream)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: META.index)  # the meta "GPU" is current
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: self.log.append(f"set device {device}"))
        monkeypatch.setattr(torch.cuda, "Event", self.event)

    @contextlib.contextmanager
    def stream(self, stream: FakeStream):
        previous, self.current = self.current, stream
        self.log.append(f"enter {stream.name}")
        try:
            yield
        finally:
            self.current = previous
            self.log.append(f"exit {stream.name}")

    def set_stream(self, stream: FakeStream) -> None:
        self.current = stream
        self.log.append(f"current stream {stream.name}")

    def event(self) -> FakeCudaEvent:
        self.events.append(FakeCudaEvent(f"event {len(self.events)}", self.log))
        return self.events[-1]
