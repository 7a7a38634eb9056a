"""Incremental streaming equals the official re-feed recipe, written here over transformers' ``generate``.

The reference re-feeds all features so far and the whole prompt every
chunk, as ``qwen-asr``'s ``streaming_transcribe`` does; the features are the
stream's own (a streaming front end's), so the two differ only in what the
incremental path keeps: encoder windows and the language model's cache.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from audiomask.llm import checkpoint
from audiomask.llm.stream_features import FRONTEND_SHARE
from audiomask.llm.streaming import LLMStreams, StreamPolicy
from tests.llm.streams import stream_tokens

transformers = pytest.importorskip("transformers")

UPDATE_TOKENS = 12


class ReFeed:
    """The recipe: every chunk, all features so far and the previous answer less its last tokens, re-decoded."""

    def __init__(self, directory: Path, policy: StreamPolicy, context: str, language: str | None) -> None:
        from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(directory)
        self.model = Qwen3ASRForConditionalGeneration.from_pretrained(directory).eval()
        self.policy = policy
        messages = [
            {"role": "system", "content": context},
            {"role": "user", "content": [{"type": "audio", "audio": ""}]},
        ]
        tokenizer = self.processor.tokenizer
        self.prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if language is not None:
            self.prompt += f"language {language}<asr_text>"
        self.raw, self.chunk = "", 0
        self.stops = set(self.model.generation_config.eos_token_id)

    def prefix(self) -> str:
        if self.chunk < self.policy.unfixed_chunks:
            return ""
        tokenizer = self.processor.tokenizer
        ids = tokenizer.encode(self.raw)
        back = self.policy.unfixed_tokens
        while True:
            end = max(0, len(ids) - back)
            prefix = tokenizer.decode(ids[:end]) if end > 0 else ""
            if "\ufffd" not in prefix or end == 0:
                return prefix
            back += 1

    def step(self, features: np.ndarray) -> list[int]:
        """One chunk: ``features`` ``(128, T)`` are all the stream's frames so far; the new answer's ids."""
        prefix = self.prefix()
        frames = features.shape[1]
        tokens = (frames // 100) * 13 + _conv(frames % 100)
        head, tail = (self.prompt + prefix).split("<|audio_pad|>")
        ids = self.processor.tokenizer.encode(head + "<|audio_pad|>" * tokens + tail)
        padded = -(-frames // 100) * 100  # transformers' encoder takes whole conv chunks, the rest masked
        inputs = {
            "input_ids": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "input_features": torch.nn.functional.pad(torch.from_numpy(features), (0, padded - frames))[None],
            "input_features_mask": (torch.arange(padded) < frames).long()[None],
        }
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=UPDATE_TOKENS, do_sample=False)
        sequences = out.sequences if hasattr(out, "sequences") else out
        answer = sequences[0, len(ids) :].tolist()
        answer = answer[: next((i for i, token in enumerate(answer) if token in self.stops), len(answer))]
        self.raw = prefix + self.processor.tokenizer.decode(answer, skip_special_tokens=True)
        self.chunk += 1
        return answer


def _conv(frames: int) -> int:
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


@pytest.fixture(scope="module")
def qwen3_asr(tiny_qwen3_asr_dir: Path):
    return checkpoint.load(tiny_qwen3_asr_dir)


@pytest.mark.parametrize(("chunk_s", "seconds", "language"), [(2.0, 19.0, None), (1.0, 6.5, "English")])
def test_partials_equal_the_re_feed_recipe_and_the_final_is_the_offline_answer(
    qwen3_asr, tiny_qwen3_asr_dir: Path, speech: Callable, chunk_s: float, seconds: float, language: str | None
) -> None:
    policy = StreamPolicy(chunk_s=chunk_s, update_tokens=UPDATE_TOKENS, segment_windows=8, final_tokens=64)
    streams = LLMStreams(qwen3_asr, slots=2, policy=policy, language=language)
    reference = ReFeed(tiny_qwen3_asr_dir, policy, "", language)
    frontend = qwen3_asr.frontend.stream()
    signal = speech(seconds, seed=7)
    streams.open("a")
    features = np.zeros((128, 0), np.float32)
    chunks = 0
    for start in range(0, len(signal) - policy.chunk_samples + 1, policy.chunk_samples):
        chunk = signal[start : start + policy.chunk_samples]
        streams.feed("a", chunk)
        (partial,) = streams.update()
        features = np.concatenate((features, frontend.push(chunk)), axis=1)
        assert list(partial.tokens) == reference.step(features), f"chunk {chunks}"
        chunks += 1
    assert chunks >= 6 and streams.cache.lengths[0] > 104  # windows were closed and kept in the cache
    streams.feed("a", signal[chunks * policy.chunk_samples :])
    (final,) = streams.finish(["a"])
    offline = qwen3_asr.transcribe([signal], language=language, max_new_tokens=policy.final_tokens)[0]
    assert final.final and final.text == offline.text and final.tokens == offline.tokens


def test_a_stream_beside_others_equals_itself_alone(qwen3_asr, speech: Callable) -> None:
    policy = StreamPolicy(chunk_s=1.0, update_tokens=UPDATE_TOKENS, final_tokens=40)
    signals = {
        name: speech(seconds, seed) for seed, (name, seconds) in enumerate((("a", 9.0), ("b", 4.0), ("c", 12.0)))
    }

    def run(names: list[str]) -> dict[str, list[tuple[int, ...]]]:
        streams = LLMStreams(qwen3_asr, slots=4, policy=policy)
        seen = stream_tokens(streams, {name: signals[name] for name in names})
        for final in streams.finish(names):
            seen[final.stream].append(final.tokens)
        return seen

    together = run(["c", "a", "b"])
    for name in signals:
        assert together[name] == run([name])[name]


@pytest.mark.parametrize("workers", [0, 1], ids=["threads", "processes"])
def test_long_streams_go_on_in_segments_within_the_slot(qwen3_asr, speech: Callable, workers: int) -> None:
    policy = StreamPolicy(chunk_s=2.0, update_tokens=8, segment_windows=1, final_tokens=40)
    streams = LLMStreams(qwen3_asr, slots=1, policy=policy, frontend_workers=workers)
    signal = speech(21.0, seed=3)
    streams.open("long")
    streams.feed("long", signal)
    partials = []
    while streams.due():
        partials += streams.update()
        assert streams.cache.lengths.max() <= streams.capacity
    (final,) = streams.finish(["long"])
    streams.close()
    first = qwen3_asr.transcribe([signal[:128000]], max_new_tokens=policy.final_tokens)[0]
    assert final.text.startswith(first.text)
    # a partial a chunk: the audio past a segment's cut starts the next one's open window, with no update of its own
    assert len(partials) == len(signal) // policy.chunk_samples


def test_a_segment_pass_rides_along_in_a_spare_slot_and_commits_the_same_text(qwen3_asr, speech: Callable) -> None:
    """A segment's offline pass in a spare slot, decoded along the next updates: the update that cuts does not
    wait for it, every partial's answer is the in-update pass's, and so are the finals (by ``finish`` and by
    ``end`` with a pass still in flight); a dropped stream's spare slot comes back."""
    policy = StreamPolicy(chunk_s=2.0, update_tokens=8, segment_windows=1, final_tokens=24)
    signal = speech(21.0, seed=3)

    def run(pass_slots: int, ending: bool) -> tuple[list[tuple[int, ...]], str, int, bool]:
        streams = LLMStreams(qwen3_asr, slots=1, policy=policy, pass_slots=pass_slots)
        streams.open("long")
        streams.feed("long", signal[: len(signal) - 8000])
        answers, in_flight = [], 0
        while streams.due():
            answers += [partial.tokens for partial in streams.update()]
            in_flight += bool(streams._passes)
        streams.feed("long", signal[len(signal) - 8000 :])
        at_end = bool(streams._passes)
        if not ending:
            (final,) = streams.finish(["long"])
            return answers, final.text, in_flight, at_end
        streams.end(["long"])
        finals = []
        while not finals:
            finals = [partial for partial in streams.advance(4) if partial.final]
        return answers, finals[0].text, in_flight, at_end

    alone = run(0, False)
    assert alone[2:] == (0, False)
    for ending in (False, True):
        answers, text, in_flight, at_end = run(1, ending)
        assert in_flight > 0 and at_end, "the run's segment passes were not in flight at its updates and its end"
        assert (answers, text) == alone[:2]

    streams = LLMStreams(qwen3_asr, slots=1, policy=policy, pass_slots=1)
    streams.open("gone")
    streams.feed("gone", signal[:160000])
    while not streams._passes:
        streams.update()
    streams.drop("gone")
    assert streams._spare == [1] and not streams._passes


