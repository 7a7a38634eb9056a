"""The LLM streaming benchmark's parts: Qwen3-ASR and Phi-4-multimodal at their real sizes with random weights, and
what drives them.

Used by ``scripts/bench_llm.py`` (the sections, the report): nothing here is
part of :mod:`audiomask`.

- :func:`build_model`: an :class:`~audiomask.llm.model.AudioLM` of
  :data:`SIZES` (Qwen3-ASR-0.6B, -1.7B, Phi-4-multimodal-instruct, or tiny
  stand-ins for CPU smoke runs), random weights (normal, std 0.02), no
  checkpoint; its tokenizer is :func:`bench.llm_checkpoints.byte_tokenizer`'s
  of the model's ids (a byte-level BPE: the model's prompt lengths, answers
  that encode back to their ids, a real BPE's cost per text).
- :class:`BenchStreams`: :class:`~audiomask.llm.streaming.LLMStreams` that can
  start a stream's next utterance without the final pass (``restart``);
  :class:`ReFeedStreams`: the official
  ``qwen-asr`` re-feed recipe over the same model code (every update encodes
  all the utterance's features and prefills the whole prompt again).
- :class:`Driver`: streams in real time (chunks due on a clock, phases spread
  over a chunk) for capacity runs (``scripts/bench_llm.py`` searches the most
  streams whose p99 partial latency stays under the chunk); :func:`one_stream` and
  :class:`Probe`: one stream's updates, timed (encoder and decoder apart on a
  GPU by CUDA events) and counted (encoder frames, prefill tokens; Qwen3-ASR's
  encoder).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from audiomask.bench.models import TINY_PHI4MM
from audiomask.bench.signals import OFFSET_SPAN, noise, stream_offsets
from audiomask.bench.timing import MS_PER_S, percentiles
from audiomask.constants import SAMPLE_RATE
from audiomask.llm import refeed
from audiomask.llm.lm import CausalLM, LMConfig
from audiomask.llm.model import AudioLM
from audiomask.llm.phi4mm import Phi4MMProjector
from audiomask.llm.phi4mm import assemble as assemble_phi4mm
from audiomask.llm.policy import DEFAULT_UNFIXED_TOKENS
from audiomask.llm.qwen3_asr import Qwen3ASRProjector, assemble
from audiomask.llm.streaming import LLMStreams
from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder, Qwen3ASRConfig, Qwen3ASREncoder
from bench.llm_checkpoints import PHI4MM_NAMED, phi4mm_tokenizer, qwen3_asr_tokenizer, word_ids

__all__ = [
    "SIZES",
    "BenchStreams",
    "Driver",
    "Probe",
    "ReFeedStreams",
    "build_model",
    "is_phi4mm",
    "fixed_tokens",
    "one_stream",
]

# Qwen3-ASR's released sizes. The 1.7B's are transformers' Qwen3ASRConfig defaults (5.25: audio_config 24 layers,
# 16 heads, ffn 4096, d_model 1024, downsample_hidden_size 480; text_config 2048 hidden, 28 layers, 16 heads, 8 kv
# heads, head_dim 128, intermediate 6144, tied) with Qwen3Config's vocab_size 151936, and output_dim 2048 (its
# checkpoint's config.json; transformers' default, 3584, is no released size). The 0.6B's: the Qwen/Qwen3-ASR-0.6B
# config.json as public ports list it (ivan-digital/qwen3-asr-swift docs/asr-model.md: encoder 896 / 18 layers /
# 14 heads / ffn 3584, output_dim 1024; a C port's model reference: text 1024 hidden, 28 layers, 16 heads, 8 kv,
# head_dim 128, intermediate 3072, vocab 151936, tied, rope theta 1e6, the Qwen/Qwen3-0.6B config.json's decoder),
# as audiomask.bench.models.QWEN3_ASR_06B (its encoder). max_position_embeddings 65536: transformers' text default.
_QWEN3_TEXT = dict(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128)
_QWEN3_TEXT.update(vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=65536)
_QWEN3_TEXT.update(rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})


def _longrope(factors: int) -> dict[str, Any]:
    """Phi-4-mini's rope: LongRoPE over 3/4 of each head (``factors`` = 3/8 of the head dimension)."""
    rope = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75)
    return rope | dict(original_max_position_embeddings=4096, short_factor=[1.0] * factors, long_factor=[2.0] * factors)


