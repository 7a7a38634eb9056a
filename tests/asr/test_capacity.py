"""audiomask.asr.capacity and the recognizer's sizes: one ChunkPlan, no slots opened only to size memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.constants import SAMPLE_RATE
from audiomask.streaming import Phi4MMSlots, Qwen3ASRSlots, chunk_plan

MS_PER_S = 1000


@pytest.fixture
def opened(monkeypatch):
    """The batch size of all slots of either family constructed while the test runs, in order."""
    sizes: list[int] = []
    for family in (Phi4MMSlots, Qwen3ASRSlots):
        construct = family.__init__

        def counting(self, encoder, batch_size=1, *args, _construct=construct, **kwargs):
            sizes.append(batch_size)
            _construct(self, encoder, batch_size, *args, **kwargs)

        monkeypatch.setattr(family, "__init__", counting)
    return sizes


@pytest.mark.parametrize(("max_streams", "lanes", "sizes"), [(4, 1, [4]), (5, 2, [2, 3]), (3, 3, [1, 1, 1])])
def test_a_recognizer_opens_its_lanes_slots_and_no_other(model, opened, max_streams, lanes, sizes):
    with StreamingRecognizer(model, chunk_ms=160, left_chunks=2, max_streams=max_streams, lanes=lanes, overlap=False):
        assert opened == sizes


@pytest.mark.parametrize("family", ["phi4mm", "qwen3_asr"])
def test_the_recognizers_sizes_are_its_plans(tiny_asr_model, family):
    model = tiny_asr_model(family=family)
    chunk_ms, left_chunks = (240, 3) if family == "phi4mm" else (None, None)
    with StreamingRecognizer(model, chunk_ms=chunk_ms, left_chunks=left_chunks, overlap=False) as recognizer:
        plan = recognizer.plan
        assert plan == chunk_plan(model.encoder, chunk_ms, left_chunks, frontend=model.frontend)
        assert (recognizer.chunk_ms, recognizer.left_chunks) == (plan.chunk_ms, plan.left_chunks)
        assert (recognizer.first_block_samples, recognizer.block_samples) == (
            plan.first_block_samples,
            plan.block_samples,
        )
        assert recognizer.block_samples == plan.chunk_ms * SAMPLE_RATE // MS_PER_S  # one chunk of 16 kHz samples
    assert "samples" in StreamingRecognizer.block_samples.__doc__  # a documented property, with its unit


SHARE_PROBE = """
import sys, torch
from audiomask.asr.capacity import free_bytes
device = torch.device("cuda")
whole = free_bytes(device)
torch.cuda.set_per_process_memory_fraction(float(sys.argv[1]), torch.cuda.current_device())
print(whole, free_bytes(device), torch.cuda.mem_get_info(device)[1])
"""


@pytest.mark.gpu
def test_free_bytes_on_cuda_keep_within_the_processs_share_of_the_device():
    """A replica given half a GPU (``audiomask serve --replicas`` sharing one) sizes its slots against its half."""
    share = 0.5
    # The fraction is the process's for its lifetime: set it in a process of its own.
    command = [sys.executable, "-c", SHARE_PROBE, str(share)]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    whole, shared, total = map(int, result.stdout.split())
    assert shared <= share * total < whole
    assert shared > 0.9 * share * total  # little of its half is taken before any slot
