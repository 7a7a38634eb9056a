"""The streaming driver on CUDA (issue 5): outputs equal offline, CUDA graphs equal eager, no hidden stalls.

Skipped without CUDA. TF32 is off (float32 must mean float32 to hold 1e-4).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from encoder_models import tiny_phi4mm
from test_stream import CHUNKINGS, TOLERANCE, VOCAB, joined, offline, signals

from audiomask.asr.decoding import greedy_decode
from audiomask.asr.driver import StreamingDriver
from audiomask.models.ctc import CTCHead
from audiomask.transfer import default_ring, sync_check

pytestmark = pytest.mark.gpu

WARMUP_CYCLES = 8  # cycles after which no pinned allocation may happen
STEADY_CYCLES = 200


@pytest.fixture(autouse=True)
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def models():
    """The tiny encoder on CUDA and its CPU twin (offline references are computed on the CPU)."""
    torch.manual_seed(0)
    head = CTCHead(16, VOCAB).eval()
    return tiny_phi4mm(), head, tiny_phi4mm().to("cuda"), copy.deepcopy(head).to("cuda")


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize(("chunk_size", "left_chunk"), CHUNKINGS)
def test_cuda_driver_equals_offline(models, cuda_graph, chunk_size, left_chunk):
    """Single and batched streams (more streams than slots, random starts) on CUDA equal the CPU offline forward."""
    cpu_encoder, cpu_head, encoder, head = models
    batch = signals(20 + chunk_size, 7)
    starts = np.random.default_rng(chunk_size).integers(0, 5, len(batch)).tolist()
    for slots in (1, 3):
        driver = StreamingDriver(
            encoder,
            head,
            batch_size=slots,
            chunk_size=chunk_size,
            left_chunk=left_chunk,
            keep_outputs=True,
            cuda_graph=cuda_graph,
        )
        streams = driver.run(batch if slots > 1 else batch[:2], starts if slots > 1 else None)
        driver.close()
        for samples, stream in zip(batch, streams):
            reference = offline(cpu_encoder, samples, chunk_size, left_chunk)
            outputs = joined(stream)
            assert outputs.shape == reference.shape, stream.name
            assert (outputs - reference).abs().max().item() <= TOLERANCE, stream.name
            with torch.no_grad():
                assert stream.ids == greedy_decode(cpu_head(reference)[None])[0], stream.name


def test_cuda_graph_equals_eager_in_a_batch_of_64(models):
    """Batch independence on CUDA, graph vs eager: a stream alone equals itself among 63 others."""
    _, _, encoder, head = models
    target = signals(99, 1, 12000, 12001)[0]
    others = signals(5, 63, 400, 20000)
    starts = [*np.random.default_rng(5).integers(0, 4, len(others)).tolist(), 2]
    results = {}
    for cuda_graph in (False, True):
        alone = StreamingDriver(encoder, head, chunk_size=2, left_chunk=1, keep_outputs=True, cuda_graph=cuda_graph)
        (single,) = alone.run([target])
        alone.close()
        crowd = StreamingDriver(
            encoder, head, batch_size=64, chunk_size=2, left_chunk=1, keep_outputs=True, cuda_graph=cuda_graph
        )
        streams = crowd.run([*others, target], starts)
        crowd.close()
        assert streams[-1].tokens == single.tokens
        assert (joined(streams[-1]) - joined(single)).abs().max().item() <= 1e-5
        assert streams[-1].ids == single.ids
        results[cuda_graph] = streams
    for eager, graph in zip(results[False], results[True]):
        assert (joined(eager) - joined(graph)).abs().max().item() <= 1e-5, eager.name


def host_allocations() -> int:
    """cudaHostAlloc calls so far (torch's pinned-memory cache misses)."""
    stats = torch.cuda.host_memory_stats()
    for key in ("num_host_alloc", "host_alloc_time.count"):
        if key in stats:
            return int(stats[key])
    raise AssertionError(f"torch.cuda.host_memory_stats() has no allocation counter: {sorted(stats)}")


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
def test_steady_state_has_no_unsafe_copy_and_no_pinned_allocation(models, cuda_graph):
    """Issue 5 acceptance 3: sync_check("error") is silent, and no pinned memory is allocated per chunk."""
    _, _, encoder, head = models
    driver = StreamingDriver(encoder, head, batch_size=8, chunk_size=2, left_chunk=2, cuda_graph=cuda_graph)
    rng = np.random.default_rng(3)
    streams = [driver.open(f"s{i}") for i in range(8)]
    piece = driver.block_samples

    def feed_cycles(count: int) -> None:
        for _ in range(count):
            for stream in streams:
                driver.feed(
                    stream,
                    (0.1 * rng.standard_normal(piece if stream._fed else driver.first_block_samples)).astype(
                        np.float32
                    ),
                )
            driver.advance()

    feed_cycles(WARMUP_CYCLES)
    torch.cuda.synchronize()
    allocations, grows = host_allocations(), default_ring(encoder_device(encoder)).stats().grows
    cycles = driver.stats.count
    with sync_check("error") as check:
        feed_cycles(STEADY_CYCLES)
    torch.cuda.synchronize()
    assert driver.stats.count - cycles >= STEADY_CYCLES
    assert not check.flagged
    assert host_allocations() == allocations, "pinned memory was allocated in the steady state"
    assert default_ring(encoder_device(encoder)).stats().grows == grows
    for stream in streams:
        driver.end(stream)
    driver.advance()
    driver.close()
    assert all(s.done for s in streams)


def encoder_device(encoder) -> torch.device:
    return next(encoder.parameters()).device
