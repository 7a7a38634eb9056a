#!/usr/bin/env python3
"""Train audiomask's shipped streaming Conformer-CTC model, evaluate it, and write its model card.

Model: :class:`audiomask.models.Phi4MMEncoder` (a Phi-4MM-style Conformer,
small: :class:`TrainConfig` has the sizes) with
``time_reduction`` 4 (40 ms tokens: 25 a second, against
~15 characters a second of speech, so CTC has room for its blanks), and a
:class:`audiomask.asr.decoding.CTCHead` over the characters of ``make_corpus.ALPHABET``.

Training (``train``): features of every training utterance of a
``scripts/make_corpus.py`` corpus, clean and augmented (speed, volume, noise:
``_train_data.augment``), computed in worker processes; then CTC training with
dynamic chunk masks (WeNet style: each batch draws full attention, or a chunk
of 4-32 tokens with 1-16 chunks of left context
or all of it), so one model serves every streaming latency; SpecAugment on the
device; AdamW with warm-up and cosine decay; an exponential moving average
(EMA) of the weights is what is saved and evaluated. Training runs a fixed
``--steps``, or as many as fit before ``--deadline`` minus the evaluation's
reserve (measured on the first steps and recorded, so ``--steps`` reproduces
the run). The model file (:func:`audiomask.asr.checkpoint.save_model`, float16) is
written every :data:`CHECKPOINT_EVERY_S` seconds and at the end; the
evaluation then reloads it, so the figures are those of the shipped weights.

Evaluation (``train``, or ``eval`` for a model file): CER/WER on the corpus's
held-out split (voices and sentences never trained on) per engine, offline
(full attention; hard chunk masks) and streaming through
:class:`audiomask.asr.recognizer.StreamingRecognizer` at 160, 320, 640 and 1280 ms, and
single-stream latency per chunk size (``_train_eval``).

Subcommands:
  train --corpus DIR --out DIR [--device cuda] [--deadline UNIX_S | --steps N]
        -> OUT/ctc-small.safetensors, OUT/train.json, OUT/eval.json
  eval  --corpus DIR --model FILE --out FILE.json [--device cpu] [--limit N] [--split train]
  card  --train [stage1.json ...] train.json --eval eval.json [eval_cpu.json ...] --out audiomask/assets/MODEL_CARD.md

The shipped model (H200; the corpus made in the same call):
  python3 scripts/make_corpus.py --out /tmp/corpus --hours 32 --workers 16 ... (see make_corpus.py)
  python3 scripts/train_ctc.py train --corpus /tmp/corpus --out $OUT --device cuda --workers 16 --deadline $END
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, installed or not
sys.path.insert(0, str(ROOT / "scripts"))

from _benchenv import capture_environment, write_result  # noqa: E402
from _train_data import Batcher, FeatureSet, Utterance, compute_features, ctc_feasible, read_manifest  # noqa: E402
from _train_eval import evaluate  # noqa: E402
from make_corpus import ALPHABET  # noqa: E402

from audiomask.asr.checkpoint import load_model, model_info, save_model  # noqa: E402
from audiomask.asr.decoding import BLANK_ID, CharTokenizer  # noqa: E402
from audiomask.asr.model import ASRModel  # noqa: E402
from audiomask.constants import FRAME_MS
from audiomask.masks.phi4mm import subsampled_lengths  # noqa: E402
from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder  # noqa: E402
from audiomask.models.ctc import CTCHead
from audiomask.transfer import to_device  # noqa: E402

MODEL_FILE = "ctc-small.safetensors"
FRAMES_PER_S = 1000 // FRAME_MS  # 100 feature frames a second

# Time keeping.
SPEED_PROBE_STEPS = 40  # steps timed (after PROBE_SKIP_STEPS) to plan a deadline-bound run
PROBE_SKIP_STEPS = 10  # first steps: allocator and kernel warm-up
PLAN_SAFETY = 0.92  # of the time left that the planned steps may take
EVAL_RESERVE_S = 90  # kept for the evaluation and the final save before --deadline
LOG_EVERY_S = 15.0
CHECKPOINT_EVERY_S = 60.0
EVAL_MAX_STREAMS = 64  # streams sharing each encoder step in the streaming evaluation
OFFLINE_CER_TARGET = 0.05  # issue 6, acceptance 2: held-out CER offline ...
STREAMING_CER_TARGET = 0.08  # ... and streaming at the default chunk size


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run (recorded in train.json); the defaults are the shipped model's."""

    # Model: a small Phi-4MM Conformer (the released one is 1024 wide, 24 blocks, 8 frames a token).
    hidden_size: int = 192
    intermediate_size: int = 512  # units of each feed-forward GLU
    num_blocks: int = 6
    num_heads: int = 4
    conv_kernel_tokens: int = 9  # causal depthwise conv of each block: 8 past tokens (320 ms)
    subsampling_channels: int = 64  # conv subsampling width: small keeps the CPU real-time factor low
    time_reduction: int = 4  # feature frames per token: 40 ms tokens
    bias_max_distance_tokens: int = 128  # relative-position bias clipped at 5.12 s: all buckets seen on <= 10 s clips
    # Streaming defaults stored in the model file, and the evaluated chunk sizes.
    default_chunk_ms: int = 320
    default_left_chunks: int = 8  # 2.56 s of left context at the default chunk
    eval_chunk_ms: tuple[int, ...] = (160, 320, 640, 1280)
    # Dynamic chunk training, drawn per batch.
    full_attention_share: float = 0.25
    chunk_tokens: tuple[int, int] = (4, 32)  # inclusive, uniform: 160-1280 ms
    all_left_share: float = 0.5  # of chunked batches: all the left context; the others draw left_chunks
    left_chunks: tuple[int, int] = (1, 16)  # inclusive, uniform
    # Optimisation.
    peak_lr: float = 2e-3
    warmup_steps: int = 300  # at most; a tenth of the steps when there are fewer than 3000
    final_lr_share: float = 0.02  # cosine decay from peak_lr down to this share of it
    weight_decay: float = 1e-2
    adam_betas: tuple[float, float] = (0.9, 0.98)
    grad_clip_norm: float = 5.0
    ema_horizon_share: float = 0.1  # the EMA averages over about this share of the steps
    batch_audio_s: float = 600.0  # padded audio per batch
    feature_copies: int = 2  # of each training utterance: clean, and augmented ones
    # SpecAugment, on the device.
    freq_masks: int = 2
    freq_mask_bins: int = 12  # widest, of 80 mel bins
    time_masks_per_s: float = 0.5
    time_mask_frames: int = 20  # widest: 200 ms (wider hides whole words, which random sentences cannot predict)
    mel_warp: tuple[float, float] = (0.85, 1.18)  # vocal-tract-length perturbation factor, uniform per utterance
    spectral_tilt_db: tuple[float, float] = (-10.0, 10.0)  # top bin minus bottom bin, uniform per utterance
    seed: int = 0

    def encoder_config(self) -> Phi4MMAudioConfig:
        """The encoder architecture; its chunk settings are the streaming defaults."""
        return Phi4MMAudioConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_blocks=self.num_blocks,
            num_attention_heads=self.num_heads,
            ext_pw_out_channel=self.hidden_size,
            depthwise_separable_out_channel=self.hidden_size,
            kernel_size=self.conv_kernel_tokens,
            nemo_conv_channels=self.subsampling_channels,
            time_reduction=self.time_reduction,
            bias_max_distance=self.bias_max_distance_tokens,
            chunk_size=self.default_chunk_ms // (FRAME_MS * self.time_reduction),
            left_chunk=self.default_left_chunks,
        )


