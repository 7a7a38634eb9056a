"""The soak in CI: a few thousand chunks of streams coming and going, every transfer checksummed.

``scripts/soak.py`` (:mod:`bench.soak`) runs the same loop for
100,000 chunks and records RSS and pinned bytes; here the short run must end
with no corrupted payload, every stream finished and no ring growth after
warm-up, and a payload corrupted on purpose must be counted.
"""

from __future__ import annotations

import pytest
import torch

from bench.soak import checksum, run_soak

CHUNKS = 2000
STREAMS = 8


def test_a_short_soak_delivers_every_payload_intact():
    report = run_soak("cpu", chunks=CHUNKS, streams=STREAMS, seed=1)
    assert report["chunks"] >= CHUNKS
    assert report["corrupted_payloads"] == 0
    assert report["transfers_checked"] >= report["cycles"]  # at least the feature batch of every cycle
    assert report["streams_finished"] == report["streams_opened"] > STREAMS  # slots were freed and reused
    assert report["ring_grows_after_warmup"] == 0
    assert report["pinned_bytes"]["end"] == report["pinned_bytes"]["after_warmup"]


def test_the_audit_counts_a_corrupted_payload():
    """Negative control: one bit flipped in every 40th delivered payload is seen as a corrupted payload."""
    flipped = []

    def corrupt(result: torch.Tensor) -> None:
        flipped.append(False)
        if len(flipped) % 40 == 0 and result.numel():
            result.reshape(-1).view(torch.uint8)[0] ^= 1
            flipped[-1] = True

    report = run_soak("cpu", chunks=300, streams=4, seed=2, corrupt=corrupt)
    assert sum(flipped) > 0
    assert report["corrupted_payloads"] == sum(flipped)


@pytest.mark.gpu
def test_a_short_soak_on_cuda_delivers_every_payload_intact():
    report = run_soak("cuda", chunks=CHUNKS, streams=STREAMS, seed=1)
    assert report["corrupted_payloads"] == 0 and report["chunks"] >= CHUNKS
    assert report["to_host_checked"] >= report["cycles"] - 1  # every result copy back, the last one at exit
    assert report["ring_grows_after_warmup"] == 0


def test_the_checksum_sees_a_moved_word():
    """Swapping two different 16-bit words keeps their sum but not the position-weighted one."""
    words = torch.tensor([1, 2, 3, 4], dtype=torch.int16)
    swapped = torch.tensor([2, 1, 3, 4], dtype=torch.int16)
    assert checksum(words).item() == 1 * 1 + 2 * 2 + 3 * 3 + 4 * 4
    assert checksum(words).item() != checksum(swapped).item()


@pytest.mark.parametrize(
    "arguments, message", [({"chunks": 0}, "chunks must be >= 1, got 0"), ({"streams": 0}, "streams must be >= 1")]
)
def test_run_soak_rejects_bad_sizes(arguments: dict, message: str):
    with pytest.raises(ValueError, match=message):
        run_soak("cpu", **{"chunks": 10, "streams": 2, **arguments})