SIZES: dict[str, dict[str, Any]] = {
    "0.6b": {
        "audio": dict(encoder_layers=18, encoder_attention_heads=14, encoder_ffn_dim=3584, d_model=896),
        "output_dim": 1024,
        "text": dict(_QWEN3_TEXT, hidden_size=1024, intermediate_size=3072),
    },
    "1.7b": {
        "audio": dict(encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096, d_model=1024),
        "output_dim": 2048,
        "text": dict(_QWEN3_TEXT, hidden_size=2048, intermediate_size=6144),
    },
    "tiny": {  # every code path, CPU-cheap: a smoke test, not a measurement
        "audio": dict(
            encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=48, d_model=32, downsample_hidden_size=4
        ),
        "output_dim": 32,
        "text": dict(_QWEN3_TEXT, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
        | dict(vocab_size=512, hidden_size=32, intermediate_size=64, max_position_embeddings=4096),
    },
    # Phi-4-multimodal-instruct: the audio encoder of Phi4MMAudioConfig's defaults (24 blocks of 1024, 16 heads, the
    # released config's whole-utterance attention) and Phi-4-mini's decoder (32 layers of 3072, 24 query and 8
    # key/value heads of 128, intermediate 8192, 200,064 ids, tied head, LongRoPE over 3/4 of each head past 4,096
    # positions). Random weights: the rope factors' values only change the rotation, not the cost.
    "phi4mm": {
        "family": "phi4mm",
        "audio": Phi4MMAudioConfig(),
        "text": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24)
        | dict(num_key_value_heads=8, vocab_size=200064, tie_word_embeddings=True, max_position_embeddings=131072)
        | dict(original_max_position_embeddings=4096, rope_parameters=_longrope(48)),
    },
    "phi4mm_tiny": {  # every code path, CPU-cheap: a smoke test, not a measurement
        "family": "phi4mm",
        "audio": TINY_PHI4MM,
        "text": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
        | dict(num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=8192)
        | dict(original_max_position_embeddings=4096, rope_parameters=_longrope(3))
        | dict(bos_token_id=None, pad_token_id=None, eos_token_id=None),  # the real ids lie past 512
    },
}
INIT_STD = 0.02  # random weights: normal(0, 0.02) matrices, zero biases, unit norms
TOKENS_PER_S = 4  # an update's answer beyond the rolled-back tokens: about 4 tokens per second of new audio
GOLDEN = 0.6180339887498949  # stream i's phase: frac(i * GOLDEN) of a chunk, even over any first n streams
LEAD_S = 0.05  # an episode's first chunk is due this long after it starts
PIECE_S = 0.1  # a live stream's audio arrives in pieces this long (as a client's messages), fed as they come

STOP_TOKENS = ("<|endoftext|>", "<|im_end|>")
PHI4MM_STOP_TOKENS = ("<|endoftext|>", "<|end|>")  # Phi-4-multimodal's generation config's end tokens


def fixed_tokens(chunk_s: float) -> int:
    """Tokens every update decodes: the rolled-back ones plus about 4 per second of new audio (13 at 2 s)."""
    return DEFAULT_UNFIXED_TOKENS + round(TOKENS_PER_S * chunk_s)


def _randomize(module: torch.nn.Module, std: float) -> None:
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, std)
            elif name.endswith("bias"):
                parameter.zero_()


def is_phi4mm(size: str) -> bool:
    """Whether :data:`SIZES` ``size`` is a Phi-4-multimodal (it streams by re-feeding: :class:`ReFeedStreams`)."""
    return SIZES[size].get("family") == "phi4mm"