def test_decode_steps_through_graphed_buffers_give_the_same_partials(qwen3_asr, speech: Callable) -> None:
    """``cuda_graphs=True`` (its static buffers run eagerly on the CPU) changes no token."""
    policy = StreamPolicy(chunk_s=1.0, update_tokens=UPDATE_TOKENS, final_tokens=16)
    seen = []
    for graphs in (False, True):
        streams = LLMStreams(qwen3_asr, slots=3, policy=policy, cuda_graphs=graphs)
        seen.append(stream_tokens(streams, {name: speech(3.0 + 2 * seed, seed) for seed, name in enumerate("abc")}))
    assert seen[0] == seen[1]


def test_front_end_threads_or_processes_change_no_frame_and_no_token(qwen3_asr, speech: Callable) -> None:
    """Due streams shared over front-end threads, or pushed in front-end processes: the same open-window frames
    and partials as one thread."""
    policy = StreamPolicy(chunk_s=1.0, update_tokens=4, final_tokens=4)
    names = [f"s{index}" for index in range(2 * FRONTEND_SHARE + 3)]  # two shares of different sizes at first
    runs = []
    for threads, workers in ((1, 0), (3, 0), (1, 2)):
        streams = LLMStreams(
            qwen3_asr, slots=len(names), policy=policy, frontend_threads=threads, frontend_workers=workers
        )
        signals = {name: speech(1.0 + (seed % 4) * 0.7, seed) for seed, name in enumerate(names)}
        windows: list[torch.Tensor] = []
        partials = stream_tokens(streams, signals, lambda: windows.append(streams._window.clone()))  # noqa: B023
        streams.close()
        runs.append((partials, windows))
    (partials, windows), *others = runs
    for other_partials, other_windows in others:
        assert other_partials == partials
        assert all(torch.equal(a, b) for a, b in zip(windows, other_windows, strict=True))


