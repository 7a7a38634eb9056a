"""Train ctc-small (one stage), save the model file, and evaluate it on the corpus's held-out split.

``python -m recipes.ctc_small.train --corpus DIR --out DIR [--device cuda] (--deadline UNIX_S | --steps N)
[--init FILE] ...`` writes ``OUT/ctc-small.safetensors``, ``OUT/train.json`` and ``OUT/eval.json``.

Model: :class:`audiomask.models.Phi4MMEncoder` of the library's shipped
architecture (:data:`recipes.ctc_small.config.ARCHITECTURE`: 40 ms tokens,
25 a second against ~15 characters a second of speech, so CTC has room for
its blanks), and a :class:`audiomask.models.ctc.CTCHead` over the characters
of :data:`recipes.ctc_small.corpus.ALPHABET`.

Training: features of every training utterance of a
:mod:`recipes.ctc_small.corpus` corpus, clean and augmented (speed, volume,
noise: :func:`recipes.ctc_small.augment.augment`), computed in worker
processes; then CTC training with dynamic chunk masks (WeNet style: each batch
draws full attention, or a chunk of 4-32 tokens with 1-16 chunks of left
context or all of it), so one model serves every streaming latency; mel
warping, spectral tilt and SpecAugment on the device; AdamW with warm-up and
cosine decay; an exponential moving average (EMA) of the weights is what is
saved and evaluated. Training runs a fixed ``--steps``, or as many as fit
before ``--deadline`` minus the evaluation's reserve (measured on the first
steps and recorded, so ``--steps`` reproduces the run). The model file
(:func:`audiomask.asr.checkpoint.save_model`, float16) is written every
:data:`CHECKPOINT_EVERY_S` seconds and at the end; the evaluation
(:func:`recipes.ctc_small.evaluate.evaluate`) then reloads it, so the figures
are those of the shipped weights.
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

from audiomask.asr.checkpoint import load_model, model_info, save_model
from audiomask.asr.decoding import BLANK_ID, CharTokenizer
from audiomask.asr.model import ASRModel
from audiomask.bench.environment import write_result
from audiomask.constants import FRAMES_PER_SECOND
from audiomask.masks.phi4mm import subsampled_lengths
from audiomask.models import Phi4MMEncoder
from audiomask.models.ctc import CTCHead
from audiomask.transfer import to_device
from recipes.ctc_small.augment import spec_augment, tilt_spectrum, warp_mel
from recipes.ctc_small.card import model_card_metadata
from recipes.ctc_small.cli import check_counts, recorded_environment, run_step, step_parser
from recipes.ctc_small.config import MODEL_SIZES, TrainConfig
from recipes.ctc_small.corpus import ALPHABET
from recipes.ctc_small.data import (
    Batcher,
    DeviceFeatures,
    compute_features,
    ctc_feasible,
    read_manifest,
    split_features,
)
from recipes.ctc_small.evaluate import evaluate_to_file, summary_table

__all__ = ["build_model", "continue_from", "ctc_loss", "draw_chunking", "learning_rate", "main", "planned_steps"]

MODEL_FILE = "ctc-small.safetensors"

# Time keeping.
SPEED_PROBE_STEPS = 40  # steps timed (after PROBE_SKIP_STEPS) to plan a deadline-bound run
PROBE_SKIP_STEPS = 10  # first steps: allocator and kernel warm-up
PLAN_SAFETY = 0.92  # of the time left that the planned steps may take
EVAL_RESERVE_S = 90  # kept for the evaluation and the final save before --deadline
LOG_EVERY_S = 15.0
CHECKPOINT_EVERY_S = 60.0


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


def run_config(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` the command line asks for: the shipped defaults with its overrides."""
    return TrainConfig(
        seed=args.seed,
        feature_copies=args.copies,
        batch_audio_s=args.batch_audio_s,
        peak_lr=args.peak_lr,
        **({} if args.model_size is None else MODEL_SIZES[args.model_size]),
    )


