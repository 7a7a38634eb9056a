"""``audiomask info``: the model, device, versions and streaming settings, and the training stages of its card."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

import audiomask
from audiomask.checks import pick_device
from audiomask.cli.common import EXIT_OK, write_line
from audiomask.cli.transcribe import TRANSCRIBE_THREADS
from audiomask.constants import FRAME_MS

__all__ = ["info"]

MODEL_CARD_NAME = "MODEL_CARD.md"  # the card beside a model file (recipes.ctc_small.card writes the shipped one's)


def _summary(value: object, limit: int = 100) -> str:
    """A card value on one line: scalars as they are, the rest as compact JSON, cut at ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


# One row of a model card's training-stage table: the stage's report file, steps and seconds.
_Stage = NamedTuple("_Stage", [("report", str), ("steps", int), ("seconds", float)])


def _training_stages(card_file: Path) -> list[_Stage]:
    """The rows of the ``| stage | report | steps | seconds | ...`` table of ``card_file``, in order; ``[]`` if none."""
    stages: list[_Stage] = []
    columns = None
    try:
        for line in card_file.read_text(encoding="utf-8").splitlines():
            cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
            if columns is None:
                columns = cells if cells[:2] == ["stage", "report"] else None
            elif not line.startswith("|"):
                break
            elif cells[0].isdigit():  # a stage, not the |---| line under the header
                row = dict(zip(columns, cells))
                stages.append(_Stage(row["report"], int(row["steps"].replace(",", "")), float(row["seconds"])))
    except (OSError, UnicodeDecodeError, KeyError, ValueError):  # no card, or a table of another shape
        return []
    return stages


def _card_lines(card: dict, stages: Sequence[_Stage] = ()) -> Iterator[str]:
    """``key: value`` lines of a model card; the fields ``recipes.ctc_small.train`` writes are spelled out.

    ``stages``: the training stages of the card file beside the model; when the
    last is the card's own training, every stage is listed.

    >>> list(_card_lines({"held_out": {"flite": {"offline_full": {"cer": 0.2309}, "streaming_320ms": {"cer": 0.29}}}}))
    ['held_out: flite CER 23.09 % offline, 29.00 % streaming 320 ms']
    >>> list(_card_lines({"training": {"steps": 2664, "train_s": 359.8}, "data": "none: random weights"}))
    ['training: 2,664 steps in 360 s', 'data: none: random weights']
    >>> list(_card_lines({"training": {"steps": 20, "train_s": 3.4}}, [_Stage("a.json", 10, 5), _Stage("b.json", 20, 3)]))
    ['training: 30 steps in 8 s, in 2 stages', '  stage 1: 10 steps in 5 s (a.json)', '  stage 2: 20 steps in 3 s (b.json)']
    >>> list(_card_lines({"data": {"splits": {"train": {"a": {"utterances": 3, "hours": 1.0}}}}}))
    ['data: 3 training utterances (1.0 h: a), 0 held out']
    """
    for key, value in card.items():
        try:
            if key == "held_out":
                rates = []
                for engine, modes in value.items():
                    streaming = next(mode for mode in modes if mode.startswith("streaming_"))
                    ms = streaming.removeprefix("streaming_").removesuffix("ms")
                    rates.append(
                        f"{engine} CER {100 * modes['offline_full']['cer']:.2f} % offline, "
                        f"{100 * modes[streaming]['cer']:.2f} % streaming {ms} ms"
                    )
                yield f"{key}: {'; '.join(rates)}"
                continue
            if key == "training" and stages and stages[-1].steps == value["steps"]:  # the card file is this model's
                total_s = sum(stage.seconds for stage in stages)
                yield f"{key}: {sum(stage.steps for stage in stages):,} steps in {total_s:.0f} s, in {len(stages)} stages"
                for number, stage in enumerate(stages, 1):
                    yield f"  stage {number}: {stage.steps:,} steps in {stage.seconds:.0f} s ({stage.report})"
                continue
            if key == "training":
                yield f"{key}: {value['steps']:,} steps in {value['train_s']:.0f} s"
                continue
            if key == "data":
                train, held = value["splits"]["train"], value["splits"].get("eval", {})
                hours = sum(entry["hours"] for entry in train.values())
                yield (
                    f"{key}: {sum(entry['utterances'] for entry in train.values()):,} training utterances "
                    f"({hours:.1f} h: {', '.join(train)}), "
                    f"{sum(entry['utterances'] for entry in held.values()):,} held out"
                )
                continue
        except (AttributeError, KeyError, StopIteration, TypeError, ValueError):
            pass  # a card of another shape: shown as it is
        yield f"{key}: {_summary(value)}"


