"""Render ``MODEL_CARD.md`` from the training and evaluation reports, and the card the model file carries.

``python -m recipes.ctc_small.card --train STAGE.json [...] TRAIN.json --eval EVAL.json [EVAL_CPU.json ...]
[--unseen-engines EVAL.json ...] --out audiomask/assets/MODEL_CARD.md``: the train reports of each training
stage in order (the model's last), the eval reports (the training device's first; each further one adds a
latency column), and optionally eval reports of engines the model never heard (``evaluate --split train``).

:func:`model_card_metadata` is the ``card`` metadata :mod:`recipes.ctc_small.train` stores in the model file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from recipes.ctc_small.cli import run_step, step_parser

__all__ = ["main", "model_card_metadata", "render_card", "target_verdicts"]

OFFLINE_CER_TARGET = 0.05  # held-out CER offline (full attention) the model aims at ...
STREAMING_CER_TARGET = 0.08  # ... and streaming at the default chunk size


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


def word_weighting(corpus: dict) -> str:
    """How :mod:`recipes.ctc_small.corpus` weighted the words of ``corpus`` (its ``corpus.json``), for the card."""
    frequency = corpus.get("frequency_text")
    if not frequency:
        return "shorter ones more often"
    return (
        f"each as often as in {frequency['word_tokens_counted']:,} words of English text ("
        + ", ".join(f"`{path}`" for path in frequency["paths"])
        + f"; {frequency['words_seen']:,} of the words occur there, the others get a count of "
        f"{frequency['unseen_word_count']})"
    )


def stage_table(stages: dict[str, dict]) -> list[str]:
    """The card's lines on how the training stages of ``stages`` (:func:`render_card`) chained, if several."""
    if len(stages) < 2:
        return []
    lines = [
        "",
        f"The weights come from {len(stages)} training stages, each started from the previous stage's model file "
        "(`--init`); the last is the run above. Its report is in `bench/results/`, the earlier stages' in git history (`recipes/ctc_small/README.md`):",
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


def unseen_engine_lines(reports: dict[str, dict], default_ms: int) -> list[str]:
    """The card's table of engines the model never heard (eval reports of their corpora), per voice."""
    if not reports:
        return []
    lines = [
        "",
        "Engines never trained on (their whole corpus, `recipes.ctc_small.evaluate --split train`; report in "
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
    model was never trained on (``evaluate --split train``), per voice.
    """
    train_report = list(stages.values())[-1]
    config, corpus, training = train_report["config"], train_report["corpus"], train_report["training"]
    model = train_report["model"]
    main = eval_reports[0]
    default_ms = config["default_chunk_ms"]
    lines = [
        "# ctc-small: audiomask's streaming Conformer-CTC model",
        "",
        "Generated by `python -m recipes.ctc_small.card` from the training and evaluation reports in",
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
        + " at random speeds and pitches (`recipes.ctc_small.corpus`):",
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
        f"Targets (offline CER <= {100 * OFFLINE_CER_TARGET:.0f} %, streaming CER <= "
        f"{100 * STREAMING_CER_TARGET:.0f} % at the default {default_ms} ms chunk):",
        "",
        *[f"- {line}" for line in target_verdicts(main["results"], default_ms)],
        *unseen_engine_lines(unseen_engines or {}, default_ms),
        "",
        "## Latency per chunk size",
        "",
        "One stream of 30 s of held-out speech fed chunk by chunk (`recipes.ctc_small.evaluate.chunk_latency`): compute is the "
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


def read_report(option: str, path: Path) -> dict:
    """The JSON report at ``path``; one that cannot be read or parsed is a ``ValueError`` naming ``option``."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{option} {str(path)!r}: not a readable JSON report ({error})") from None


def write_card(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Read the reports ``args`` names and write MODEL_CARD.md to ``args.out`` (which names its inputs, not ``argv``)."""
    stages = {Path(path).name: read_report("--train", path) for path in args.train}
    eval_reports = [read_report("--eval", path) for path in args.eval]
    unseen = {Path(path).name: read_report("--unseen-engines", path) for path in args.unseen_engines}
    args.out.write_text(render_card(stages, eval_reports, unseen))
    print(f"wrote {args.out}")
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options of ``python -m recipes.ctc_small.card``."""
    parser = step_parser(__spec__.name, __doc__)
    parser.add_argument(
        "--train", type=Path, nargs="+", required=True, help="train reports of each stage in order, the model's last"
    )
    parser.add_argument("--eval", type=Path, nargs="+", required=True, help="eval reports, the training device's first")
    parser.add_argument(
        "--unseen-engines",
        type=Path,
        nargs="*",
        default=[],
        help="eval reports (--split train) of corpora of engines the model was never trained on",
    )
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the step with ``argv`` (default: the command line); a bad input exits with a message naming it."""
    return run_step(write_card, parse_args, argv, "card")


if __name__ == "__main__":
    sys.exit(main())
