"""The streaming driver on CUDA: outputs equal offline, CUDA graphs equal eager, no hidden stalls.

Skipped without CUDA. TF32 is off (float32 must mean float32 to hold 1e-4).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from audiomask.asr.decoding import greedy_decode
from audiomask.asr.driver import StreamingDriver
from audiomask.streaming import Phi4MMSlots
from audiomask.transfer import default_ring, sync_check

pytestmark = pytest.mark.gpu

TOLERANCE = 1e-4  # float32, TF32 off

WARMUP_CYCLES = 8  # cycles after which no pinned allocation may happen
STEADY_CYCLES = 200


@pytest.fixture(autouse=True)
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def models(encoder, head):
    """The tiny encoder and head on the CPU (offline references) and their twins on CUDA."""
    return encoder, head, copy.deepcopy(encoder).to("cuda"), copy.deepcopy(head).to("cuda")


def cuda_driver(encoder, head, batch_size: int, chunk_size: int, left_chunk: int, cuda_graph: bool, **options):
    """A driver over Phi-4MM slots on CUDA, its chunk step eager or as CUDA graphs."""
    slots = Phi4MMSlots(encoder, batch_size, chunk_size, left_chunk, cuda_graph=cuda_graph)
    return StreamingDriver(slots, head, **options)


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
def test_cuda_driver_equals_offline(models, chunking, random_signals, offline_outputs, joined_outputs, cuda_graph):
    """Single and batched streams (more streams than slots, random starts) on CUDA equal the CPU offline forward."""
    cpu_encoder, cpu_head, encoder, head = models
    chunk_size, left_chunk = chunking
    batch = random_signals(20 + chunk_size, 7)
    starts = np.random.default_rng(chunk_size).integers(0, 5, len(batch)).tolist()
    for slots in (1, 3):
        driver = cuda_driver(encoder, head, slots, chunk_size, left_chunk, cuda_graph, keep_outputs=True)
        streams = driver.run(batch if slots > 1 else batch[:2], starts if slots > 1 else None)
        driver.close()
        for samples, stream in zip(batch, streams):
            reference = offline_outputs(cpu_encoder, samples, chunk_size, left_chunk)
            outputs = joined_outputs(stream)
            assert outputs.shape == reference.shape, stream.name
            assert (outputs - reference).abs().max().item() <= TOLERANCE, stream.name
            with torch.no_grad():
                assert stream.ids == greedy_decode(cpu_head(reference)[None])[0], stream.name


def test_cuda_graph_equals_eager_in_a_batch_of_64(models, random_signals, joined_outputs):
    """Batch independence on CUDA, graph vs eager: a stream alone equals itself among 63 others."""
    _, _, encoder, head = models
    target = random_signals(99, 1, 12000, 12001)[0]
    others = random_signals(5, 63, 400, 20000)
    starts = [*np.random.default_rng(5).integers(0, 4, len(others)).tolist(), 2]
    results = {}
    for cuda_graph in (False, True):
        alone = cuda_driver(encoder, head, 1, 2, 1, cuda_graph, keep_outputs=True)
        (single,) = alone.run([target])
        alone.close()
        crowd = cuda_driver(encoder, head, 64, 2, 1, cuda_graph, keep_outputs=True)
        streams = crowd.run([*others, target], starts)
        crowd.close()
        assert streams[-1].tokens == single.tokens
        assert (joined_outputs(streams[-1]) - joined_outputs(single)).abs().max().item() <= 1e-5
        assert streams[-1].ids == single.ids
        results[cuda_graph] = streams
    for eager, graph in zip(results[False], results[True]):
        assert (joined_outputs(eager) - joined_outputs(graph)).abs().max().item() <= 1e-5, eager.name


@pytest.mark.parametrize(
    "frontend", [{}, {"frontend_process": True, "frontend_workers": 2}], ids=["thread", "processes"]
)
def test_lanes_of_cuda_graphs_equal_one_batch_of_all_the_slots(models, random_signals, joined_outputs, frontend):
    """Three lanes, each replaying its own CUDA graphs, give every stream what one batch of 8 graph-replaying slots gives."""
    _, _, encoder, head = models
    batch = random_signals(21, 14, 400, 30000)
    starts = np.random.default_rng(21).integers(0, 6, len(batch)).tolist()
    results = []
    for sizes in ([8], [3, 3, 2]):
        lanes = [Phi4MMSlots(encoder, size, 2, 1, cuda_graph=True) for size in sizes]
        driver = StreamingDriver(lanes, head, keep_outputs=True, **frontend)
        try:
            results.append(driver.run(batch, starts))
        finally:
            driver.close()
    for alone, in_lane in zip(*results):
        assert in_lane.tokens == alone.tokens and in_lane.ids == alone.ids, alone.name
        assert (joined_outputs(in_lane) - joined_outputs(alone)).abs().max().item() <= 1e-5, alone.name
    # The lanes, stepped one at a time on the driver's stream, captured their graphs into one memory pool.
    pools = {graph.pool() for lane in lanes for graph, _ in lane._graphs}
    assert len(pools) == 1 and len(lanes[0]._graphs) == 2  # two ring phases (left_chunk 1)
    assert lanes[0].use_graph_pool(torch.cuda.graph_pool_handle()) is False  # captured: it keeps its pool


def host_allocations() -> int:
    """cudaHostAlloc calls so far (torch's pinned-memory cache misses)."""
    stats = torch.cuda.host_memory_stats()
    for key in ("num_host_alloc", "host_alloc_time.count"):
        if key in stats:
            return int(stats[key])
    raise AssertionError(f"torch.cuda.host_memory_stats() has no allocation counter: {sorted(stats)}")


@pytest.mark.parametrize(
    ("cuda_graph", "frontend"),
    [(False, {}), (True, {}), (True, {"frontend_process": True, "frontend_workers": 2})],
    ids=["eager", "graph", "graph-processes"],
)
def test_steady_state_has_no_unsafe_copy_and_no_pinned_allocation(models, cuda_graph, frontend):
    """In the steady state sync_check("error") is silent, and no pinned memory is allocated per chunk (the
    processes' feature batches page-locked in place once)."""
    _, _, encoder, head = models
    driver = cuda_driver(encoder, head, 8, 2, 2, cuda_graph, **frontend)
    assert (driver._features_region is not None and driver._features_region.pinned) == bool(frontend)
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
    assert driver._features_region is None  # unregistered at close


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_copied_from_the_processes_memory_equal_chunks_staged_from_it(
    models, random_signals, joined_outputs, dtype
):
    """The processes' batch crosses straight from its page-locked memory (cast on the device for bfloat16),
    or, unregistered, through the staging ring: the same chunks, so the same outputs, bit for bit."""
    _, _, encoder, head = models
    encoder, head = copy.deepcopy(encoder).to(dtype), copy.deepcopy(head).to(dtype)
    batch = random_signals(33, 10, 400, 30000)
    starts = np.random.default_rng(33).integers(0, 4, len(batch)).tolist()
    results = []
    for registered in (True, False):
        driver = cuda_driver(
            encoder, head, 6, 2, 2, False, keep_outputs=True, frontend_process=True, frontend_workers=2
        )
        if not registered:
            driver._features_region.close()  # pageable again: every chunk staged
        try:
            results.append(driver.run(batch, starts))
        finally:
            driver.close()
    for copied, staged in zip(*results):
        assert copied.ids == staged.ids, staged.name
        assert torch.equal(joined_outputs(copied), joined_outputs(staged)), staged.name


def encoder_device(encoder) -> torch.device:
    return next(encoder.parameters()).device