def build_model(config: TrainConfig, features: np.ndarray | None = None) -> ASRModel:
    """A freshly initialised model; ``features`` ``(F, 80)``: frames whose per-bin mean and spread normalise the input.

    The relative-position bias starts at zero (no preference for any distance).
    """
    torch.manual_seed(config.seed)
    tokenizer = CharTokenizer(ALPHABET)
    encoder = Phi4MMEncoder(config.encoder_config())
    nn.init.zeros_(encoder.relative_attention_bias_layer.bias_values.weight)
    if features is not None and len(features):
        mean, std = feature_moments(features)
        encoder.encoder_embedding.global_mean.copy_(torch.from_numpy(mean))
        encoder.encoder_embedding.global_invstd.copy_(torch.from_numpy(1.0 / std))
    return ASRModel(encoder, CTCHead(config.hidden_size, tokenizer.vocab_size), tokenizer)


def feature_moments(frames: np.ndarray, block: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin mean and standard deviation (float32, floored at 1e-3) of ``(F, 80)`` frames, summed in float64."""
    total = np.zeros(frames.shape[1])
    squares = np.zeros(frames.shape[1])
    for start in range(0, len(frames), block):
        part = frames[start : start + block].astype(np.float64)
        total += part.sum(0)
        squares += (part**2).sum(0)
    mean = total / len(frames)
    std = np.sqrt(np.maximum(squares / len(frames) - mean**2, 1e-6))
    return mean.astype(np.float32), std.astype(np.float32)


def learning_rate(config: TrainConfig, step: int, total_steps: int) -> float:
    """Linear warm-up to ``peak_lr``, then cosine decay to ``final_lr_share * peak_lr`` at ``total_steps``."""
    warmup = min(config.warmup_steps, max(1, total_steps // 10))
    if step < warmup:
        return config.peak_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    floor = config.final_lr_share
    return config.peak_lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def draw_chunking(config: TrainConfig, rng: np.random.Generator, tokens: int) -> tuple[int, int]:
    """``(chunk_size, left_chunk)`` of one batch of ``tokens`` tokens: full attention is ``(-1, 0)``."""
    if rng.random() < config.full_attention_share:
        return -1, 0
    chunk = int(rng.integers(config.chunk_tokens[0], config.chunk_tokens[1] + 1))
    if rng.random() < config.all_left_share:
        return chunk, max(1, -(-tokens // chunk))
    return chunk, int(rng.integers(config.left_chunks[0], config.left_chunks[1] + 1))


def spec_augment(
    config: TrainConfig, features: torch.Tensor, lengths: np.ndarray, fill: torch.Tensor, rng: np.random.Generator
) -> torch.Tensor:
    """``features`` ``(B, T, 80)`` with random mel bands and short time spans set to ``fill`` ``(80,)`` (the mean).

    Per utterance: ``freq_masks`` bands of up to ``freq_mask_bins`` bins, and a Poisson number (``time_masks_per_s``
    a second) of spans of up to ``time_mask_frames`` frames. Drawn on the host in a few vector calls.
    """
    batch, frames, bins = features.shape
    widths = rng.integers(0, config.freq_mask_bins + 1, (batch, config.freq_masks))
    starts = rng.integers(0, bins - widths + 1)
    band_index = np.arange(bins)[None, None, :]
    bands = ((band_index >= starts[..., None]) & (band_index < (starts + widths)[..., None])).any(axis=1)
    counts = rng.poisson(config.time_masks_per_s * lengths / FRAMES_PER_S)
    rows = np.repeat(np.arange(batch), counts)
    widths = rng.integers(0, config.time_mask_frames + 1, len(rows))
    starts = rng.integers(0, np.maximum(1, lengths[rows] - widths))
    edges = np.zeros((batch, frames + 1), np.int64)  # +1 where a span starts, -1 after it ends
    np.add.at(edges, (rows, starts), 1)
    np.add.at(edges, (rows, np.minimum(starts + widths, frames)), -1)
    spans = np.cumsum(edges[:, :frames], axis=1) > 0
    bands, spans = to_device(bands, features.device), to_device(spans, features.device)
    return torch.where(bands[:, None, :] | spans[:, :, None], fill, features)


def warp_mel(features: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Vocal-tract-length perturbation: each utterance's mel axis stretched by its factor, linearly interpolated.

    ``features`` ``(B, T, 80)``, ``factors`` ``(B,)`` on the same device: output bin ``k`` reads input bin
    ``k / factor`` (a factor above 1 moves formants up, as a shorter vocal tract does), clamped to the top bin.

    >>> ramp = torch.arange(4.0).expand(1, 2, 4)
    >>> warp_mel(ramp, torch.tensor([2.0]))[0, 0].tolist()
    [0.0, 0.5, 1.0, 1.5]
    """
    bins = features.shape[-1]
    source = (torch.arange(bins, device=features.device) / factors[:, None]).clamp(max=bins - 1)  # (B, 80)
    low = source.floor().long()
    high = (low + 1).clamp(max=bins - 1)
    weight = (source - low)[:, None, :]
    index = low[:, None, :].expand(-1, features.shape[1], -1)
    upper = high[:, None, :].expand(-1, features.shape[1], -1)
    return torch.lerp(features.gather(2, index), features.gather(2, upper), weight)


def tilt_spectrum(features: torch.Tensor, lengths: torch.Tensor, tilts_db: torch.Tensor) -> torch.Tensor:
    """A random equaliser: each utterance's log-mel plus a straight line across the mel bins.

    ``features`` ``(B, T, 80)`` natural-log mel power, ``lengths`` ``(B,)``
    frames and ``tilts_db`` ``(B,)`` on the same device: the top bin gains
    ``tilt / 2`` dB and the bottom one loses as much (voices and recording
    chains differ in spectral tilt, and a speaker's fricatives must not be
    told apart by it alone). Padding frames stay as they are.

    >>> out = tilt_spectrum(torch.zeros(1, 2, 80), torch.tensor([1]), torch.tensor([10.0]))
    >>> round(float(out[0, 0, -1] - out[0, 0, 0]), 4), float(out[0, 1].abs().max())  # ln(10): 10 dB
    (2.3026, 0.0)
    """
    bins, frames = features.shape[-1], features.shape[1]
    ramp = torch.linspace(-0.5, 0.5, bins, device=features.device)
    valid = torch.arange(frames, device=features.device)[None, :] < lengths[:, None]  # (B, T)
    offsets = (tilts_db * (math.log(10.0) / 10.0))[:, None] * ramp  # (B, 80), dB of power in natural-log units
    return features + valid[:, :, None] * offsets[:, None, :]


def ctc_loss(
    model: ASRModel,
    features: torch.Tensor,
    lengths: np.ndarray,
    labels: Sequence[Sequence[int]],
    chunk_size: int,
    left_chunk: int,
) -> torch.Tensor:
    """CTC loss per label character of a batch: ``features`` ``(B, T, 80)``, ``lengths`` ``(B,)`` frames (host).

    The lengths go to ``ctc_loss`` as host tensors: it reads them on the host, so device ones would make every
    step wait for the GPU.
    """
    outputs, _ = model.encoder(features, lengths, chunk_size=chunk_size, left_chunk=left_chunk, mask_mode="hard")
    log_probs = model.head(outputs)  # (B, L, V) float32
    targets = to_device(np.concatenate([np.asarray(label, np.int64) for label in labels]), features.device)
    total = F.ctc_loss(
        log_probs.transpose(0, 1),
        targets,
        torch.from_numpy(subsampled_lengths(lengths, model.encoder.config.time_reduction)),
        torch.tensor([len(label) for label in labels], dtype=torch.int64),
        blank=BLANK_ID,
        reduction="sum",
        zero_infinity=True,
    )
    return total / sum(len(label) for label in labels)


class DeviceFeatures:
    """A :class:`FeatureSet`'s frames on the device (float16), gathered into padded batches there."""

    UPLOAD_ROWS = 1 << 20  # frames per host->device copy (160 MiB of float16): within the pinned ring's bound

    def __init__(self, features: FeatureSet, device: torch.device) -> None:
        self.offsets, self.lengths = features.offsets, features.lengths
        self.frames = torch.empty(features.frames.shape, dtype=torch.float16, device=device)
        for start in range(0, len(features.frames), self.UPLOAD_ROWS):
            piece = features.frames[start : start + self.UPLOAD_ROWS]
            to_device(piece, device, out=self.frames[start : start + len(piece)])

    def batch(self, members: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """Copies ``members`` as ``(B, T_max, 80)`` float32 (padding repeats each last frame) and their lengths."""
        lengths = self.lengths[members]
        steps = np.minimum(np.arange(int(lengths.max())), lengths[:, None] - 1)
        index = to_device(self.offsets[members][:, None] + steps, self.frames.device)
        return self.frames[index].float(), lengths


def continue_from(model: ASRModel, path: Path) -> None:
    """Load the weights (and input normalisation) of the model file ``path`` into ``model``, whose
    architecture must be the same."""
    start = load_model(path)
    if dataclasses.replace(start.encoder.config, chunk_size=0, left_chunk=0) != dataclasses.replace(
        model.encoder.config, chunk_size=0, left_chunk=0
    ):
        raise ValueError(f"--init {str(path)!r}: its architecture differs from this run's: {start.encoder.config}")
    model.encoder.load_state_dict(start.encoder.state_dict())
    model.head.load_state_dict(start.head.state_dict())


def profiled_activities(device: torch.device) -> list:
    """What torch.profiler records: the host always, the GPU where training runs on one."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    return activities + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])


def write_profile(profiler: torch.profiler.profile, path: Path, steps: int) -> None:
    """The profiled steps' busiest operators, by device time and by host time, as text."""
    averages = profiler.key_averages()
    device_key = "self_device_time_total" if any(a.self_device_time_total for a in averages) else "self_cpu_time_total"
    text = f"{steps} training steps\n\nby {device_key}\n" + averages.table(sort_by=device_key, row_limit=25)
    text += "\n\nby self_cpu_time_total\n" + averages.table(sort_by="self_cpu_time_total", row_limit=25)
    path.write_text(text)
    print(f"wrote {path}", flush=True)


def synchronized_time(device: torch.device) -> float:
    """``time.time()`` once the device has finished the work queued so far (steps are timed, not enqueued)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.time()


def planned_steps(done: int, step_s: float, seconds_left: float) -> int:
    """Total steps of a deadline-bound run: those done plus what fits in ``seconds_left`` at ``step_s`` each."""
    return max(done + 1, done + int(PLAN_SAFETY * seconds_left / step_s))


def save(model: ASRModel, path: Path, config: TrainConfig, card: dict) -> None:
    """Write the model file: float16 weights, the streaming defaults, ``card``."""
    save_model(
        model,
        path,
        dtype=torch.float16,
        chunk_ms=config.default_chunk_ms,
        left_chunks=config.default_left_chunks,
        card=card,
    )


def train(args: argparse.Namespace) -> int:
    started = time.time()
    config = TrainConfig(
        seed=args.seed,
        feature_copies=args.copies,
        batch_audio_s=args.batch_audio_s,
        peak_lr=args.peak_lr,
        **({} if args.model_size is None else MODEL_SIZES[args.model_size]),
    )
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available here (--device cpu trains on the CPU)")
    if device.type == "cuda":  # TF32 matmuls: float32 training at tensor-core speed (bf16 would round the masks)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    args.out.mkdir(parents=True, exist_ok=True)
    utterances = read_manifest(args.corpus)
    corpus = json.loads((args.corpus / "corpus.json").read_text())
    training = [u for u in utterances if u.split == "train"]
    held_out = [u for u in utterances if u.split == "eval"]
    report = {"environment": capture_environment(sys.argv), "config": dataclasses.asdict(config), "corpus": corpus}

    tick = time.time()
    features = compute_features(training, config.feature_copies, config.seed, args.workers)
    eval_features = compute_features(held_out, 1, config.seed, args.workers, augmented=False)
    tokenizer = CharTokenizer(ALPHABET)
    labels = [tokenizer.encode(u.text) for u in training]
    tokens = subsampled_lengths(features.lengths, config.time_reduction)
    usable = np.array([ctc_feasible(labels[item], int(n)) for item, n in zip(features.items, tokens)])
    print(
        f"{time.time() - started:7.1f} s features: {len(features.lengths)} copies "
        f"({features.lengths.sum() / FRAMES_PER_S / 3600:.2f} h) in {time.time() - tick:.1f} s; "
        f"{int((~usable).sum())} too fast for CTC dropped",
        flush=True,
    )

    model = build_model(config, features.frames)
    if args.init is not None:
        continue_from(model, args.init)
        report["init"] = {"path": str(args.init), "card": model_info(args.init)["card"]}
    model.encoder.to(device).train()
    model.head.to(device).train()
    parameters = [p for module in (model.encoder, model.head) for p in module.parameters()]
    optimizer = torch.optim.AdamW(
        parameters,
        lr=config.peak_lr,
        betas=config.adam_betas,
        weight_decay=config.weight_decay,
        fused=device.type == "cuda",
    )
    store = DeviceFeatures(features, device)
    fill = to_device(model.encoder.encoder_embedding.global_mean.cpu().numpy(), device)
    kept = np.flatnonzero(usable)
    batch_frames = int(config.batch_audio_s * FRAMES_PER_S)
    batcher = Batcher(features.lengths[kept], batch_frames, config.seed)
    rng = np.random.default_rng(config.seed)
    train_end = None if args.deadline is None else args.deadline - args.eval_reserve_s
    total_steps = args.steps if args.steps is not None else None
    both = nn.ModuleDict({"encoder": model.encoder, "head": model.head})
    ema: nn.ModuleDict | None = None  # the exponential moving average of `both`
    ema_update = None
    curve, window, step, epoch = [], [], 0, 0
    train_started = last_log = last_checkpoint = time.time()
    path = args.out / MODEL_FILE
    probe_started = None
    while total_steps is None or step < total_steps:
        batches = batcher.epoch()
        epoch += 1
        for batch in batches:
            if total_steps is not None and step >= total_steps:
                break
            if train_end is not None and time.time() > train_end:
                print(f"deadline: stopping at step {step} of {total_steps}", flush=True)
                total_steps = step
                break
            members = kept[batch]
            inputs, lengths = store.batch(members)
            factors = to_device(rng.uniform(*config.mel_warp, len(members)).astype(np.float32), device)
            tilts = to_device(rng.uniform(*config.spectral_tilt_db, len(members)).astype(np.float32), device)
            inputs = tilt_spectrum(warp_mel(inputs, factors), to_device(lengths, device), tilts)
            inputs = spec_augment(config, inputs, lengths, fill, rng)
            chunk_size, left_chunk = draw_chunking(config, rng, int(inputs.shape[1]) // config.time_reduction + 1)
            lr = learning_rate(config, step, total_steps or config.warmup_steps * 10)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = ctc_loss(
                model, inputs, lengths, [labels[features.items[m]] for m in members], chunk_size, left_chunk
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, config.grad_clip_norm)
            optimizer.step()
            step += 1
            window.append(loss.detach())
            if step == PROBE_SKIP_STEPS:
                probe_started = synchronized_time(device)
            if total_steps is None and step == PROBE_SKIP_STEPS + SPEED_PROBE_STEPS:
                step_s = (synchronized_time(device) - probe_started) / SPEED_PROBE_STEPS
                seconds_left = (train_end - time.time()) if train_end is not None else 0.0
                total_steps = planned_steps(step, step_s, seconds_left)
                print(f"{step_s * 1000:.1f} ms a step: {total_steps} steps planned", flush=True)
            if ema is None and total_steps is not None:
                horizon = max(1.0, config.ema_horizon_share * total_steps)
                ema = copy.deepcopy(both)
                ema_update = get_ema_multi_avg_fn(1.0 - 1.0 / horizon)  # foreach lerp: no host sync per step
            if ema is not None:
                ema_update(list(ema.parameters()), list(both.parameters()), None)
            if args.profile_steps and step == PROBE_SKIP_STEPS + SPEED_PROBE_STEPS:
                profiler = torch.profiler.profile(activities=profiled_activities(device))
                profiler.start()
            if args.profile_steps and step == PROBE_SKIP_STEPS + SPEED_PROBE_STEPS + args.profile_steps:
                synchronized_time(device)
                profiler.stop()
                write_profile(profiler, args.out / "profile.txt", args.profile_steps)
            now = time.time()
            if now - last_log >= LOG_EVERY_S or step == total_steps:
                mean_loss = float(torch.stack(window).mean())
                window = []
                curve.append(
                    {
                        "step": step,
                        "s": round(now - train_started, 1),
                        "loss": round(mean_loss, 4),
                        "lr": lr,
                        "epoch": epoch,
                    }
                )
                print(
                    f"{now - started:7.1f} s step {step}/{total_steps} epoch {epoch} loss {mean_loss:.4f} "
                    f"lr {lr:.2e} chunk {chunk_size} left {left_chunk}",
                    flush=True,
                )
                last_log = now
                if not math.isfinite(mean_loss):
                    raise SystemExit("train_ctc: error: the loss is not finite")
            if ema is not None and now - last_checkpoint >= CHECKPOINT_EVERY_S:
                save(
                    ASRModel(ema["encoder"], ema["head"], tokenizer),
                    path,
                    config,
                    {"status": f"checkpoint at step {step}"},
                )
                last_checkpoint = now
    train_s = time.time() - train_started
    final = ema if ema is not None else both
    report["training"] = {
        "steps": step,
        "planned_steps": total_steps,
        "epochs": epoch,
        "train_s": round(train_s, 1),
        "step_ms": round(1000 * train_s / max(step, 1), 2),
        "feature_copies": len(features.lengths),
        "copies_dropped_infeasible": int((~usable).sum()),
        "train_hours_per_copy": round(float(sum(u.seconds for u in training)) / 3600, 3),
        "curve": curve,
        "reproduce_with": f"--steps {step}",
    }
    card = model_card_metadata(report)
    save(ASRModel(final["encoder"], final["head"], tokenizer), path, config, card)
    report["model"] = {k: v for k, v in model_info(path).items() if k != "card"}
    write_result(args.out / "train.json", report)

    shipped = load_model(path)  # the float16 weights as shipped
    shipped.encoder.to(device)
    shipped.head.to(device)
    eval_report = {"environment": capture_environment(sys.argv), "model": report["model"]}

    def save_partial(results: dict) -> None:
        write_result(args.out / "eval.json", eval_report | {"results": results})

    results = evaluate(
        shipped,
        held_out,
        split_features(eval_features),
        device,
        config.eval_chunk_ms,
        config.default_left_chunks,
        config.default_chunk_ms,
        EVAL_MAX_STREAMS,
        batch_frames,
        save_partial,
    )
    save_partial(results)
    card["held_out"] = summary_table(results, config.default_chunk_ms)
    save(shipped, path, config, card)
    print(f"{time.time() - started:7.1f} s done", flush=True)
    return 0


def split_features(features: FeatureSet) -> list[np.ndarray]:
    """Each copy's ``(T, 80)`` frames as float32, in copy order."""
    return [features.frames[o : o + n].astype(np.float32) for o, n in zip(features.offsets, features.lengths)]


def unseen_engine_lines(reports: dict[str, dict], default_ms: int) -> list[str]:
    """The card's table of engines the model never heard (eval reports of their corpora), per voice."""
    if not reports:
        return []
    lines = [
        "",
        "Engines never trained on (their whole corpus, `train_ctc.py eval --split train`; report in "
        "`bench/results/`), CER in %, per voice:",
        "",
        f"| engine | voice | utterances | offline full | streaming {default_ms} ms | report |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, report in reports.items():
        for engine, entry in report["results"]["engines"].items():
            for voice, offline in entry["by_voice_offline_full"].items():
                streaming = entry["by_voice_streaming_default"][voice]
                lines.append(
                    f"| {engine} | `{voice}` | {offline['utterances']} | {100 * offline['cer']:.2f} | "
                    f"{100 * streaming['cer']:.2f} | `{name}` |"
                )
    return lines


def stage_table(stages: dict[str, dict]) -> list[str]:
    """The card's lines on how the training stages of ``stages`` (:func:`render_card`) chained, if several."""
    if len(stages) < 2:
        return []
    lines = [
        "",
        f"The weights come from {len(stages)} training stages, each started from the previous stage's model file "
        "(`--init`); the last is the run above. Each report is in `bench/results/`:",
        "",
        "| stage | report | steps | seconds | batch s | peak LR | training hours | words | mel warp | spectral tilt dB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, (name, report) in enumerate(stages.items(), 1):
        config, corpus, training = report["config"], report["corpus"], report["training"]
        hours = sum(entry["hours"] for entry in corpus["splits"]["train"].values())
        warp = config.get("mel_warp")
        tilt = config.get("spectral_tilt_db")
        lines.append(
            f"| {number} | `{name}` | {training['steps']:,} | {training['train_s']:.0f} | {config['batch_audio_s']:.0f} | "
            f"{config['peak_lr']} | {hours:.1f} | {'by frequency' if corpus.get('frequency_text') else 'by length'} | "
            f"{f'{warp[0]}-{warp[1]}' if warp else '-'} | {f'{tilt[0]:+.0f} to {tilt[1]:+.0f}' if tilt else '-'} |"
        )
    total_steps = sum(report["training"]["steps"] for report in stages.values())
    total_s = sum(report["training"]["train_s"] for report in stages.values())
    lines += ["", f"In all: {total_steps:,} steps in {total_s:.0f} s of training."]
    return lines


def word_weighting(corpus: dict) -> str:
    """How ``scripts/make_corpus.py`` weighted the words of ``corpus`` (its ``corpus.json``), for the card."""
    frequency = corpus.get("frequency_text")
    if not frequency:
        return "shorter ones more often"
    return (
        f"each as often as in {frequency['word_tokens_counted']:,} words of English text ("
        + ", ".join(f"`{path}`" for path in frequency["paths"])
        + f"; {frequency['words_seen']:,} of the words occur there, the others get a count of "
        f"{frequency['unseen_word_count']})"
    )


def model_card_metadata(report: dict) -> dict:
    """What the model file's ``card`` metadata says about the training."""
    corpus = report["corpus"]
    return {
        "name": "ctc-small",
        "data": {
            "splits": corpus["splits"],
            "held_out": corpus["held_out"],
            "engines": corpus["engines"],
            "wordlist": corpus["wordlist"],
            "frequency_text": corpus.get("frequency_text"),
        },
        "training": {k: report["training"][k] for k in ("steps", "train_s", "feature_copies")},
        "config": report["config"],
        "environment": {k: report["environment"][k] for k in ("date", "torch_version", "gpu")},
    }


def summary_table(results: dict, default_chunk_ms: int) -> dict:
    """Per engine: offline full-attention and default-chunk streaming CER/WER."""
    return {
        engine: {
            "offline_full": {k: entry["offline"]["full"][k] for k in ("cer", "wer")},
            f"streaming_{default_chunk_ms}ms": {
                k: entry["streaming"][str(default_chunk_ms)][k] for k in ("cer", "wer")
            },
        }
        for engine, entry in results["engines"].items()
    }


def evaluate_file(args: argparse.Namespace) -> int:
    """``eval``: a model file on a corpus's ``--split`` (its held-out one by default), on ``--device``."""
    model = load_model(args.model)
    device = torch.device(args.device)
    model.encoder.to(device)
    model.head.to(device)
    held_out: list[Utterance] = []
    for utterance in read_manifest(args.corpus):
        if utterance.split == args.split and (
            args.limit is None or sum(u.engine == utterance.engine for u in held_out) < args.limit
        ):
            held_out.append(utterance)
    features = split_features(compute_features(held_out, 1, 0, args.workers, augmented=False))
    info = model_info(args.model)
    chunk_ms = info["chunk_ms"]
    report = {"environment": capture_environment(sys.argv), "model": {k: v for k, v in info.items() if k != "card"}}

    def save_partial(results: dict) -> None:
        write_result(args.out, report | {"results": results})

    results = evaluate(
        model,
        held_out,
        features,
        device,
        args.chunk_ms or TrainConfig.eval_chunk_ms,
        info["left_chunks"],
        chunk_ms,
        EVAL_MAX_STREAMS,
        int(TrainConfig.batch_audio_s * FRAMES_PER_S),
        save_partial,
    )
    save_partial(results)
    return 0


def machine(report: dict) -> str:
    """The device a report was measured on: the GPU's name, else the CPU's and torch's thread count."""
    environment = report["environment"]
    cpu = f"{environment['cpu_model']} ({environment['cpu_count']} cores), torch threads {environment['torch_threads']}"
    return environment["gpu"] or cpu


def target_verdicts(results: dict, default_chunk_ms: int) -> list[str]:
    """One line per engine: its offline (full attention) and default-chunk streaming CER against the targets.

    >>> rates = {"engines": {"x": {"offline": {"full": {"cer": 0.04}}, "streaming": {"320": {"cer": 0.09}}}}}
    >>> target_verdicts(rates, 320)
    ['x: offline 4.00 % (met), streaming 9.00 % (missed)']
    """
    lines = []
    for engine, entry in results["engines"].items():
        offline, streaming = entry["offline"]["full"]["cer"], entry["streaming"][str(default_chunk_ms)]["cer"]
        lines.append(
            f"{engine}: offline {100 * offline:.2f} % ({'met' if offline <= OFFLINE_CER_TARGET else 'missed'}), "
            f"streaming {100 * streaming:.2f} % ({'met' if streaming <= STREAMING_CER_TARGET else 'missed'})"
        )
    return lines


def render_card(
    stages: dict[str, dict], eval_reports: Sequence[dict], unseen_engines: dict[str, dict] | None = None
) -> str:
    """MODEL_CARD.md from train.json reports and eval.json reports (the first is the training device's).

    ``stages``: report name -> train.json of each training stage, in order,
    each continued from the one before (``--init``); the last made the model.
    ``unseen_engines``: report name -> eval.json of corpora of engines the
    model was never trained on (``eval --split train``), per voice.
    """
    train_report = list(stages.values())[-1]
    config, corpus, training = train_report["config"], train_report["corpus"], train_report["training"]
    model = train_report["model"]
    main = eval_reports[0]
    default_ms = config["default_chunk_ms"]
    lines = [
        "# ctc-small: audiomask's streaming Conformer-CTC model",
        "",
        "Generated by `python scripts/train_ctc.py card` from the training and evaluation reports in",
        "`bench/results/` (each holds the command that made it). Synthetic speech only: see Limits.",
        "",
        "## Model",
        "",
        f"- `audiomask.models.Phi4MMEncoder`: {config['num_blocks']} Conformer blocks, {config['hidden_size']} wide, "
        f"{config['num_heads']} heads, feed-forward {config['intermediate_size']}, causal conv kernel "
        f"{config['conv_kernel_tokens']} tokens, subsampling {config['subsampling_channels']} channels, "
        f"`time_reduction` {config['time_reduction']} ({10 * config['time_reduction']} ms tokens); "
        f"a `CTCHead` over {model['vocab_size'] - 1} characters (`a-z`, apostrophe, space) and the blank.",
        f"- {model['parameters']:,} stored values, float16: {model['size_bytes'] / 2**20:.1f} MiB "
        f"(`{Path(model['path']).name}`, format `{model['format']}`).",
        f"- Streaming defaults: chunks of {model['chunk_ms']} ms, {model['left_chunks']} chunks of left context. "
        "Trained with dynamic chunk masks (each batch: full attention, or chunks of "
        f"{config['chunk_tokens'][0]}-{config['chunk_tokens'][1]} tokens with {config['left_chunks'][0]}-"
        f"{config['left_chunks'][1]} left chunks or all), so every chunk size below uses the same weights.",
        "",
        "## Data",
        "",
        "Random sentences of 4-16 words from Debian's `wamerican` word list (lowercase words and common "
        f"contractions, {corpus['wordlist']['words_used']:,} words, {word_weighting(corpus)}), spoken by "
        + ", ".join(f"{engine} ({version.split('  ')[0]})" for engine, version in corpus["engines"].items())
        + " at random speeds and pitches (`scripts/make_corpus.py`):",
        "",
        "| split | engine | utterances | hours | voices |",
        "| --- | --- | --- | --- | --- |",
    ]
    for split, engines in corpus["splits"].items():
        for engine, entry in engines.items():
            voices = corpus["voices"][engine][split]
            lines.append(f"| {split} | {engine} | {entry['utterances']:,} | {entry['hours']:.2f} | {len(voices)} |")
    held = corpus["held_out"]
    lines += [
        "",
        "Held out (never trained on): every sentence of the eval split, and the voices: espeak-ng variants "
        + ", ".join(f"`{v}`" for v in held["espeak-ng variants"])
        + " with any accent and the accent "
        + ", ".join(f"`{v}`" for v in held["espeak-ng accents"])
        + " with any variant; flite "
        + ", ".join(f"`{v}`" for v in held["flite voices"])
        + ". "
        + ("festival's voices are in training only. " if "festival" in corpus["splits"]["train"] else "")
        + f"Training saw {training['feature_copies']:,} feature copies of the training utterances (one clean, "
        f"{config['feature_copies'] - 1} augmented: speed 0.85-1.15x, gain -15 to +5 dB, colored noise at 5-30 dB SNR "
        "on half), then "
        + (f"mel-axis warping {config['mel_warp'][0]}-{config['mel_warp'][1]} and " if "mel_warp" in config else "")
        + (
            f"spectral tilt {config['spectral_tilt_db'][0]:+.0f} to {config['spectral_tilt_db'][1]:+.0f} dB and "
            if "spectral_tilt_db" in config
            else ""
        )
        + "SpecAugment on the device.",
        "",
        "## Training",
        "",
        f"{training['steps']:,} steps ({training['epochs']} passes over the copies) in {training['train_s']:.0f} s on "
        f"{train_report['environment']['gpu'] or 'the CPU'}, batches of {config['batch_audio_s']:.0f} s of padded "
        f"audio, AdamW (peak {config['peak_lr']}, warm-up, cosine decay), float32 with TF32 matmuls, EMA weights; "
        f"seed {config['seed']}. Command: `{train_report['environment']['command']}` "
        f"(reproduce with `{training['reproduce_with']}`).",
        *stage_table(stages),
        "",
        f"## Held-out error rates ({machine(main)})",
        "",
        "CER / WER in %, corpus-level (edits over reference length). Offline: whole utterances, full attention "
        "or hard chunk masks; streaming: `StreamingRecognizer`, fed chunk by chunk "
        f"({model['left_chunks']} left chunks).",
        "",
        "| engine | utterances | offline full | "
        + " | ".join(f"offline {ms} ms | streaming {ms} ms" for ms in config["eval_chunk_ms"])
        + " |",
        "| --- | --- | --- | " + " | ".join("--- | ---" for _ in config["eval_chunk_ms"]) + " |",
    ]
    for engine, entry in main["results"]["engines"].items():
        full = entry["offline"]["full"]
        cells = [f"{100 * full['cer']:.2f} / {100 * full['wer']:.2f}"]
        for ms in config["eval_chunk_ms"]:
            for mode in ("offline", "streaming"):
                rates = entry[mode].get(str(ms))
                cells.append(f"{100 * rates['cer']:.2f} / {100 * rates['wer']:.2f}" if rates else "-")
        lines.append(f"| {engine} | {full['utterances']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Streaming equals the offline hard-chunk forward up to float rounding (the driver's tests assert it; "
        "the columns above agree to within a few edits).",
        "",
        f"Issue 6 targets (offline CER <= {100 * OFFLINE_CER_TARGET:.0f} %, streaming CER <= "
        f"{100 * STREAMING_CER_TARGET:.0f} % at the default {default_ms} ms chunk):",
        "",
        *[f"- {line}" for line in target_verdicts(main["results"], default_ms)],
        *unseen_engine_lines(unseen_engines or {}, default_ms),
        "",
        "## Latency per chunk size",
        "",
        "One stream of 30 s of held-out speech fed chunk by chunk (`_train_eval.chunk_latency`): compute is the "
        "median per chunk (front end + encoder step + head); latency = chunk + 15 ms front-end look-ahead + "
        "compute; RTF = wall time / audio time.",
        "",
        "| chunk ms | " + " | ".join(f"{machine(r)}: compute ms / latency ms / RTF" for r in eval_reports) + " |",
        "| --- | " + " | ".join("---" for _ in eval_reports) + " |",
    ]
    for ms in config["eval_chunk_ms"]:
        cells = []
        for r in eval_reports:
            found = [x for x in r["results"]["latency"] if x["chunk_ms"] == ms]
            cells.append(
                f"{found[0]['compute_ms_median']:.1f} / {found[0]['latency_ms']:.0f} / {found[0]['rtf']:.3f}"
                if found
                else "-"
            )
        lines.append(f"| {ms} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Limits",
        "",
        f"- Trained and measured on synthetic speech only ({', '.join(corpus['engines'])}): expect far higher "
        "error rates on recorded human speech, accents and noise it has not heard.",
        "- Greedy CTC over characters with no language model: spellings come from the sounds alone, so homophones "
        "and rare words are misspelled.",
        "- Lowercase letters, apostrophe and space only: no digits or punctuation.",
        "- Unheard speakers are its weak point: espeak-ng's hundreds of voices are variants of one formant "
        "synthesiser, and the other engines add only a handful of recorded speakers (flite: kal, awb, slt in "
        "training, rms held out; festival, where used: kal, ked, slt). flite's held-out voice is the test of an "
        "unheard speaker, and the error rates above show how far the model is from the target there.",
        "",
    ]
    return "\n".join(lines)


def write_card(args: argparse.Namespace) -> int:
    """``card``: MODEL_CARD.md from the reports."""
    stages = {Path(path).name: json.loads(Path(path).read_text()) for path in args.train}
    eval_reports = [json.loads(Path(path).read_text()) for path in args.eval]
    unseen = {Path(path).name: json.loads(Path(path).read_text()) for path in args.unseen_engines}
    args.out.write_text(render_card(stages, eval_reports, unseen))
    print(f"wrote {args.out}")
    return 0


MODEL_SIZES = {  # --model-size: smaller architectures for tests and trials
    "tiny": {"hidden_size": 16, "intermediate_size": 16, "num_blocks": 1, "num_heads": 2, "subsampling_channels": 4},
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    trainer = commands.add_parser("train", help="train, save and evaluate")
    trainer.add_argument("--corpus", type=Path, required=True)
    trainer.add_argument("--out", type=Path, required=True)
    trainer.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    budget = trainer.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="optimizer steps")
    budget.add_argument(
        "--deadline",
        type=float,
        help="unix time by which training and evaluation end (training stops --eval-reserve-s before)",
    )
    trainer.add_argument("--workers", type=int, default=1, help="feature processes")
    trainer.add_argument(
        "--copies", type=int, default=TrainConfig.feature_copies, help="feature copies of each training utterance"
    )
    trainer.add_argument("--batch-audio-s", type=float, default=TrainConfig.batch_audio_s)
    trainer.add_argument("--model-size", choices=sorted(MODEL_SIZES), help="a smaller architecture (tests)")
    trainer.add_argument(
        "--eval-reserve-s", type=float, default=EVAL_RESERVE_S, help="with --deadline: seconds kept for the evaluation"
    )
    trainer.add_argument("--seed", type=int, default=0)
    trainer.add_argument("--peak-lr", type=float, default=TrainConfig.peak_lr)
    trainer.add_argument("--init", type=Path, help="a model file to continue training (same architecture)")
    trainer.add_argument(
        "--profile-steps", type=int, default=0, help="profile this many steps after the speed probe (profile.txt)"
    )
    evaluator = commands.add_parser("eval", help="evaluate a model file")
    evaluator.add_argument("--corpus", type=Path, required=True)
    evaluator.add_argument("--model", type=Path, required=True)
    evaluator.add_argument("--out", type=Path, required=True, help="the eval JSON to write")
    evaluator.add_argument("--device", default="cpu")
    evaluator.add_argument("--limit", type=int, help="held-out utterances per engine (default all)")
    evaluator.add_argument(
        "--split",
        choices=("eval", "train"),
        default="eval",
        help="the split to score: train for a corpus the model never saw (another engine's voices)",
    )
    evaluator.add_argument("--chunk-ms", type=int, nargs="+", help=f"chunk sizes (default {TrainConfig.eval_chunk_ms})")
    evaluator.add_argument("--workers", type=int, default=1)
    carder = commands.add_parser("card", help="write MODEL_CARD.md")
    carder.add_argument(
        "--train", type=Path, nargs="+", required=True, help="train reports of each stage in order, the model's last"
    )
    carder.add_argument("--eval", type=Path, nargs="+", required=True, help="eval reports, the training device's first")
    carder.add_argument(
        "--unseen-engines",
        type=Path,
        nargs="*",
        default=[],
        help="eval reports (--split train) of corpora of engines the model was never trained on",
    )
    carder.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for name in ("steps", "workers", "copies", "limit"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return {"train": train, "eval": evaluate_file, "card": write_card}[args.command](args)
    except ValueError as error:
        raise SystemExit(f"train_ctc: error: {error}") from None


if __name__ == "__main__":
    sys.exit(main())