def build_model(
    size: str, device: torch.device | str, dtype: torch.dtype, seed: int = 0, std: float = INIT_STD
) -> AudioLM:
    """The recogniser of :data:`SIZES` ``size``, random weights (``std``), on ``device`` in ``dtype`` (as the family's
    ``build`` makes it from a checkpoint): Qwen3-ASR, or Phi-4-multimodal where the size's ``family`` says so."""
    spec, phi4mm = SIZES[size], is_phi4mm(size)
    torch.manual_seed(seed)
    with torch.device(device):  # made where they run: a real size's weights are never on the host
        if phi4mm:
            from transformers import Phi4MultimodalConfig

            encoder = Phi4MMEncoder(spec["audio"])
            lm = CausalLM(LMConfig.from_transformers(Phi4MultimodalConfig(**spec["text"]), qk_norm=False))
            projector = Phi4MMProjector(encoder.output_size, lm.config.hidden_size)
        else:
            from transformers import Qwen3Config

            encoder = Qwen3ASREncoder(Qwen3ASRConfig(**spec["audio"]))
            projector = Qwen3ASRProjector(encoder.output_size, spec["output_dim"])
            lm = CausalLM(LMConfig.from_transformers(Qwen3Config(**spec["text"]), qk_norm=True))
    for module in (encoder, projector, lm):
        _randomize(module, std)
        module.to(device=device, dtype=dtype).eval()
    description = {"size": size, "random_weights": True}
    if phi4mm:
        tokenizer = phi4mm_tokenizer(lm.config.vocab_size)
        stop_ids = frozenset(tokenizer.convert_tokens_to_ids(token) for token in PHI4MM_STOP_TOKENS)
        audio_token = PHI4MM_NAMED["audio_token"]
        return assemble_phi4mm(encoder, projector, lm, tokenizer, audio_token, stop_ids, description=description)
    tokenizer = qwen3_asr_tokenizer(lm.config.vocab_size)
    stop_ids = frozenset(tokenizer.convert_tokens_to_ids(token) for token in STOP_TOKENS)
    return assemble(encoder, projector, lm, tokenizer, stop_ids, description=description)


class BenchStreams(LLMStreams):
    """:class:`LLMStreams` with :meth:`restart` (a stream's next utterance, no final pass)."""

    def restart(self, name: str) -> None:
        """Start stream ``name``'s next utterance in its slot, its audio dropped (finals are not measured)."""
        stream = self._stream(name)
        self._start_segment(stream)
        stream.pending.take(len(stream.pending))


class ReFeedStreams(refeed.ReFeedStreams, BenchStreams):
    """The ``qwen-asr`` re-feed recipe on the same model code (:class:`audiomask.llm.refeed.ReFeedStreams`: every
    update encodes all the utterance's features and prefills the whole prompt into an emptied slot), with
    :meth:`BenchStreams.restart`.

    The features are the streaming front end's, each frame computed once (the recipe recomputes them too,
    so this is a lower bound of its cost); policy, prefix and decoding are :class:`LLMStreams`'.
    """


class Probe:
    """Per update of one :class:`BenchStreams`: encoder (convolutions, attention windows, projector) and decoder
    (prefill, decode steps and the answers' host work) time, by CUDA events on a GPU (the encoder's: device time
    of its kernels) or the host clock on a CPU; ``encoder_frames`` (frames convolved, whole conv chunks),
    ``prefill_tokens`` (the update's first language-model call) and ``decode_steps`` (the others, eager or
    replayed from CUDA graphs)."""

    def __init__(self, streams: BenchStreams) -> None:
        self.streams = streams
        model = streams.model
        self.cuda = model.device.type == "cuda"
        encoder = model.encoder
        spans = [(encoder.layers[0], encoder.ln_post), (model.projector, model.projector)]
        self.handles = [model.lm.register_forward_pre_hook(self._lm_start)]
        for first, last in spans:
            self.handles.append(first.register_forward_pre_hook(self._encoder_start))
            self.handles.append(last.register_forward_hook(self._encoder_end))
        self._embed_chunks, self._embedding = encoder.embed_chunks, False
        encoder.embed_chunks = self._timed_embed_chunks
        self._answer = streams._answer
        streams._answer = self._timed_answer
        self._step = streams._steps.step if streams._steps is not None else None
        if self._step is not None:
            streams._steps.step = self._counted_step
        self.begin()

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        del self.streams.model.encoder.embed_chunks
        del self.streams._answer
        if self._step is not None:
            del self.streams._steps.step

    def begin(self) -> None:
        self.encoder, self.decoder = [], []
        self.counts = {"encoder_frames": 0, "prefill_tokens": 0, "decode_steps": 0}

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _encoder_start(self, module: Any, args: tuple) -> None:
        self.encoder.append([self._mark(), None])

    def _timed_embed_chunks(self, chunks: torch.Tensor) -> torch.Tensor:
        """The conv stack over ``chunks`` ``(N, mel bins, chunk frames)``, timed and its frames counted (once: the
        stack's own calls over parts of a large batch come back here)."""
        if self._embedding:
            return self._embed_chunks(chunks)
        self.counts["encoder_frames"] += int(chunks.shape[0] * chunks.shape[-1])
        self._encoder_start(None, ())
        self._embedding = True
        try:
            tokens = self._embed_chunks(chunks)
        finally:
            self._embedding = False
        self._encoder_end(None, (), tokens)
        return tokens

    def _encoder_end(self, module: Any, args: tuple, output: Any) -> None:
        self.encoder[-1][1] = self._mark()

    def _lm_start(self, module: Any, args: tuple) -> None:
        if self.counts["prefill_tokens"]:
            self.counts["decode_steps"] += 1
        else:
            self.counts["prefill_tokens"] += int(np.asarray(args[2]).sum())

    def _counted_step(self, *args: Any) -> Any:
        self.counts["decode_steps"] += 1
        return self._step(*args)

    def _timed_answer(self, *args: Any) -> Any:
        began = self._mark()
        partials = self._answer(*args)
        self.decoder.append([began, self._mark()])
        return partials

    def _ms(self, pairs: list) -> float:
        if self.cuda:
            return float(sum(start.elapsed_time(end) for start, end in pairs))
        return float(sum(end - start for start, end in pairs) * MS_PER_S)

    def end(self) -> dict:
        """This update's ``encoder_ms``, ``decoder_ms`` and counts (waits for the device)."""
        if self.cuda:
            torch.cuda.synchronize()
        return {"encoder_ms": self._ms(self.encoder), "decoder_ms": self._ms(self.decoder), **self.counts}