def test_samples_fed_from_a_buffer_the_caller_reuses_are_kept_as_they_were(qwen3_asr, speech: Callable) -> None:
    """A caller that reads audio into one array and feeds it again and again (as a capture loop does) gets the
    partials and final of fresh arrays: what was fed is kept as it was, pieces joined only when read."""
    policy = StreamPolicy(chunk_s=1.0, update_tokens=4, final_tokens=4)
    signal = speech(3.7, 0)
    piece = policy.chunk_samples // 3 + 7  # pieces straddle the chunks
    runs = []
    for reuse in (False, True):
        streams = LLMStreams(qwen3_asr, slots=1, policy=policy)
        streams.open("s")
        buffer, tokens = np.zeros(piece, np.float32), []
        for start in range(0, len(signal), piece):
            part = signal[start : start + piece]
            if reuse:
                buffer[: len(part)] = part
                part = buffer[: len(part)]
            streams.feed("s", part)
            if streams.due():
                tokens += [partial.tokens for partial in streams.update()]
        runs.append((tokens, [partial.text for partial in streams.finish(["s"])]))
    assert runs[0] == runs[1] and len(runs[0][0]) == 3


def test_audio_buffered_between_updates_is_pushed_ahead_with_the_same_frames_and_tokens(
    qwen3_asr, speech: Callable
) -> None:
    """Live streams, out of phase: audio arrives in quarter chunks between updates, and what the streams not
    due have buffered goes through the front end on its threads while an update runs. The open windows'
    frames, the partials (across a segment's cut) and the finals equal those of one thread, which pushes
    each chunk whole when it is due."""
    policy = StreamPolicy(chunk_s=1.0, update_tokens=4, final_tokens=4, segment_windows=1)
    names = [f"s{index}" for index in range(FRONTEND_SHARE + 3)]
    signals = {name: speech(8.5 + (seed % 3) * 0.6, seed) for seed, name in enumerate(names)}
    piece = policy.chunk_samples // 4
    runs = []
    for threads in (1, 3):
        streams = LLMStreams(qwen3_asr, slots=len(names), policy=policy, frontend_threads=threads)
        seen: dict[str, list[tuple[int, ...]]] = {name: [] for name in names}
        windows, taken = [], 0
        for name in names:
            streams.open(name)
        for step in range(max(len(signal) for signal in signals.values()) // piece + 4):
            for lag, name in enumerate(names):  # stream k starts k % 4 pieces late
                start = (step - lag % 4) * piece
                if 0 <= start < len(signals[name]):
                    streams.feed(name, signals[name][start : start + piece])
            if streams.due():
                for partial in streams.update():
                    seen[partial.stream].append(partial.tokens)
                windows.append(streams._window.clone())
                taken += sum(streams.features.ahead(slot) for slot in range(len(names)))
        finals = {partial.stream: partial.text for partial in streams.finish(names)}
        left = [slot for slot in range(len(names)) if streams.features.ahead(slot)]  # their last samples' frames
        for name in names:
            streams.open(f"next {name}")  # new streams in the freed slots start with nothing taken ahead
        assert not any(streams.features.ahead(slot) for slot in range(len(names)))
        streams.close()
        runs.append((seen, windows, finals, taken + len(left)))
    (seen, windows, finals, taken), (ahead_seen, ahead_windows, ahead_finals, ahead_taken) = runs
    assert taken == 0 and ahead_taken > 0  # one thread takes nothing ahead; three do
    assert ahead_seen == seen and ahead_finals == finals
    assert all(torch.equal(a, b) for a, b in zip(windows, ahead_windows, strict=True))
    assert all(len(partials) >= 8 for partials in seen.values())  # every stream streamed past its cut


def test_a_stream_closing_its_window_beside_others_equals_itself_alone(qwen3_asr, speech: Callable) -> None:
    """Streams out of phase: one closes an encoder window in an update where the others do not."""
    policy = StreamPolicy(chunk_s=1.0, update_tokens=UPDATE_TOKENS, final_tokens=8)
    signals = {"early": speech(11.0, 0), "late": speech(7.0, 1)}
    lead = 3  # chunks "early" is fed before "late" joins

    def run(names: list[str]) -> dict[str, list[tuple[int, ...]]]:
        streams = LLMStreams(qwen3_asr, slots=2, policy=policy)
        seen: dict[str, list[tuple[int, ...]]] = {name: [] for name in names}
        for name in names:
            streams.open(name)
        size = policy.chunk_samples
        for step in range(len(signals["early"]) // size):
            for name in names:
                start = (step - (lead if name == "late" else 0)) * size
                if 0 <= start < len(signals[name]) - size + 1:
                    streams.feed(name, signals[name][start : start + size])
            for partial in streams.update():
                seen[partial.stream].append(partial.tokens)
        return seen

    together = run(["early", "late"])
    assert together == {**run(["early"]), **run(["late"])}


def test_finals_in_bounded_batches_equal_one_batch_and_fixed_tokens_count_each_ones_audio(
    qwen3_asr, speech: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audiomask.llm import streaming

    policy = StreamPolicy(chunk_s=1.0, fixed_tokens=7)
    signals = {name: speech(seconds, seed) for seed, (name, seconds) in enumerate((("a", 2.5), ("b", 1.2), ("c", 2.1)))}

    def finals() -> dict[str, tuple[int, ...]]:
        streams = LLMStreams(qwen3_asr, slots=3, policy=policy)
        for name, signal in signals.items():
            streams.open(name)
            streams.feed(name, signal)
        return {final.stream: final.tokens for final in streams.finish(list(signals))}

    together = finals()
    monkeypatch.setattr(streaming, "FINAL_ROWS", 1)
    assert finals() == together
    # what the updates' answer holds after ceil(seconds / chunk) chunks (7, 7, then 7 - 5 kept + 7), whoever
    # shares the batch: 3 chunks for a and c, 2 for b
    assert {name: len(tokens) for name, tokens in together.items()} == {"a": 9, "b": 7, "c": 9}


def test_an_ended_streams_final_rides_along_the_others_updates_and_is_the_offline_answer(
    qwen3_asr, speech: Callable
) -> None:
    """``end`` decodes a final beside the updates of the streams still talking (and in steps of its own by
    ``advance``): the final is the offline answer, and the others' partials are theirs alone; a final dropped
    before it is done never comes, and its slot is free."""
    policy = StreamPolicy(chunk_s=0.5, update_tokens=3, final_tokens=48)
    signals = {"ending": speech(2.2, 11), "talking": speech(6.0, 12)}
    alone = stream_tokens(LLMStreams(qwen3_asr, slots=1, policy=policy), {"talking": signals["talking"]})
    streams = LLMStreams(qwen3_asr, slots=3, policy=policy)
    for name, signal in signals.items():
        streams.open(name)
        streams.feed(name, signal)
    seen, finals, updates_after_end = [], [], 0
    while streams.due():
        partials = streams.update()
        seen += [partial.tokens for partial in partials if partial.stream == "talking" and not partial.final]
        finals += [partial for partial in partials if partial.final]
        if "ending" in streams._streams and "ending" not in streams.due():
            streams.end(["ending"])  # its last 0.2 s go into its final
        elif streams.ending:
            updates_after_end += 1
    while streams.ending:
        finals += streams.advance(4)
    assert seen == alone["talking"]
    (final,) = finals
    offline = qwen3_asr.transcribe([signals["ending"]], max_new_tokens=policy.final_tokens)[0]
    assert (final.stream, final.final, final.text, final.tokens) == ("ending", True, offline.text, offline.tokens)
    assert updates_after_end >= 2, "the final was decoded within one update: it did not ride along"

    streams.open("gone")
    streams.feed("gone", signals["ending"])
    streams.end(["gone"])
    streams.drop("gone")
    assert streams.ending == 0 and streams.advance(4) == [] and len(streams._free) == 2


def test_an_ended_streams_front_end_runs_on_a_front_end_thread_from_its_end(
    qwen3_asr, speech: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``end`` starts the final's offline front end on a front-end thread at once (not on the caller's thread at
    the next update); the next update starts the final from those features without computing them again, and
    the final is the offline answer."""
    calls: list[tuple[str, list[int]]] = []
    frontend_type = type(qwen3_asr.frontend)
    batch = frontend_type.batch

    def spy(frontend: object, signals: list) -> object:
        calls.append((threading.current_thread().name, [len(signal) for signal in signals]))
        return batch(frontend, signals)

    monkeypatch.setattr(frontend_type, "batch", spy)
    policy = StreamPolicy(chunk_s=1.0, update_tokens=3, final_tokens=32)
    signals = {"ending": speech(2.5, 21), "talking": speech(5.0, 22)}
    streams = LLMStreams(qwen3_asr, slots=2, policy=policy, frontend_threads=2, pass_slots=1)
    for name, signal in signals.items():
        streams.open(name)
        streams.feed(name, signal)
    streams.update()
    streams.end(["ending"])
    streams._ending["ending"].prompt_features.result(timeout=60)
    assert [(thread.startswith("audiomask-frontend"), lengths) for thread, lengths in calls] == [
        (True, [len(signals["ending"])])
    ]
    finals = []
    while streams.due() or streams.ending:
        partials = streams.update() if streams.due() else streams.advance(4)
        finals += [partial for partial in partials if partial.final]
    assert len(calls) == 1  # the final started from the features computed from its end
    (final,) = finals
    offline = qwen3_asr.transcribe([signals["ending"]], max_new_tokens=policy.final_tokens)[0]
    assert (final.stream, final.text, final.tokens) == ("ending", offline.text, offline.tokens)
    streams.close()


def test_slots_whose_cache_the_memory_cannot_hold_are_refused_with_how_many_fit(qwen3_asr, monkeypatch) -> None:
    """The cache is checked against the memory free on the model's device before anything is allocated; a count
    that fits is made, one that does not is refused naming the slots and how many fit."""
    fitting = LLMStreams(qwen3_asr, slots=3, policy=StreamPolicy(), pass_slots=1)
    slot_bytes = fitting.cache.nbytes // 4
    monkeypatch.setattr("audiomask.llm.lm.free_bytes", lambda device: 6 * slot_bytes + slot_bytes // 2)
    assert LLMStreams(qwen3_asr, slots=5, policy=StreamPolicy(), pass_slots=1).cache.slots == 6
    with pytest.raises(ValueError, match=r"slots=6 and pass_slots=1: 7 cache slots .* about 6 such slots fit"):
        LLMStreams(qwen3_asr, slots=6, policy=StreamPolicy(), pass_slots=1)