def _llm_lines(path: str) -> Iterator[str]:
    """The model and streaming lines of an LLM checkpoint directory (read from its files, no weight loaded)."""
    from audiomask.llm.checkpoint import describe
    from audiomask.llm.streaming import StreamPolicy

    described = describe(path)
    yield "model"
    yield f"  {'path':<12}{path}"
    for key, value in described.items():
        yield f"  {key:<16}{f'{value:,}' if isinstance(value, int) else value}"
    policy = StreamPolicy()
    yield "settings"
    yield f"  {'chunk_ms':<12}{round(policy.chunk_s * 1000)} (a partial per chunk: --chunk-ms)"
    yield f"  {'rollback':<12}{policy.unfixed_tokens} tokens re-decoded, none for the first {policy.unfixed_chunks} chunks"


def _info_lines(args: argparse.Namespace) -> Iterator[str]:
    import torch
    import torchaudio

    from audiomask.asr.checkpoint import model_info
    from audiomask.llm.checkpoint import is_llm_checkpoint

    device = pick_device(args.device, "--device")
    yield "versions"
    for name, version in (
        ("audiomask", audiomask.__version__),
        ("torch", torch.__version__),
        ("torchaudio", torchaudio.__version__),
        ("numpy", np.__version__),
        ("python", platform.python_version()),
    ):
        yield f"  {name:<12}{version}"
    yield "device"
    cuda = device.startswith("cuda")
    yield f"  {'name':<12}{device} ({torch.cuda.get_device_name(device) if cuda else f'{os.cpu_count()} cores'})"
    if args.model is not None and is_llm_checkpoint(args.model):
        yield from _llm_lines(args.model)
        return
    info = model_info(args.model)
    config = info["encoder_config"]
    yield "model"
    yield f"  {'path':<12}{info['path']} ({info['size_bytes'] / 2**20:.1f} MiB, {'/'.join(info['dtypes'])})"
    yield f"  {'format':<12}{info['format']}"
    yield (
        f"  {'encoder':<12}Phi-4MM Conformer: {config['num_blocks']} blocks of {config['hidden_size']}, "
        f"{config['num_attention_heads']} heads, feed-forward {config['intermediate_size']}, "
        f"{config['time_reduction'] * FRAME_MS} ms per token"
    )
    yield f"  {'parameters':<12}{info['parameters']:,}"
    yield f"  {'alphabet':<12}{len(info['alphabet'])} characters + blank: {info['alphabet']!r}"
    card_file = Path(info["path"]).with_name(MODEL_CARD_NAME)
    stages = _training_stages(card_file)
    for index, line in enumerate(_card_lines(info["card"] or {"(none)": ""}, stages)):
        yield f"  {'card' if index == 0 else '':<12}{line}"
    if card_file.is_file():  # the shipped model's: every training stage, error rates per chunk size
        yield f"  {'':<12}the whole card: {card_file}"
    yield "settings"
    chunk = info["chunk_ms"]
    yield f"  {'chunk_ms':<12}{chunk if chunk is not None else 'none (give --chunk-ms: the model attends fully)'}"
    left = info["left_chunks"]
    context = f" ({left * chunk} ms of left context)" if chunk is not None else ""
    yield f"  {'left_chunks':<12}{left}{context}"
    yield f"  {'threads':<12}{TRANSCRIBE_THREADS} (torch threads of transcribe: --threads)"


def info(args: argparse.Namespace) -> int:
    """Print the lines of ``audiomask info`` as they are produced: a bad model still shows the versions and device."""
    for line in _info_lines(args):
        write_line(sys.stdout, line)
    return EXIT_OK