def _synchronize(model: AudioLM) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize()


def one_stream(streams: BenchStreams, seconds: float, *, probe: bool = False, seed: int = 0) -> list[dict]:
    """One stream through ``seconds`` of audio, an update per chunk back to back: per update ``audio_s`` and
    ``host_ms`` (chunk fed -> partial returned, the latency of a stream alone), with :class:`Probe`'s fields
    when ``probe``. The stream is finished without its final pass (its slot emptied)."""
    size = streams.policy.chunk_samples
    chunks = max(1, round(seconds / streams.policy.chunk_s))
    signal = noise(chunks * size, seed)
    name = f"one-{seed}"
    streams.open(name)
    probing = Probe(streams) if probe else None
    rows = []
    try:
        for index in range(chunks):
            if probing:
                probing.begin()
            _synchronize(streams.model)
            began = time.perf_counter()
            streams.feed(name, signal[index * size : (index + 1) * size])
            streams.update([name])
            row = {"update": index + 1, "audio_s": round((index + 1) * size / SAMPLE_RATE, 3)}
            row["host_ms"] = (time.perf_counter() - began) * MS_PER_S
            if probing:
                row.update(probing.end())
            rows.append(row)
    finally:
        if probing:
            probing.close()
        streams.drop(name)
    return rows