def training_device(name: str) -> torch.device:
    """``--device`` as a device, with TF32 matmuls on CUDA; CUDA asked for where there is none is a ``ValueError``."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available here (--device cpu trains on the CPU)")
    if device.type == "cuda":  # TF32 matmuls: float32 training at tensor-core speed (bf16 would round the masks)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


def augmented_batch(
    config: TrainConfig,
    store: DeviceFeatures,
    members: np.ndarray,
    fill: torch.Tensor,
    rng: np.random.Generator,
) -> tuple[torch.Tensor, np.ndarray]:
    """Copies ``members`` as a ``(B, T, 80)`` float32 batch on the device, mel-warped, tilted and SpecAugmented.

    Returns it with its ``(B,)`` frame lengths (host). ``fill`` ``(80,)``: what SpecAugment writes.
    """
    device = store.frames.device
    inputs, lengths = store.batch(members)
    factors = to_device(rng.uniform(*config.mel_warp, len(members)).astype(np.float32), device)
    tilts = to_device(rng.uniform(*config.spectral_tilt_db, len(members)).astype(np.float32), device)
    inputs = tilt_spectrum(warp_mel(inputs, factors), to_device(lengths, device), tilts)
    return spec_augment(config, inputs, lengths, fill, rng), lengths


def train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Train, save and evaluate as ``args`` asks; ``argv`` is recorded in the reports as the command."""
    started = time.time()
    config = run_config(args)
    device = training_device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    utterances = read_manifest(args.corpus)
    corpus = json.loads((args.corpus / "corpus.json").read_text())
    training = [u for u in utterances if u.split == "train"]
    held_out = [u for u in utterances if u.split == "eval"]
    report = {
        "environment": recorded_environment(__spec__.name, argv),
        "config": dataclasses.asdict(config),
        "corpus": corpus,
    }

    tick = time.time()
    features = compute_features(training, config.feature_copies, config.seed, args.workers)
    eval_features = compute_features(held_out, 1, config.seed, args.workers, augmented=False)
    tokenizer = CharTokenizer(ALPHABET)
    labels = [tokenizer.encode(u.text) for u in training]
    tokens = subsampled_lengths(features.lengths, config.time_reduction)
    usable = np.array([ctc_feasible(labels[item], int(n)) for item, n in zip(features.items, tokens)])
    print(
        f"{time.time() - started:7.1f} s features: {len(features.lengths)} copies "
        f"({features.lengths.sum() / FRAMES_PER_SECOND / 3600:.2f} h) in {time.time() - tick:.1f} s; "
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
    batch_frames = int(config.batch_audio_s * FRAMES_PER_SECOND)
    batcher = Batcher(features.lengths[kept], batch_frames, config.seed)
    rng = np.random.default_rng(config.seed)
    train_end = None if args.deadline is None else args.deadline - args.eval_reserve_s
    total_steps = args.steps
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
            inputs, lengths = augmented_batch(config, store, members, fill, rng)
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
                    raise ValueError(f"the loss is not finite at step {step} ({mean_loss})")
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
    results = evaluate_to_file(
        shipped,
        held_out,
        split_features(eval_features),
        device,
        config.eval_chunk_ms,
        config.default_left_chunks,
        config.default_chunk_ms,
        batch_frames,
        args.out / "eval.json",
        {"environment": recorded_environment(__spec__.name, argv), "model": report["model"]},
    )
    card["held_out"] = summary_table(results, config.default_chunk_ms)
    save(shipped, path, config, card)
    print(f"{time.time() - started:7.1f} s done", flush=True)
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options of ``python -m recipes.ctc_small.train``; a count below 1 is a usage error."""
    parser = step_parser(__spec__.name, __doc__)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="optimizer steps")
    budget.add_argument(
        "--deadline",
        type=float,
        help="unix time by which training and evaluation end (training stops --eval-reserve-s before)",
    )
    parser.add_argument("--workers", type=int, default=1, help="feature processes")
    parser.add_argument(
        "--copies", type=int, default=TrainConfig.feature_copies, help="feature copies of each training utterance"
    )
    parser.add_argument("--batch-audio-s", type=float, default=TrainConfig.batch_audio_s)
    parser.add_argument("--model-size", choices=sorted(MODEL_SIZES), help="a smaller architecture (tests)")
    parser.add_argument(
        "--eval-reserve-s", type=float, default=EVAL_RESERVE_S, help="with --deadline: seconds kept for the evaluation"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak-lr", type=float, default=TrainConfig.peak_lr)
    parser.add_argument("--init", type=Path, help="a model file to continue training (same architecture)")
    parser.add_argument(
        "--profile-steps", type=int, default=0, help="profile this many steps after the speed probe (profile.txt)"
    )
    args = parser.parse_args(argv)
    check_counts(parser, args, ("steps", "workers", "copies"))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the step with ``argv`` (default: the command line); a bad input exits with a message naming it."""
    return run_step(train, parse_args, argv, "train")


if __name__ == "__main__":
    sys.exit(main())
