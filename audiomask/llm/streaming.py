"""Streaming transcription with an LLM recogniser, incrementally, many streams decoded in one batch.

The policy is the official ``qwen-asr`` streaming recipe's (:class:`StreamPolicy`): every ``chunk_s`` of audio, a
partial: the model answers the audio so far, its answer starting from the previous answer less its last
``unfixed_tokens`` tokens (no such prefix for the first ``unfixed_chunks`` chunks). The recipe re-feeds all audio
through the encoder and re-decodes the whole prompt every chunk, so its cost grows with the utterance. Here the work
done once is kept:

- **encoder**: Qwen3-ASR attends inside fixed 8 s windows, so a closed window's outputs are final; each update
  attends only the open window again, and convolves only its chunks not yet convolved (each 1 s conv chunk is
  convolved on its own, so a completed chunk's conv tokens are kept); features come from a streaming front end, each
  frame computed once.
- **language model**: the KV cache of the prompt head (system turn, context, user turn) and of the closed windows'
  audio tokens is kept in the stream's slot; an update crops the slot back to it and runs only the newly closed
  windows, the open window, the prompt tail and the rolled-back prefix, then decodes.

All streams that have a chunk due update together: one front-end call
(:class:`~audiomask.llm.stream_features.StreamFeatures`, a stream per slot, the due ones pushed; what the others
have buffered is pushed on the front-end threads while the update runs on the device), one gather of their new conv
chunks' frames (kept per slot in one preallocated buffer on the device), one convolution call, one attention call
(two when some rows close a window), one embedding call for every row's prompt tail and prefix, one gather
assembling the rows' inputs, one prefill, one batched greedy loop over slots of different lengths
(:func:`~audiomask.llm.generate.greedy`), so a stream's partials do not depend on the others. When a stream ends,
its final text is the model's offline answer for the whole utterance (:meth:`AudioLM.transcribe`'s, a second pass as
in two-pass decoding), so partials are fast and finals are the model's best. A stream ended by
:meth:`LLMStreams.end` frees its slot at once (for the next stream: a server's next segment of the same connection);
its final pass decodes in a spare slot riding along the updates, those of at most :data:`FINAL_AUDIO_S_PER_RUN`
seconds of audio starting per update.

Long streams: a segment holds ``segment_windows`` closed windows at most (32 s by default); once it has them, the
segment ends at that window's last sample, its offline answer is committed to the stream's text, and the stream goes
on as a new utterance from there. The segment's offline pass rides along later steps in a spare slot
(``pass_slots``; none free: it runs in the update), its last partial standing in until it lands. Memory per stream
is so bounded: one cache slot (:attr:`LLMStreams.capacity` positions), the open window's frames and the current
segment's samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from audiomask.checks import check_int
from audiomask.constants import HOP_LENGTH, SAMPLE_RATE
from audiomask.llm.generate import Decoder
from audiomask.llm.graphs import GraphedDecode
from audiomask.llm.model import AudioLM, LLMTranscript
from audiomask.llm.pending import PendingSamples
from audiomask.llm.policy import StreamPolicy
from audiomask.llm.prompt import decode_texts, encode_texts
from audiomask.llm.stream_features import DEFAULT_FRONTEND_THREADS, ProcessStreamFeatures, StreamFeatures, joined
from audiomask.llm.windows import encode_open_windows, shift_open_windows
from audiomask.models import Qwen3ASREncoder
from audiomask.ragged import ragged_index
from audiomask.samples import as_samples
from audiomask.transfer import to_device

__all__ = ["LLMStreams", "Partial", "StreamPolicy"]

FINAL_ROWS = 64  # most segments one encoder call of final passes takes (the prefill and decoding take all)
# Spare cache slots for segment passes and ended streams' finals riding along (~125 steps, ~10 updates each;
# 92.7 MB a slot, 0.6B, 2 s).
DEFAULT_PASS_SLOTS = 16
# Audio whose final passes start in one run of the decoder (an update's, or an advance's; one stream's at least): a
# start runs the offline front end and encoder over the whole segment (~15 ms for 27 s of audio on an H200), so a
# burst of ends delays the next update by one such group, not by all of them. A bound in audio, not in streams:
# short segments (ends at every pause) start many a group, long ones few.
FINAL_AUDIO_S_PER_RUN = 480.0
# What an update needs on a GPU beside the cache, allocated as it runs: the decode graphs' pool, the logits and the
# prefill's activations, all growing with the slots. A slot count that leaves less is refused when the streams are
# made, not by an out-of-memory error that stops every stream under load (figures: docs/defaults.md).
UPDATE_RESERVE_BYTES = 4 * 2**30
UPDATE_RESERVE_BYTES_PER_SLOT = 12 * 2**20


@dataclass(frozen=True)
class Partial:
    """A stream's text after an update: ``text`` (earlier segments' final text, then this answer's), ``language``,
    ``tokens``: this segment's answer ids (prefix included), ``final``: the utterance's last word on it."""

    stream: str
    text: str
    language: str
    tokens: tuple[int, ...]
    final: bool


@dataclass
class _Stream:
    name: str
    slot: int
    samples: list[np.ndarray] = field(default_factory=list)  # the current segment's samples, for its final pass
    pending: PendingSamples = field(default_factory=PendingSamples)  # samples of the next chunk
    chunks: int = 0  # updates made in this segment
    fixed: int = 0  # cache positions kept: the prompt head and the closed windows' audio tokens
    closed_windows: int = 0
    raw: str = ""  # the answer so far, as decoded text (the recipe's _raw_decoded)
    tokens: tuple[int, ...] = ()
    committed: list[str] = field(default_factory=list)  # earlier segments' final texts
    language: str = ""
    heard: int = 0  # ended: how many samples its segment holds
    prompt_features: Future | None = None  # ended, its final not started: its segment's offline front end
    answer: LLMTranscript | None = None  # its final, once decoded (ended streams)


class LLMStreams:
    """Up to ``slots`` concurrent streams of one :class:`~audiomask.llm.model.AudioLM`, decoded in batches.

    ``open(name)`` starts a stream, ``feed(name, samples)`` buffers its audio, ``update()`` runs one chunk of every
    stream that has one due and returns their partials, ``finish(names)`` ends streams with their final text. One
    thread drives it; the cache is allocated once: ``slots x capacity`` positions (:attr:`capacity`), and
    ``pass_slots`` more, for long streams' segment passes and ended streams' finals; so is the open windows' frame
    buffer on the model's device: ``slots x mel bins x (window + a chunk's frames)`` float32 (512 MB for 1,024
    slots at 2 s chunks). ``cuda_graphs`` (default: on a CUDA device): decode steps replayed from CUDA graphs
    (:class:`~audiomask.llm.graphs.GraphedDecode`; on a CPU they run eagerly). ``frontend_threads``: threads that
    push the due streams' audio through the front end, a share each, the other streams' buffered audio while an
    update runs on the device, and the ended streams' offline front end (the features do not depend on how the
    streams or their samples are shared out: each frame is computed alone); ``frontend_workers`` > 0: the pushes
    run in that many processes (:class:`~audiomask.llm.stream_features.ProcessStreamFeatures`: not under this
    thread's interpreter lock)."""

    def __init__(
        self,
        model: AudioLM,
        slots: int,
        *,
        policy: StreamPolicy | None = None,
        context: str = "",
        language: str | None = None,
        cuda_graphs: bool | None = None,
        frontend_threads: int = DEFAULT_FRONTEND_THREADS,
        frontend_workers: int = 0,
        pass_slots: int = DEFAULT_PASS_SLOTS,
    ) -> None:
        self.model = model
        self.policy = policy or StreamPolicy()
        self.context, self.language = context, language
        self.parts = model.prompt(context, language)
        self.slots = check_int("slots", slots, minimum=1)
        self._size_windows()
        policy = self.policy
        # The slot's longest content: head, the windows of a segment's audio, tail, then the longer of the
        # answer so far (at most one update's answer per chunk of the segment: a prefix re-encoded from text
        # need not shrink by the roll-back) and the segment's final answer, decoded in the slot at its end.
        # A segment holds under segment_windows closed windows, an open one, and the last chunk's samples.
        window_samples = self.window_frames * HOP_LENGTH
        windows = policy.segment_windows + -(-policy.chunk_samples // window_samples)
        chunks = -(-windows * window_samples // policy.chunk_samples) + 1
        self.capacity = (
            len(self.parts.head)
            + windows * self.window_tokens
            + len(self.parts.tail)
            + max(chunks * (policy.fixed_tokens or policy.update_tokens), policy.final_budget(windows * window_samples))
        )
        spare = self._pass_slots = check_int("pass_slots", pass_slots, minimum=0)
        reserve = (UPDATE_RESERVE_BYTES, UPDATE_RESERVE_BYTES_PER_SLOT) if model.device.type == "cuda" else (0, 0)
        try:
            model.lm.check_cache_fits(slots + spare, self.capacity, *reserve)
        except ValueError as error:
            raise ValueError(f"slots={slots} and pass_slots={spare}: {error}") from None
        self._init_windows(slots)
        self.cache = model.lm.new_cache(slots + spare, self.capacity)
        if cuda_graphs is None:
            cuda_graphs = model.device.type == "cuda"
        self._steps = GraphedDecode(model.lm, self.cache) if cuda_graphs else None
        # Every decoding of these slots: updates, final passes, and the ended streams' finals riding along.
        stop = self.policy.fixed_tokens is None
        self._decoder = Decoder(model.lm, self.cache, model.stop_ids, stop=stop, steps=self._steps)
        if check_int("frontend_workers", frontend_workers, minimum=0):
            chunk = policy.chunk_samples
            self.features = ProcessStreamFeatures(model.frontend, slots, frontend_threads, frontend_workers, chunk)
        else:
            self.features = StreamFeatures(model.frontend, slots, frontend_threads)
        self._free = list(range(slots))[::-1]
        self._spare = list(range(slots, slots + spare))[::-1]  # slots for segment passes
        self._passes: dict[str, tuple[_Stream, int, int]] = {}  # stream -> (it, committed index, slot): in flight
        self._streams: dict[str, _Stream] = {}
        self._ending: dict[str, _Stream] = {}  # ended (:meth:`end`), their finals waiting or in flight
        self._waiting: deque[_Stream] = deque()  # ended, their final passes not started: first ended first
        self._ended: list[Partial] = []  # their finals done, for the next update() or advance()
        self._head = model.lm.embed(torch.tensor(self.parts.head, dtype=torch.long))

    def _size_windows(self) -> None:
        """The encoder's windows: 8 s for Qwen3-ASR, :attr:`window_frames` frames, :attr:`window_tokens` tokens."""
        model = self.model
        if not isinstance(model.encoder, Qwen3ASREncoder):
            raise ValueError(f"model must be a Qwen3-ASR recogniser for streaming, got family {model.family!r}")
        config = model.encoder.config
        self.window_frames = config.window_tokens * config.chunk_frames // config.chunk_tokens  # 800 frames: 8 s
        self.window_tokens = config.window_tokens

    def _init_windows(self, slots: int) -> None:
        """The open windows' buffers on the model's device."""
        model = self.model
        config = model.encoder.config
        # Slot s's open-window frames are _window[s, :, :_window_filled[s]], zeros after (so one gather pads a batch).
        framing = model.frontend.framing
        pushed = (self.policy.chunk_samples + framing.win + framing.pad) // framing.hop + 2  # most a push makes
        width = -(-(self.window_frames + pushed) // config.chunk_frames) * config.chunk_frames  # whole conv chunks
        self._window = torch.zeros((slots, config.num_mel_bins, width), dtype=torch.float32, device=model.device)
        self._window_filled = np.zeros(slots, np.int64)
        # Slot s's open window's first _chunks_done[s] conv chunks, convolved: their tokens, kept.
        self._chunk_tokens = torch.zeros(
            (slots, config.window_tokens, config.d_model),
            dtype=model.encoder.conv_out.weight.dtype,
            device=model.device,
        )
        self._chunks_done = np.zeros(slots, np.int64)

    def _reset_windows(self, slot: int) -> None:
        """Slot ``slot``'s open window emptied (a new segment)."""
        self._window[slot, :, : self._window_filled[slot]] = 0.0
        self._window_filled[slot] = 0
        self._chunks_done[slot] = 0

    def __len__(self) -> int:
        return len(self._streams)

    def warm_graphs(self) -> int:
        """Capture the decode step of every batch size the slots can need now, before any stream opens (a
        server's start), rather than at each size's first update under load, where a capture stalls every
        due stream. The graphs captured (0 without CUDA graphs). Their private memory grows with the slots
        (about 5 GiB for 1,000 slots of the 0.6B on the H200)."""
        return 0 if self._steps is None else self._steps.warm()

    def open(self, name: str) -> None:
        """Start a stream named ``name`` (a slot must be free)."""
        if name in self._streams:
            raise ValueError(f"name {name!r} is already an open stream")
        if not self._free:
            raise ValueError(f"all {self.slots} slots hold streams: finish one before opening {name!r}")
        stream = _Stream(name, self._free.pop())
        self._streams[name] = stream
        self._start_segment(stream)

    def _start_segment(self, stream: _Stream) -> None:
        self.features.reset(stream.slot)
        self._reset_windows(stream.slot)
        stream.samples = []
        stream.chunks = stream.closed_windows = 0
        stream.raw, stream.tokens = "", ()
        self.cache.reset(stream.slot)
        stream.fixed = 0  # the head is prefilled with the first update

    def feed(self, name: str, samples: object, *, checked: bool = False) -> None:
        """Buffer ``samples`` (1-D float32, 16 kHz, any length) for ``name`` (``checked``: by :func:`as_samples`,
        and left unchanged by the caller: kept without a copy)."""
        stream = self._stream(name)
        stream.pending.append(samples if checked else as_samples("samples", samples).copy())

    def _stream(self, name: str) -> _Stream:
        if name not in self._streams:
            raise ValueError(f"name must be an open stream, got {name!r}")
        return self._streams[name]

    def due(self) -> list[str]:
        """The streams with a whole chunk buffered."""
        size = self.policy.chunk_samples
        return [name for name, stream in self._streams.items() if len(stream.pending) >= size]

    @torch.inference_mode()
    def update(self, names: Sequence[str] | None = None) -> list[Partial]:
        """One chunk of each stream in ``names`` (default :meth:`due`), in one batch: their partials."""
        names = self.due() if names is None else list(names)
        size = self.policy.chunk_samples
        streams = [self._stream(name) for name in names]
        for stream in streams:
            if len(stream.pending) < size:
                raise ValueError(f"stream {stream.name!r} has {len(stream.pending)} samples buffered, under a chunk")
        chunks = []
        for stream in streams:
            chunks.append(stream.pending.take(size))
        try:
            partials = self._decode(streams, chunks)
        finally:
            self.features.wait()  # the other streams' front end, run meanwhile (:meth:`_push_ahead`)
        self._next_segments([stream for stream in streams if stream.closed_windows >= self.policy.segment_windows])
        return partials + self._take_ended()

    def _next_segments(self, streams: list[_Stream]) -> None:
        """End the segments of ``streams`` at their last closed window and go on after it; commit each one's
        offline text: decoded riding along later steps in a spare slot (its last partial's text standing in
        until then), or now in its own slot when no spare one is free or its last segment's is in flight."""
        if not streams:
            return
        cut = self.policy.segment_windows * self.window_frames * HOP_LENGTH
        heard = [np.concatenate(stream.samples) for stream in streams]
        ride, free = [], len(self._spare)
        for stream in streams:
            ride.append(stream.name not in self._passes and sum(ride) < free)
        riding = [(stream, self._spare.pop(), samples[:cut]) for stream, samples, r in zip(streams, heard, ride) if r]
        rows = self._final_inputs(self._later([signal for *_, signal in riding]), [slot for _, slot, _ in riding])
        for (stream, slot, signal), row in zip(riding, rows, strict=True):
            self._decoder.add(("segment", stream.name), slot, row, self.policy.final_budget(len(signal)), finish=False)
            self._passes[stream.name] = (stream, len(stream.committed), slot)
            stream.committed.append(self.model.parse([stream.raw], self.language)[0][1])
        waiting = [stream for stream, r in zip(streams, ride, strict=True) if not r]
        signals = [samples[:cut] for samples, r in zip(heard, ride, strict=True) if not r]
        for stream, transcript in zip(waiting, self._finals(waiting, signals) if waiting else [], strict=True):
            stream.committed.append(transcript.text)
        # The audio past the cut (under a chunk: the window closed with this update) starts the next segment's
        # open window at once, encoded with its next chunk: no update, and no partial, of its own.
        for stream, samples in zip(streams, heard, strict=True):
            self._start_segment(stream)
            stream.samples = [samples[cut:]]
        slots = np.array([stream.slot for stream in streams], np.int64)
        self._window_filled[slots] = self._push_window_frames([samples[cut:] for samples in heard], slots)

    def _decode(self, streams: list[_Stream], chunks: list[np.ndarray]) -> list[Partial]:
        if not streams:
            return []
        for stream, chunk in zip(streams, chunks, strict=True):
            stream.samples.append(chunk)
        audio, counts, closed = self._open_windows(streams, chunks)
        prefixes = self._prefixes(streams)
        tails = [[*self.parts.tail, *ids] for ids in encode_texts(self.model.tokenizer, prefixes)]
        heads = np.array([0 if stream.fixed else len(self.parts.head) for stream in streams], np.int64)
        inputs = self._inputs(heads, audio, counts, tails)
        for stream, prefix, head, kept in zip(streams, prefixes, heads.tolist(), closed.tolist(), strict=True):
            self.cache.crop(stream.slot, stream.fixed)
            stream.fixed += head + kept  # the head goes in with the segment's first update
            stream.raw = prefix
        return self._answer(streams, inputs)

    def _answer(self, streams: list[_Stream], inputs: list[torch.Tensor]) -> list[Partial]:
        """Decode each stream's prompt ``inputs`` (its slot already holding what precedes them); its partial."""
        model = self.model
        budget = self.policy.fixed_tokens or self.policy.update_tokens
        for stream, row in zip(streams, inputs, strict=True):
            self._decoder.add(("update", stream.name), stream.slot, row, budget)
        done = self._run()
        answers = [done[("update", stream.name)] for stream in streams]
        for stream, answer, text in zip(streams, answers, decode_texts(model.tokenizer, answers), strict=True):
            stream.raw += text
            stream.tokens = tuple(answer)
            stream.chunks += 1
        partials = []
        for stream, (language, text) in zip(streams, model.parse([s.raw for s in streams], self.language), strict=True):
            stream.language = language or stream.language
            partials.append(Partial(stream.name, self._joined(stream, text), stream.language, stream.tokens, False))
        return partials

    def _open_windows(
        self, streams: list[_Stream], chunks: list[np.ndarray]
    ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """Push the chunks through the front end and encode the open windows, in one batch each.

        Returns the projected audio tokens ``(B, n, hidden)`` (row ``b``'s first ``counts[b]`` real: the
        windows closed since its last update, then its open window) and ``closed[b]``, the closed windows'
        tokens. A window's frames close once ``window_frames`` of them are in; its tokens are then final.
        """
        slots = np.array([stream.slot for stream in streams], np.int64)
        lengths = self._push_window_frames(chunks, slots)
        self._push_ahead(slots)
        counts = self.model.encoder.output_lengths(lengths)  # on the host, as the lengths: no wait for the device
        audio = encode_open_windows(
            self.model, self._window, self._chunk_tokens, self._chunks_done, slots, lengths, counts
        )
        closing = lengths // self.window_frames
        for stream, count in zip(streams, closing.tolist(), strict=True):
            stream.closed_windows += count
        shifting = closing > 0
        shift_open_windows(self._window, slots[shifting], (closing * self.window_frames)[shifting], lengths[shifting])
        self._window_filled[slots] = lengths - closing * self.window_frames
        return audio, counts, closing * self.window_tokens

    def _push_window_frames(self, chunks: list[np.ndarray], slots: np.ndarray) -> np.ndarray:
        """Push ``chunks`` through the front end and append their frames to the slots' open windows (one
        scatter: frame j of row r goes to slots[r] at its filled length + j); the windows' new lengths."""
        new, added = self._push_frames(chunks, slots)  # (B, bins, T): zeros after each row's frames
        filled = self._window_filled[slots]
        rows, frames = ragged_index(added)
        where = to_device(np.stack((rows, frames, slots[rows], filled[rows] + frames)), self._window.device)
        self._window[where[2], :, where[3]] = to_device(new, self._window.device)[where[0], :, where[1]]
        return filled + added

    def _push_frames(self, chunks: list[np.ndarray], slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The front end's frames of ``chunks``, the due chunks of the streams of ``slots``: ``(B, bins, T)`` and
        ``(B,)`` counts (:meth:`StreamFeatures.push`)."""
        return self.features.push(chunks, slots)

    def _push_ahead(self, busy: np.ndarray) -> None:
        """Start the front end on what the open streams but those of slots ``busy`` have buffered of their next
        chunks, on the front-end threads while this update runs on the device (:meth:`update` waits for it).
        Where the front end takes nothing ahead (no threads, or processes), no stream is looked at."""
        if not self.features.takes_ahead:
            return
        size, pieces, slots, busy = self.policy.chunk_samples, [], [], set(busy.tolist())
        for stream in self._streams.values():
            start, stop = self.features.ahead(stream.slot), min(len(stream.pending), size)
            if stop > start and stream.slot not in busy:
                pieces.append(stream.pending.joined()[start:stop])
                slots.append(stream.slot)
        self.features.push_ahead(pieces, slots)

    def _inputs(
        self, heads: np.ndarray, audio: torch.Tensor, counts: np.ndarray, tails: list[list[int]]
    ) -> list[torch.Tensor]:
        """Row ``b``'s inputs: the head's first ``heads[b]`` embeddings, its ``counts[b]`` audio tokens, the
        embeddings of ``tails[b]`` (prompt tail and prefix ids); embedded in one call, assembled in one gather."""
        lm = self.model.lm
        rows, span = len(tails), max(len(ids) for ids in tails)
        lengths = np.array([len(ids) for ids in tails], np.int64)
        ids = np.zeros((rows, span), np.int64)
        ids[np.arange(span)[None, :] < lengths[:, None]] = np.concatenate(tails)
        embeds = lm.embed(ids)  # (B, span, hidden)
        hidden = embeds.shape[-1]
        source = torch.cat(
            [self._head.to(lm.dtype), audio.reshape(-1, hidden).to(lm.dtype), embeds.reshape(-1, hidden).to(lm.dtype)]
        )
        # Where each input comes from in source: head rows, then row b's audio, then row b's tail embeddings.
        totals = heads + counts + lengths
        place = np.arange(int(totals.max()))[None, :]
        audio_at = len(self._head) + np.arange(rows)[:, None] * audio.shape[1] + place - heads[:, None]
        tail_at = (len(self._head) + audio.shape[0] * audio.shape[1] + np.arange(rows)[:, None] * span) + (
            place - (heads + counts)[:, None]
        )
        index = np.where(place < heads[:, None], place, np.where(place < (heads + counts)[:, None], audio_at, tail_at))
        index = np.where(place < totals[:, None], index, 0)
        gathered = source[to_device(index, source.device)]  # (B, longest, hidden)
        return [gathered[row, :total] for row, total in enumerate(totals.tolist())]

    def _prefixes(self, streams: list[_Stream]) -> list[str]:
        """What each stream's next answer starts from (:meth:`StreamPolicy.prefixes`)."""
        answers, chunks = [stream.raw for stream in streams], [stream.chunks for stream in streams]
        return self.policy.prefixes(self.model.tokenizer, answers, chunks)

    def _joined(self, stream: _Stream, text: str) -> str:
        return " ".join(piece for piece in (*stream.committed, text) if piece)

    @torch.inference_mode()
    def finish(self, names: Sequence[str]) -> list[Partial]:
        """End streams ``names``: each one's final text (the offline answer for its audio), slots freed."""
        streams = [self._stream(name) for name in names]
        while any(stream.name in self._passes for stream in streams):  # their segment passes in flight first
            self._run(extra_steps=1)
        answers = self._finals(streams, [self._heard(stream) for stream in streams])
        results = [self._final(stream, answer) for stream, answer in zip(streams, answers, strict=True)]
        for stream in streams:
            self.drop(stream.name)
        return results

    @torch.inference_mode()
    def end(self, names: Sequence[str]) -> None:
        """End streams ``names`` without waiting for their finals. With spare slots (``pass_slots``), each one's
        slot is free at once (:attr:`free`) and its final pass starts in a spare slot, first ended first, at the
        next :meth:`update` (or :meth:`advance`) that has one free (:data:`FINAL_AUDIO_S_PER_RUN` seconds of
        audio a run at most); without, it starts in its own slot at the next. It is prefilled there and decoded
        beside the updates of the others, riding along their steps rather than taking steps of its own; its
        final comes back, ``final=True``, from the call in which it is done, and frees the slot. The same text
        as :meth:`finish` gives. Its offline front end starts now, on the front-end threads, so that the final's
        start (a decoder run's) waits for it only when nothing else is running."""
        streams = [self._stream(name) for name in names]
        for stream in streams:
            heard = self._heard(stream)
            stream.heard, (stream.prompt_features,) = len(heard), self._later([heard])
            self._ending[stream.name] = self._streams.pop(stream.name)
            if self._pass_slots:
                self._release(stream)
                stream.slot = -1  # none until its final starts
        self._waiting += streams

    @property
    def free(self) -> int:
        """Slots free for streams to open (:meth:`open`)."""
        return len(self._free)

    @torch.inference_mode()
    def _start_finals(self) -> None:
        """Start the final passes of ended streams, first ended first, in their own slots or spare ones while
        one is free, at most :data:`FINAL_AUDIO_S_PER_RUN` seconds of their audio (one stream's at least), and
        only those whose front end is done, unless nothing else would run: then the first one waits for it."""
        budget, starting = FINAL_AUDIO_S_PER_RUN * SAMPLE_RATE, []
        while self._waiting and (self._waiting[0].slot >= 0 or self._spare):
            head = self._waiting[0]
            waits = not head.prompt_features.done() and (starting or self._decoder.busy)  # others run meanwhile
            if waits or (starting and head.heard > budget):
                break
            stream = self._waiting.popleft()
            budget -= stream.heard
            stream.slot = stream.slot if stream.slot >= 0 else self._spare.pop()
            starting.append(stream)
        if not starting:
            return
        rows = self._final_inputs([stream.prompt_features for stream in starting], [stream.slot for stream in starting])
        for stream, row in zip(starting, rows, strict=True):
            budget = self.policy.final_budget(stream.heard)
            self._decoder.add(("final", stream.name), stream.slot, row, budget, finish=False)
            stream.prompt_features = None

    @property
    def short_of_slots(self) -> int:
        """Ended streams whose finals wait for a spare slot while none is free: until finals in flight are done,
        none of them starts (:meth:`advance` steps those, freeing slots sooner than the updates' steps do)."""
        starved = self._waiting and self._waiting[0].slot < 0 and not self._spare
        return len(self._waiting) if starved else 0

    @property
    def ending(self) -> int:
        """Streams ended (:meth:`end`) whose finals are not done yet."""
        return len(self._ending)

    @torch.inference_mode()
    def advance(self, steps: int) -> list[Partial]:
        """Decode the ended streams' finals at most ``steps`` steps further (when no update is due); the finals
        done (by this call or since the last update)."""
        self._run(extra_steps=steps)
        return self._take_ended()

    def _run(self, extra_steps: int = 0) -> dict:
        """Run the decoder; the segment passes it completes are committed, their spare slots freed; the ended
        streams' finals, once their segment passes are in too, go to :attr:`_ended`, their slots freed."""
        self._start_finals()
        done = self._decoder.run(extra_steps)
        for (kind, name), tokens in done.items():
            if kind == "segment":
                stream, index, slot = self._passes.pop(name)
                stream.committed[index] = self.model.answer(tokens, self.language).text
                self.cache.reset(slot)
                self._spare.append(slot)
            elif kind == "final":
                self._ending[name].answer = self.model.answer(tokens, self.language)
        for name in [name for name, s in self._ending.items() if s.answer is not None and name not in self._passes]:
            stream = self._ending.pop(name)
            self._ended.append(self._final(stream, stream.answer))
            self._release(stream)
        return done

    def _take_ended(self) -> list[Partial]:
        ended, self._ended = self._ended, []
        return ended

    def _heard(self, stream: _Stream) -> np.ndarray:
        """The samples of the stream's current segment, its pending ones included (taken from it)."""
        stream.samples.append(stream.pending.take(len(stream.pending)))
        return np.concatenate(stream.samples)

    def _final(self, stream: _Stream, transcript: LLMTranscript) -> Partial:
        language = transcript.language or stream.language
        return Partial(stream.name, self._joined(stream, transcript.text), language, transcript.tokens, True)

    def close(self) -> None:
        """Stop the front-end threads (the streams and the cache stay readable). Idempotent."""
        self.features.close()

    def drop(self, name: str) -> None:
        """End stream ``name`` without a final (its client went away; an ended one's final is dropped): its slot
        is free at once."""
        if name in self._ending:
            stream = self._ending.pop(name)
            if stream.prompt_features is not None:
                stream.prompt_features.cancel()  # its front end unstarted, it never runs
            self._decoder.discard(("final", name))
            self._waiting = deque(waiting for waiting in self._waiting if waiting is not stream)
        else:
            stream = self._streams.pop(self._stream(name).name)
        if name in self._passes:
            self._decoder.discard(("segment", name))
            _, _, slot = self._passes.pop(name)
            self.cache.reset(slot)
            self._spare.append(slot)
        self._release(stream)

    def _release(self, stream: _Stream) -> None:
        """``stream``'s slot (a stream's or a spare one; none while its final waits to start) emptied and free."""
        if stream.slot >= 0:
            self.cache.reset(stream.slot)
            (self._free if stream.slot < self.slots else self._spare).append(stream.slot)

    def _finals(self, streams: list[_Stream], signals: list[np.ndarray]) -> list[LLMTranscript]:
        """The offline answers for whole segments, ``signals[b]`` the samples of ``streams[b]``'s segment (the
        second pass, :meth:`_final_inputs`), decoded greedily all together, beside any ended streams' finals,
        through the decode graphs. The slots end holding the answers: the caller empties them (the stream's
        next segment, or its end). With ``fixed_tokens``, a segment's :meth:`StreamPolicy.final_budget`."""
        slots = [stream.slot for stream in streams]
        for stream, row, signal in zip(streams, self._final_inputs(self._later(signals), slots), signals, strict=True):
            self._decoder.add(("pass", stream.name), stream.slot, row, self.policy.final_budget(len(signal)))
        done = self._run()
        return self.model.answers([done[("pass", stream.name)] for stream in streams], self.language)

    def _later(self, signals: list[np.ndarray]) -> list[Future]:
        """Each segment's offline front end, started now on the front-end threads (``StreamFeatures.batch_later``)."""
        return [self.features.batch_later([signal]) for signal in signals]

    def _final_inputs(self, features: list[Future], slots: list[int]) -> list[torch.Tensor]:
        """Each segment's whole prompt from its offline front end (``features``: :meth:`_later`'s) and the encoder
        (:meth:`AudioLM.feature_prompts`, at most :data:`FINAL_ROWS` segments a call), the slot it is decoded in
        emptied for it."""
        inputs: list[torch.Tensor] = []
        for start in range(0, len(features), FINAL_ROWS):
            batch = joined([future.result() for future in features[start : start + FINAL_ROWS]])
            inputs += self.model.feature_prompts(*batch, self.parts)
        self.cache.reset(slots)
        return inputs
