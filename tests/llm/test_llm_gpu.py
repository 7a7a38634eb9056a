"""The LLM recogniser on a CUDA device: the same tokens as on the CPU (float32), streams independent of each other."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from audiomask.llm import checkpoint
from audiomask.llm.streaming import LLMStreams, StreamPolicy
from tests.llm.streams import stream_tokens

pytestmark = pytest.mark.gpu


def test_offline_tokens_on_cuda_equal_the_cpu_in_float32(tiny_qwen3_asr_dir: Path, speech: Callable) -> None:
    signals = [speech(seconds, seed) for seed, seconds in enumerate((0.6, 4.2, 17.0))]
    cpu = checkpoint.load(tiny_qwen3_asr_dir).transcribe(signals, max_new_tokens=16)
    cuda = checkpoint.load(tiny_qwen3_asr_dir, device="cuda").transcribe(signals, max_new_tokens=16)
    assert [t.tokens for t in cuda] == [t.tokens for t in cpu]


def test_cuda_streams_beside_others_equal_themselves_alone(tiny_qwen3_asr_dir: Path, speech: Callable) -> None:
    model = checkpoint.load(tiny_qwen3_asr_dir, device="cuda")
    policy = StreamPolicy(chunk_s=1.0, update_tokens=8, final_tokens=24)
    signals = {name: speech(seconds, seed) for seed, (name, seconds) in enumerate((("a", 9.0), ("b", 3.0)))}

    def run(names: list[str]) -> dict[str, list[tuple[int, ...]]]:
        return stream_tokens(LLMStreams(model, slots=2, policy=policy), {name: signals[name] for name in names})

    together = run(["a", "b"])
    assert together == {**run(["a"]), **run(["b"])}


def test_bfloat16_streams_run_and_hold_their_slots(tiny_qwen3_asr_dir: Path, speech: Callable) -> None:
    model = checkpoint.load(tiny_qwen3_asr_dir, device="cuda", dtype=torch.bfloat16)
    streams = LLMStreams(model, slots=3, policy=StreamPolicy(chunk_s=2.0, fixed_tokens=13, segment_windows=1))
    for name in "xyz":
        streams.open(name)
        streams.feed(name, speech(20.0, ord(name)))
    while streams.due():
        partials = streams.update()
        assert all(len(partial.tokens) == 13 for partial in partials)
        assert streams.cache.lengths.max() <= streams.capacity
    finals = streams.finish(list("xyz"))
    assert [final.final for final in finals] == [True] * 3


def _greedy_three_rows(lm, slots: int, rows: list[int], warm: bool) -> tuple[list, list]:
    """Three rows of random prompts (5, 130, 17 inputs) decoded greedily in ``rows`` of a ``slots``-slot cache:
    eagerly, then through CUDA graphs (with ``warm``, 70 slots warmed first, outside inference mode as the
    server's recogniser warms them)."""
    from audiomask.llm.generate import greedy
    from audiomask.llm.graphs import GraphedDecode

    torch.manual_seed(3)
    inputs = [lm.embed(torch.randint(0, lm.config.vocab_size, (length,))) for length in (5, 130, 17)]
    answers = []
    for graphed in (False, True):
        cache = lm.new_cache(slots, 256)
        steps = GraphedDecode(lm, cache) if graphed else None
        if graphed and warm:
            assert steps.warm() == 8  # the callers' 70 slots: row buckets 1, 2, 4, ..., 64 and 128
            assert not cache.lengths.any()
            assert steps.warm() == 0  # every bucket already captured
            assert all(capture.logits.grad_fn is None for capture in steps._captures.values())  # no autograd record
        with torch.inference_mode():
            answers.append(greedy(lm, cache, rows, inputs, [20, 40, 9], frozenset(), stop=False, steps=steps))
    return answers[0], answers[1]


def test_greedy_through_cuda_graphs_equals_eager_steps(tiny_qwen3_asr_dir: Path) -> None:
    lm = checkpoint.load(tiny_qwen3_asr_dir, device="cuda").lm
    eager, graphed = _greedy_three_rows(lm, 4, [3, 0, 2], warm=False)
    assert eager == graphed


def test_warmed_graphs_cover_every_bucket_and_leave_the_cache_empty(tiny_qwen3_asr_dir: Path) -> None:
    lm = checkpoint.load(tiny_qwen3_asr_dir, device="cuda").lm
    eager, graphed = _greedy_three_rows(lm, 70, [3, 0, 69], warm=True)  # 70 slots: buckets 1, 2, 4, ..., 64, 128
    assert eager == graphed


def test_an_ended_streams_final_riding_along_through_cuda_graphs_is_the_offline_answer(
    tiny_qwen3_asr_dir: Path, speech: Callable
) -> None:
    """float32 on CUDA, decode steps through the graphs: a final carried over several updates of another stream
    (rows joining and leaving the graphed steps) equals the model's offline answer."""
    model = checkpoint.load(tiny_qwen3_asr_dir, device="cuda")
    policy = StreamPolicy(chunk_s=0.5, update_tokens=3, final_tokens=40)
    streams = LLMStreams(model, slots=2, policy=policy)
    assert streams._steps is not None  # graphed steps
    ending, talking = speech(2.0, 30), speech(8.0, 31)
    streams.open("ending")
    streams.feed("ending", ending)
    streams.open("talking")
    streams.feed("talking", talking)
    finals = []
    while streams.due():
        finals += [partial for partial in streams.update() if partial.final]
        if "ending" in streams._streams and "ending" not in streams.due():
            streams.end(["ending"])
    while streams.ending:
        finals += streams.advance(4)
    (final,) = finals
    offline = model.transcribe([ending], max_new_tokens=policy.final_tokens)[0]
    assert final.tokens == offline.tokens


@pytest.mark.parametrize("directory", ["tiny_qwen3_asr_dir", "tiny_phi4mm_dir"])
def test_prompts_of_host_features_never_wait_for_the_gpu(
    directory: str, request: pytest.FixtureRequest, speech: Callable, never_waits: Callable
) -> None:
    """A final pass's start (its front end's features through the encoder into its prompt) queues its work and
    returns: it runs on the thread that launches every stream's decode steps."""
    model = checkpoint.load(request.getfixturevalue(directory), device="cuda")
    features, lengths = model.frontend.batch([speech(3.0, 0), speech(17.0, 1)])
    parts = model.prompt("", None)
    with torch.inference_mode():
        model.feature_prompts(features, lengths, parts)  # first use: allocations, library handles
        prompts = never_waits(lambda: model.feature_prompts(features, lengths, parts))
    audio = model.encoder.output_lengths(lengths).tolist()
    assert [len(prompt) for prompt in prompts] == [len(parts.head) + count + len(parts.tail) for count in audio]