class Driver:
    """Streams of ``utterance_s``-long utterances in real time on one :class:`BenchStreams`.

    Stream ``i`` reads a shared noise signal from its own offset; its chunks are due every ``chunk_s`` at
    phase ``frac(i * golden ratio) * chunk_s``, their audio arriving in :data:`PIECE_S` pieces over the chunk
    before; at its utterance's end it restarts (:meth:`BenchStreams.restart`).
    New streams are first run, flat out and untimed, to a random position in their utterance, so that a
    measured level holds streams at every point of their utterances, as a server's would.
    """

    def __init__(self, streams: BenchStreams, utterance_s: float, seed: int = 0) -> None:
        self.streams = streams
        self.size = streams.policy.chunk_samples
        self.chunk_s = streams.policy.chunk_s
        self.utterance_chunks = max(1, round(utterance_s / self.chunk_s))
        self.source = noise(OFFSET_SPAN + self.utterance_chunks * self.size, seed)
        self.rng = np.random.default_rng(seed)
        self.names: list[str] = []
        self.positions: list[int] = []  # each stream's chunk being fed
        self.fed: list[int] = []  # samples of that chunk fed so far
        self.offsets = np.zeros(0, np.int64)

    def _feed(self, index: int, upto: int | None = None) -> None:
        """Feed stream ``index`` its current chunk up to sample ``upto`` (default: the whole chunk, then the next)."""
        upto = self.size if upto is None else min(upto, self.size)
        start = int(self.offsets[index]) + self.positions[index] * self.size
        if upto > self.fed[index]:
            self.streams.feed(self.names[index], self.source[start + self.fed[index] : start + upto])
            self.fed[index] = upto
        if upto == self.size:
            self.positions[index] += 1
            self.fed[index] = 0

    def _after(self, index: int) -> None:
        if self.positions[index] >= self.utterance_chunks:
            self.streams.restart(self.names[index])
            self.positions[index] = 0

    def grow(self, count: int) -> float:
        """Open streams up to ``count`` and run the new ones to random points of their utterances; seconds spent.

        The run decodes one token an update (a prefill, no decoding steps); then each new stream's answer so far
        is set to random tokens as many as the policy's updates would have made, so that its next prefixes
        have their steady lengths. What an update keeps (head, closed windows, open window) is the real one's.
        """
        began = time.perf_counter()
        streams, new = self.streams, list(range(len(self.names), count))
        for index in new:
            self.names.append(f"s{index}")
            self.positions.append(0)
            self.fed.append(0)
            streams.open(self.names[index])
        self.offsets = stream_offsets(len(self.names), OFFSET_SPAN)
        targets = self.rng.integers(0, self.utterance_chunks, size=len(new))
        policy = streams.policy
        streams.policy = dataclasses.replace(policy, fixed_tokens=1)
        try:
            for step in range(int(targets.max(initial=0))):
                batch = [index for index, target in zip(new, targets) if target > step]
                for index in batch:
                    self._feed(index)
                streams.update([self.names[index] for index in batch])
        finally:
            streams.policy = policy
        tokenizer = streams.model.tokenizer
        words = word_ids(tokenizer)
        for index, target in zip(new, targets):
            tokens = self.rng.integers(words.start, words.stop, streams.policy.answer_tokens(int(target)))
            streams._stream(self.names[index]).raw = tokenizer.decode(tokens.tolist()) if target else ""
        return time.perf_counter() - began

    def episode(self, count: int, warm_s: float, measure_s: float, abort_lag_s: float) -> dict:
        """Streams ``0 .. count - 1`` in real time for ``warm_s + measure_s``: latencies of chunks due after ``warm_s``.

        A partial's latency: its chunk's last sample due -> its partial returned. Each loop feeds every
        stream the pieces of its chunk that have arrived and updates those whose chunk is due in one call;
        it ends once no chunk is due before the end, or (failed) once a due chunk waits over ``abort_lag_s``.
        """
        chunk_s = self.chunk_s
        start = time.perf_counter() + LEAD_S
        due = start + ((np.arange(count) * GOLDEN) % 1.0) * chunk_s
        measure_from, end = start + warm_s, start + warm_s + measure_s
        latencies, batches, aborted = [], [], False
        frontend_s, update_s = self.streams.features.push_s, 0.0
        while True:
            now = time.perf_counter()
            ready = np.flatnonzero((due <= now) & (due <= end))
            if not ready.size:
                upcoming = due[due <= end]
                if not upcoming.size:
                    break
                time.sleep(max(0.0, float(upcoming.min()) - now))
                continue
            if now - float(due[ready].min()) > abort_lag_s:
                aborted = True
                break
            piece = round(PIECE_S * SAMPLE_RATE)
            arrived = np.clip((now - due + chunk_s) // PIECE_S, 0, None).astype(np.int64) * piece
            arrived = np.minimum(arrived, max(0, self.size - piece))  # a chunk's last piece comes when it is due
            arrived[ready] = self.size
            for index in np.flatnonzero(arrived > np.asarray(self.fed[:count])):
                self._feed(int(index), int(arrived[index]))
            self.streams.update([self.names[index] for index in ready])
            done = time.perf_counter()
            update_s += done - now
            measured = due[ready] >= measure_from
            latencies.extend((done - due[ready][measured]).tolist())
            batches.append(len(ready))
            due[ready] += chunk_s
            for index in ready:
                self._after(int(index))
        wall = time.perf_counter() - start
        result: dict = {"streams": count, "partials": len(latencies), "update_calls": len(batches)}
        result["batch_mean"] = float(np.mean(batches)) if batches else 0.0
        result["batch_max"] = int(max(batches, default=0))
        result["busy_share"] = update_s / wall  # of the episode's wall time, in update() (front end included)
        result["frontend_share"] = (self.streams.features.push_s - frontend_s) / wall
        result["aborted"] = aborted
        if latencies:
            result["latency_ms"] = {k: v * MS_PER_S for k, v in percentiles(latencies).items()}
        p99 = result.get("latency_ms", {}).get("p99", float("inf"))
        result["passed"] = bool(not aborted and p99 < chunk_s * MS_PER_S)
        return result
