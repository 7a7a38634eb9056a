"""audiomask.streaming's ChunkPlan: a configuration's sizes, made once by its family's slots class.

The state bytes are arithmetic on the config; these tests hold them to what real slots allocate.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from audiomask.asr.outputs import TokenClock
from audiomask.features import Phi4MMFrontend
from audiomask.streaming import ChunkPlan, Phi4MMSlots, Qwen3ASRSlots, chunk_plan, open_slots
from audiomask.streaming.plan import MAX_CHUNK_MS, MAX_CONTEXT_MS


def allocated_bytes(slots: object) -> int:
    """Bytes of the distinct tensor storages ``slots`` holds (its attributes, their lists and objects)."""
    seen: set[int] = set()
    total = 0
    pending = [(slots, 3)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(value, (list, tuple)) and depth:
            pending += [(item, depth - 1) for item in value]
        elif hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type)) and depth:
            pending += [(item, depth - 1) for item in vars(value).values()]
    return total


@pytest.mark.parametrize(
    ("options", "dtype"),
    [
        ({"chunk_ms": 160, "left_chunks": 1}, torch.float32),
        ({"chunk_ms": 80, "left_chunks": 0}, torch.float32),
        ({"chunk_ms": 320, "left_chunks": 3}, torch.bfloat16),
        ({"chunk_ms": 240, "left_chunks": 5}, torch.float16),
    ],
)
def test_phi4mm_state_bytes_equal_what_its_slots_allocate(tiny_phi4mm, options, dtype):
    encoder = tiny_phi4mm().to(dtype)
    plan = chunk_plan(encoder, **options)
    for slots in (1, 2, 5):
        assert allocated_bytes(open_slots(encoder, slots, plan=plan)) == plan.state_bytes(slots)
    assert plan.slot_bytes > 0 and plan.shared_bytes > 0  # key/value, conv caches; the position bias


@pytest.mark.gpu
def test_phi4mm_state_bytes_with_cuda_graphs_equal_what_its_slots_allocate(tiny_phi4mm):
    encoder = tiny_phi4mm().cuda()
    plan = chunk_plan(encoder, 160, 2)  # CUDA graphs by default on CUDA: their static inputs count too
    assert plan.cuda_graph and plan.slot_bytes > chunk_plan(encoder, 160, 2, cuda_graph=False).slot_bytes
    for slots in (1, 3):
        assert allocated_bytes(open_slots(encoder, slots, plan=plan)) == plan.state_bytes(slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen3_asr_state_bytes_equal_what_its_slots_allocate(tiny_qwen3_asr, dtype):
    encoder = tiny_qwen3_asr().to(dtype)
    plan = chunk_plan(encoder)
    for slots in (1, 3):
        assert allocated_bytes(open_slots(encoder, slots, plan=plan)) == plan.state_bytes(slots)
    assert plan.shared_bytes == 0


def test_phi4mm_sizes_from_milliseconds(tiny_phi4mm):
    plan = chunk_plan(tiny_phi4mm(), 160, 2)  # tokens of 8 frames: 80 ms
    assert dataclasses.astuple(plan) == dataclasses.astuple(
        ChunkPlan(
            family="Phi4MMSlots",
            chunk_ms=160,
            chunk_frames=16,
            tokens_per_chunk=2,
            chunk_tokens=2,
            left_chunks=2,
            left_tokens=4,
            first_block_samples=160 * 15 + 400,
            block_samples=16 * 160,
            cuda_graph=False,
            slot_bytes=plan.slot_bytes,
            shared_bytes=plan.shared_bytes,
        )
    )
    assert plan.token_ms == 80
    config_default = chunk_plan(tiny_phi4mm(chunk_size=4, left_chunk=3))
    assert (config_default.chunk_ms, config_default.left_chunks) == (320, 3)


def test_qwen3_asr_sizes(tiny_qwen3_asr):
    plan = chunk_plan(tiny_qwen3_asr())
    assert (plan.family, plan.chunk_ms, plan.chunk_frames, plan.tokens_per_chunk, plan.chunk_tokens) == (
        "Qwen3ASRSlots",
        1000,
        100,
        104,
        13,
    )
    assert (plan.left_chunks, plan.left_tokens, plan.token_ms, plan.cuda_graph) == (None, None, 80, False)
    assert (plan.first_block_samples, plan.block_samples) == (99 * 160 + 400 - 200, 100 * 160)
    assert chunk_plan(tiny_qwen3_asr(), 1000) == plan


def test_the_front_end_sets_the_block_samples(tiny_qwen3_asr):
    plan = chunk_plan(tiny_qwen3_asr(), frontend=Phi4MMFrontend())  # framing without centring
    assert (plan.first_block_samples, plan.block_samples) == (99 * 160 + 400, 100 * 160)


def test_slots_hold_the_plan_of_their_sizes(tiny_phi4mm, tiny_qwen3_asr):
    encoder = tiny_phi4mm()
    direct = Phi4MMSlots(encoder, 2, chunk_size=3, left_chunk=1)
    assert direct.plan == chunk_plan(encoder, 240, 1)
    assert (direct.chunk_frames, direct.tokens_per_chunk, direct.left_chunk) == (24, 3, 1)
    plan = chunk_plan(encoder, 160, 4)
    slots = open_slots(encoder, 3, plan=plan)
    assert slots.plan is plan and (slots.chunk_frames, slots.tokens_per_chunk, slots.left_chunk) == (16, 2, 4)
    qwen = Qwen3ASRSlots(tiny_qwen3_asr())
    assert qwen.plan == chunk_plan(tiny_qwen3_asr()) and qwen.tokens_per_chunk == qwen.plan.tokens_per_chunk


def test_the_token_clock_is_the_plans(tiny_phi4mm, tiny_qwen3_asr):
    qwen = TokenClock(open_slots(tiny_qwen3_asr()))  # 13 tokens per 1 s conv chunk, 80 ms apart
    assert qwen.times_ms(12, 3).tolist() == [960.0, 1000.0, 1080.0]
    phi = TokenClock(open_slots(tiny_phi4mm(), chunk_ms=240))
    assert phi.times_ms(2, 2).tolist() == [160.0, 240.0]


@pytest.mark.parametrize(
    ("family", "options", "message"),
    [
        ("phi4mm", {"chunk_ms": 0}, r"^chunk_ms must be >= 1, got 0"),
        ("phi4mm", {"chunk_ms": 2.5}, r"^chunk_ms must be an integer, got 2.5"),
        ("phi4mm", {"chunk_ms": True}, r"^chunk_ms must be an integer, got True"),
        ("phi4mm", {"chunk_ms": 100}, r"^chunk_ms must be a multiple of 80 \(one encoder token\), got 100"),
        ("phi4mm", {"chunk_ms": 80_000_000}, rf"^chunk_ms must be <= {MAX_CHUNK_MS}, got 80000000"),
        ("phi4mm", {}, r"^chunk_ms must be given: the encoder config's chunk_size \(-1\) means full attention"),
        ("phi4mm", {"chunk_ms": 80, "left_chunks": -1}, r"^left_chunks must be >= 0, got -1"),
        ("phi4mm", {"chunk_ms": 80, "left_chunks": "2"}, r"^left_chunks must be an integer, got '2'"),
        (
            "phi4mm",
            {"chunk_ms": 160, "left_chunks": 10**5},
            rf"^left_chunks=100000 with chunk_ms=160: .* 16000160 ms of audio, more than MAX_CONTEXT_MS = "
            rf"{MAX_CONTEXT_MS}",
        ),
        ("phi4mm", {"chunk_ms": 80, "cuda_graph": True}, r"^cuda_graph needs the encoder on a CUDA device, got cpu"),
        ("qwen3_asr", {"chunk_ms": 500}, r"^chunk_ms must be 1000 \(Qwen3-ASR's conv chunk\) or None, got 500"),
        ("qwen3_asr", {"left_chunks": 2}, r"^left_chunks must be None for Qwen3-ASR"),
        ("qwen3_asr", {"cuda_graph": True}, r"^cuda_graph must be False or None for Qwen3-ASR"),
        ("other", {}, r"^encoder must be a Phi4MMEncoder or Qwen3ASREncoder, got Linear"),
    ],
)
def test_bad_settings_are_refused_naming_the_argument(tiny_phi4mm, tiny_qwen3_asr, family, options, message):
    encoder = {"phi4mm": tiny_phi4mm, "qwen3_asr": tiny_qwen3_asr}.get(family, lambda: torch.nn.Linear(2, 2))()
    if torch.cuda.is_available() and "cuda_graph" in options and family == "phi4mm":
        pytest.skip("checks the error without CUDA")
    with pytest.raises(ValueError, match=message):
        chunk_plan(encoder, **options)


def test_a_plan_opens_only_its_familys_slots(tiny_phi4mm, tiny_qwen3_asr):
    plan = chunk_plan(tiny_qwen3_asr())
    with pytest.raises(ValueError, match=r"^plan must be a ChunkPlan of a Phi4MMSlots, got one of a Qwen3ASRSlots"):
        open_slots(tiny_phi4mm(), plan=plan)
    with pytest.raises(ValueError, match=r"^chunk_ms, left_chunks and cuda_graph must be None with a plan"):
        open_slots(tiny_qwen3_asr(), plan=plan, chunk_ms=1000)
    with pytest.raises(ValueError, match=r"^plan must be a ChunkPlan of a Qwen3ASRSlots, got dict"):
        Qwen3ASRSlots(tiny_qwen3_asr(), plan={})


def test_sizes_beyond_any_memory_are_arithmetic(tiny_phi4mm):
    huge = chunk_plan(tiny_phi4mm(), 60_000, 9)  # ten minutes of context, the most there is: sized, not allocated
    layers, heads_dim, ring = 2, 16, 9 * 750  # the key/value ring holds the left context's tokens
    assert huge.slot_bytes > layers * 2 * ring * heads_dim * 4
    assert huge.state_bytes(10**6) > 2**40
