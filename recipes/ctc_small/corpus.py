"""Synthesise a speech corpus for the CTC model: random sentences spoken by espeak-ng, flite and festival voices.

Text: sentences of :data:`WORDS_PER_SENTENCE` random words from a word list
(Debian's ``wamerican``: ``/usr/share/dict/american-english``), kept to
lowercase a-z plus the common contractions (``don't``, ``we're``), so every
character is in :data:`ALPHABET`. Words a synthesiser would not read as
spelled are dropped (no vowel: ``ft``, ``kg``; roman numerals: ``xiv``).
Words are drawn as often as they occur in English text: with
``--frequency-text`` (Debian's ``fortunes``: ~415,000 words of quotations),
a word's weight is its count there plus :data:`UNSEEN_WORD_COUNT` (add-half
smoothing, so the list's words the text lacks are still heard, ~4 % of the
words said); without it, ``2 ** (-letters / 2)`` (Zipf's law of
abbreviation: short words are the frequent ones). Speech is mostly common
words, so the corpus, like the evaluation split drawn from it, is too.

Voices:

- espeak-ng: an English accent (:data:`ESPEAK_ACCENTS`) with a voice variant
  (its ``!v`` files: ``m1``-``m8``, ``f1``-``f5``, ``klatt``, ``whisper``, ...,
  or none), at a random speed (:data:`ESPEAK_WPM`) and pitch (:data:`ESPEAK_PITCH`).
- flite: its voices (:data:`FLITE_VOICES`), at a random duration stretch; the
  training voices also at a random mean pitch half of the time.
- festival (with ``--engines ... festival``): its English voices
  (:data:`FESTIVAL_VOICES`), at a random duration stretch; training only
  (:data:`FESTIVAL_HELD_OUT_VOICES` is empty: two of its three voices are
  speakers flite already has, and its one new speaker, ked, is worth more in
  training, beside flite's held-out voice, than as a second held-out test).

Held out for evaluation: whole voices AND whole sentences. An evaluation
utterance is a sentence that no training utterance says, spoken by a voice no
training utterance uses: an espeak-ng variant of :data:`ESPEAK_HELD_OUT_VARIANTS`
(with any accent), or the accent :data:`ESPEAK_HELD_OUT_ACCENTS` (with any
variant); a flite voice of :data:`FLITE_HELD_OUT_VOICES`. An engine with no
held-out voice (festival) has no evaluation utterances.

Augmentation (noise, volume, speed) is applied by :mod:`recipes.ctc_small.train`
while it computes features, so the corpus holds each utterance once, as
synthesised (resampled to 16 kHz).

Output in ``--out``: ``wav/<id>.wav`` (16 kHz mono 16-bit PCM),
``manifest.jsonl`` (one utterance a line: ``id``, ``path`` relative to
``--out``, ``text``, ``engine``, ``voice``, ``settings``, ``split``
``"train"``/``"eval"``, ``seconds``) and ``corpus.json`` (the command, the
held-out voices, hours per split and engine, the vocabulary).

Synthesis runs in ``--workers`` processes; the random choices are all made
up front from ``--seed``, so a corpus is the same for any worker count.

Usage (synthesisers installed, or unpacked as ``stage.sh`` beside this file does):
  python -m recipes.ctc_small.corpus --out /tmp/corpus --hours 0.05 --workers 2    # a few minutes of speech
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import hashlib
import json
import multiprocessing
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from audiomask.audio import load
from audiomask.constants import SAMPLE_RATE
from recipes.ctc_small.cli import check_counts, run_step, step_parser

ALPHABET = "abcdefghijklmnopqrstuvwxyz' "  # the CTC model's characters (the blank is extra)
DEFAULT_WORDLIST = "/usr/share/dict/american-english"  # Debian's wamerican
ENGINES = ("espeak-ng", "flite", "festival")
DEFAULT_ENGINES = ("espeak-ng", "flite")  # festival is rarely installed: asked for by name

# Text.
WORDS_PER_SENTENCE = (4, 16)  # inclusive range, drawn uniformly
MAX_WORD_LETTERS = 9  # longer words are rarer, and would each be heard too seldom to learn their spelling
WORD_WEIGHT_HALVING_LETTERS = 2  # without a frequency text: a word's weight halves for every 2 more letters
UNSEEN_WORD_COUNT = 0.5  # added to every word's count in the frequency text (Krichevsky-Trofimov smoothing)
TEXT_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")  # a word of running text, after lowercasing
SHORT_WORDS = frozenset(  # the 1-2 letter words kept (others are abbreviations: "cm", "ft", "ii")
    "a am an as at be by do go he if in is it me my no of oh on or so to up us we".split()
)
CONTRACTION = re.compile(r"^[a-z]+(?:n't|'re|'ve|'ll|'d)$")  # "don't" yes, possessive "dog's" no
ROMAN_NUMERAL = re.compile(
    r"^m{0,4}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})$"
)  # espeak reads "xiv" as 14
VOWELS = set("aeiouy")

# Speech-time estimate used to reach --hours before synthesising (the real hours are reported after).
SECONDS_PER_CHARACTER = 0.07  # at espeak-ng's default 175 words per minute and flite's default stretch
ESPEAK_DEFAULT_WPM = 175

# espeak-ng voices: accent x variant.
ESPEAK_ACCENTS = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-gb-x-rp",
    "en-029",
    "en-us-nyc",
)
ESPEAK_HELD_OUT_ACCENTS = ("en-gb-x-rp",)
ESPEAK_HELD_OUT_VARIANTS = ("m4", "f2", "klatt3", "Andy", "linda", "steph2")
ESPEAK_WPM = (130, 210)  # words per minute (-s), uniform
ESPEAK_PITCH = (20, 80)  # -p, 0-99 (50 is the default)
HELD_OUT_VARIANT_SHARE = 0.5  # of espeak-ng evaluation utterances: a held-out variant; the rest: the held-out accent

# flite voices (kal is an 8 kHz diphone voice, kal16 the same speaker at 16 kHz; awb, rms and slt are clustergen).
FLITE_VOICES = ("kal", "kal16", "awb", "slt", "rms")
FLITE_HELD_OUT_VOICES = ("rms",)
FLITE_STRETCH = (0.8, 1.25)  # duration_stretch, uniform (> 1 is slower)
FLITE_F0_HZ = (80.0, 220.0)  # int_f0_target_mean, uniform, for training voices
FLITE_PITCH_SHARE = 0.5  # of flite training utterances: a random mean pitch (the rest: the voice's own)

# festival's voices (Debian: festvox-kallpc16k, festvox-kdlpc16k, festvox-us-slt-hts): kal and ked are
# diphone voices, slt an HTS one (the speaker of flite's slt).
FESTIVAL_VOICES = ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts")
FESTIVAL_HELD_OUT_VOICES: tuple[str, ...] = ()
FESTIVAL_STRETCH = (0.8, 1.25)  # Duration_Stretch, uniform (> 1 is slower)

# Of the training hours, renormalised over the engines used (so a corpus without festival is as before).
ENGINE_SHARE = {"espeak-ng": 0.65, "flite": 0.35, "festival": 0.15}
TTS_TIMEOUT_S = 120  # one sentence; far above the ~0.2 s the slowest voice takes


def check_engine(name: str, command: Sequence[str]) -> str:
    """The version line ``command --version`` prints, or a ``ValueError`` naming the engine's option.

    (flite prints its version and exits with status 1, so the status is not read.)
    """
    option = ENGINE_OPTION[name]
    try:
        result = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as error:
        raise ValueError(f"{option}: cannot run {shlex.join(command)!r}: {error}") from None
    lines = [line.strip() for line in (result.stdout + result.stderr).splitlines()]
    versions = [line for line in lines if re.search(r"\d+\.\d+", line)]
    if not versions:
        raise ValueError(f"{option}: {shlex.join(command)!r} --version printed no version: {lines[:3]}")
    return versions[0]


ENGINE_OPTION = {"espeak-ng": "--espeak", "flite": "--flite", "festival": "--festival"}  # each engine's command


def festival_voices(command: Sequence[str]) -> list[str]:
    """The voices ``(voice.list)`` names in festival."""
    result = subprocess.run(
        [*command, "-b", "(print (voice.list))"], capture_output=True, text=True, timeout=60, check=False
    )
    return result.stdout.strip().strip("()").split()


def flite_voices(command: Sequence[str]) -> list[str]:
    """The voices ``flite -lv`` lists."""
    result = subprocess.run([*command, "-lv"], capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.split(":", 1)[-1].split()


def espeak_variants(command: Sequence[str]) -> list[str]:
    """The voice variants espeak-ng has (the ``!v/<name>`` files of ``--voices=variant``), sorted."""
    result = subprocess.run([*command, "--voices=variant"], capture_output=True, text=True, timeout=60, check=True)
    names = re.findall(r"!v/(\S+)\s*$", result.stdout, flags=re.MULTILINE)
    return sorted(set(names))


def usable_words(candidates: Iterable[str]) -> list[str]:
    """The ``candidates`` that a synthesiser reads as spelled, in :data:`ALPHABET`, sorted and distinct.

    >>> usable_words(["dog", "dog's", "Dover", "cm", "xiv", "don't", "of", "mix", "we're", "dog"])
    ['dog', "don't", 'of', "we're"]
    """
    words = set()
    for word in candidates:
        letters = word.replace("'", "")
        if not (word.isascii() and letters.isalpha() and word == word.lower()):
            continue
        if "'" in word and not CONTRACTION.match(word):
            continue
        if len(letters) > MAX_WORD_LETTERS or (len(letters) <= 2 and word not in SHORT_WORDS):
            continue
        if not VOWELS & set(letters) or ROMAN_NUMERAL.match(word):
            continue
        words.add(word)
    return sorted(words)


def read_vocabulary(path: str | os.PathLike) -> list[str]:
    """:func:`usable_words` of the word list ``path`` (one word a line); none, or no file, is a ``ValueError``."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").split()
    except OSError as error:
        raise ValueError(f"--wordlist {str(path)!r}: cannot read it ({error.strerror})") from None
    words = usable_words(lines)
    if not words:
        raise ValueError(f"--wordlist {str(path)!r}: no usable lowercase word in it")
    return words


def text_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The files of ``paths``, sorted: a folder gives its regular files without a suffix.

    (A fortune folder holds ``art``, its index ``art.dat`` and a link ``art.u8``; only ``art`` is text.)
    """
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(p for p in path.iterdir() if p.is_file() and not p.is_symlink() and not p.suffix)
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"--frequency-text {str(path)!r}: no such file or folder")
    if not files:
        raise ValueError(f"--frequency-text {[str(p) for p in paths]}: no text file in it")
    return sorted(files)


def word_counts(texts: Iterable[str], words: Sequence[str]) -> np.ndarray:
    """How often each of ``words`` occurs in ``texts`` (lowercased running text): int64 ``(len(words),)``.

    >>> word_counts(["The dog saw the cat. Don't!"], ["cat", "don't", "the", "zebra"]).tolist()
    [1, 1, 2, 0]
    """
    counts = collections.Counter()
    for text in texts:
        counts.update(TEXT_WORD.findall(text.lower()))
    return np.array([counts[word] for word in words], np.int64)


def word_weights(words: Sequence[str], counts: np.ndarray | None = None) -> np.ndarray:
    """Sampling probabilities of ``words``, float64 ``(len(words),)`` summing to 1.

    With ``counts`` (:func:`word_counts`): ``counts + UNSEEN_WORD_COUNT``,
    normalised; without: ``2 ** (-letters / 2)``, normalised.

    >>> word_weights(["a", "the", "zebra"], np.array([3, 1, 0])).round(3).tolist()
    [0.636, 0.273, 0.091]
    """
    if counts is None:
        letters = np.array([len(word.replace("'", "")) for word in words], np.float64)
        weights = 2.0 ** (-letters / WORD_WEIGHT_HALVING_LETTERS)
    else:
        weights = np.asarray(counts, np.float64) + UNSEEN_WORD_COUNT
    return weights / weights.sum()


class SentenceSource:
    """Distinct random sentences: each ``next()`` is a sentence never returned before."""

    def __init__(self, words: Sequence[str], rng: np.random.Generator, counts: np.ndarray | None = None) -> None:
        self.words, self.rng = list(words), rng
        self.cumulative = np.cumsum(word_weights(words, counts))  # inverse-CDF sampling: O(log V) a word
        self.seen: set[str] = set()

    def next(self) -> str:
        while True:
            count = int(self.rng.integers(WORDS_PER_SENTENCE[0], WORDS_PER_SENTENCE[1] + 1))
            picks = np.searchsorted(self.cumulative, self.rng.random(count) * self.cumulative[-1], side="right")
            text = " ".join(self.words[min(i, len(self.words) - 1)] for i in picks)
            if text not in self.seen:
                self.seen.add(text)
                return text


def voice_split(
    engines: Sequence[str],
    variants: Sequence[str] = (),
    flite_installed: Sequence[str] = (),
    festival_installed: Sequence[str] = (),
) -> dict[str, dict[str, list[str]]]:
    """The training and held-out voices of each engine: ``{engine: {"train": [...], "eval": [...]}}``.

    ``variants``: espeak-ng's voice variants; ``flite_installed``,
    ``festival_installed``: those engines' voices. An espeak-ng voice is
    ``accent`` or ``accent+variant``; it is held out when its accent or its
    variant is.

    >>> split = voice_split(["espeak-ng", "flite"], ["m1", *ESPEAK_HELD_OUT_VARIANTS], FLITE_VOICES)
    >>> "en-us+m1" in split["espeak-ng"]["train"], "en-gb-x-rp+m1" in split["espeak-ng"]["eval"]
    (True, True)
    >>> split["flite"]
    {'train': ['kal', 'kal16', 'awb', 'slt'], 'eval': ['rms']}
    """
    split: dict[str, dict[str, list[str]]] = {}
    for engine, wanted, installed in (
        ("flite", FLITE_VOICES, flite_installed),
        ("festival", FESTIVAL_VOICES, festival_installed),
    ):
        missing = sorted(set(wanted) - set(installed)) if engine in engines else []
        if missing:
            raise ValueError(f"{ENGINE_OPTION[engine]} lacks the voices {missing} (it has {list(installed)})")
    if "espeak-ng" in engines:
        missing = sorted(set(ESPEAK_HELD_OUT_VARIANTS) - set(variants))
        if missing:
            raise ValueError(f"--espeak lacks the held-out variants {missing} (it has {len(variants)} variants)")
        voices = [
            accent + (f"+{variant}" if variant else "") for accent in ESPEAK_ACCENTS for variant in ["", *variants]
        ]
        held_out = [
            voice
            for voice in voices
            if voice.split("+")[0] in ESPEAK_HELD_OUT_ACCENTS or voice.partition("+")[2] in ESPEAK_HELD_OUT_VARIANTS
        ]
        split["espeak-ng"] = {"train": [v for v in voices if v not in held_out], "eval": held_out}
    for engine, voices, held_out in (
        ("flite", FLITE_VOICES, FLITE_HELD_OUT_VOICES),
        ("festival", FESTIVAL_VOICES, FESTIVAL_HELD_OUT_VOICES),
    ):
        if engine in engines:
            split[engine] = {"train": [v for v in voices if v not in held_out], "eval": list(held_out)}
    return split


def draw_voice(engine: str, voices: Sequence[str], split: str, rng: np.random.Generator) -> tuple[str, dict]:
    """A voice of ``voices`` and its random settings for one utterance of ``split``."""
    if engine == "espeak-ng":
        if split == "eval":  # half held-out variants, half the held-out accent, so both kinds are measured
            by_variant = [v for v in voices if v.partition("+")[2] in ESPEAK_HELD_OUT_VARIANTS]
            by_accent = [v for v in voices if v not in by_variant]
            voices = by_variant if rng.random() < HELD_OUT_VARIANT_SHARE or not by_accent else by_accent
        voice = voices[int(rng.integers(len(voices)))]
        settings = {
            "wpm": int(rng.integers(ESPEAK_WPM[0], ESPEAK_WPM[1] + 1)),
            "pitch": int(rng.integers(ESPEAK_PITCH[0], ESPEAK_PITCH[1] + 1)),
        }
        return voice, settings
    voice = voices[int(rng.integers(len(voices)))]
    if engine == "festival":
        return voice, {"duration_stretch": round(float(rng.uniform(*FESTIVAL_STRETCH)), 3)}
    settings = {"duration_stretch": round(float(rng.uniform(*FLITE_STRETCH)), 3)}
    if split == "train" and rng.random() < FLITE_PITCH_SHARE:
        settings["int_f0_target_mean"] = round(float(rng.uniform(*FLITE_F0_HZ)), 1)
    return voice, settings


def estimated_seconds(engine: str, text: str, settings: dict) -> float:
    """Rough speech time of ``text`` with ``settings`` (to size the corpus before synthesising it)."""
    seconds = len(text) * SECONDS_PER_CHARACTER
    if engine == "espeak-ng":
        return seconds * ESPEAK_DEFAULT_WPM / settings["wpm"]
    return seconds * settings["duration_stretch"]


def plan_jobs(
    words: Sequence[str],
    split_voices: dict[str, dict[str, list[str]]],
    hours: float,
    eval_per_engine: int,
    seed: int,
    counts: np.ndarray | None = None,
) -> list[dict]:
    """Every utterance to synthesise, in id order: held-out ones first, then training ones up to ``hours``.

    ``counts``: the words' counts in a frequency text (:func:`word_weights`).
    """
    rng = np.random.default_rng(seed)
    sentences = SentenceSource(words, rng, counts)  # one source: no sentence is said twice, so none crosses splits
    jobs: list[dict] = []

    def add(engine: str, split: str) -> float:
        voice, settings = draw_voice(engine, split_voices[engine][split], split, rng)
        text = sentences.next()
        jobs.append(
            {
                "id": f"{len(jobs):06d}",
                "engine": engine,
                "voice": voice,
                "settings": settings,
                "text": text,
                "split": split,
            }
        )
        return estimated_seconds(engine, text, settings)

    for engine, voices in split_voices.items():
        for _ in range(eval_per_engine if voices["eval"] else 0):
            add(engine, "eval")
    shares = {engine: ENGINE_SHARE[engine] for engine in split_voices}
    total = sum(shares.values())
    for engine, share in shares.items():
        remaining = hours * 3600.0 * share / total
        while remaining > 0:
            remaining -= add(engine, "train")
    return jobs


def tts_command(job: dict, commands: dict[str, list[str]], wav_path: str) -> list[str]:
    """The command line that speaks ``job["text"]`` into ``wav_path``."""
    settings = job["settings"]
    if job["engine"] == "espeak-ng":
        return [
            *commands["espeak-ng"],
            "-v",
            job["voice"],
            "-s",
            str(settings["wpm"]),
            "-p",
            str(settings["pitch"]),
            "-w",
            wav_path,
            job["text"],
        ]
    if job["engine"] == "festival":  # the text is a-z, apostrophe and space: nothing to escape in Scheme
        synthesis = f'(utt.save.wave (utt.synth (Utterance Text "{job["text"]}")) "{wav_path}" \'riff)'
        stretch = f"(Parameter.set 'Duration_Stretch {settings['duration_stretch']})"
        return [*commands["festival"], "-b", f"(voice_{job['voice']})", stretch, synthesis]
    options = [item for key, value in settings.items() for item in ("--setf", f"{key}={value}")]
    return [*commands["flite"], "-voice", job["voice"], *options, "-t", job["text"], "-o", wav_path]


def _init_worker() -> None:
    torch.set_num_threads(1)  # one process per core already


def synthesise(task: tuple[dict, dict[str, list[str]], str]) -> dict:
    """Worker: speak one job, resample to 16 kHz, write ``wav/<id>.wav``; returns its manifest record."""
    job, commands, out_dir = task
    handle, raw_path = tempfile.mkstemp(suffix=".wav")
    os.close(handle)
    try:
        command = tts_command(job, commands, raw_path)
        result = subprocess.run(command, capture_output=True, text=True, timeout=TTS_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"{job['engine']} failed on utterance {job['id']}: {shlex.join(command)}: "
                f"{result.stderr.strip()[-300:]}"
            )
        samples, _ = load(raw_path, SAMPLE_RATE)
    finally:
        os.unlink(raw_path)
    relative = f"wav/{job['id']}.wav"
    sf.write(Path(out_dir) / relative, samples, SAMPLE_RATE, subtype="PCM_16")
    return {**job, "path": relative, "seconds": round(len(samples) / SAMPLE_RATE, 3)}


def summarise(records: Sequence[dict]) -> dict:
    """Utterances and hours per split and engine."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for record in records:
        entry = summary.setdefault(record["split"], {}).setdefault(record["engine"], {"utterances": 0, "hours": 0.0})
        entry["utterances"] += 1
        entry["hours"] += record["seconds"] / 3600.0
    for engines in summary.values():
        for entry in engines.values():
            entry["hours"] = round(entry["hours"], 3)
    return summary


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options of ``python -m recipes.ctc_small.corpus``; a value out of its range is a usage error."""
    parser = step_parser(__spec__.name, __doc__)
    parser.add_argument("--out", type=Path, required=True, help="output folder (created; must not hold a manifest)")
    parser.add_argument("--hours", type=float, default=32.0, help="training speech to synthesise, estimated")
    parser.add_argument("--eval-per-engine", type=int, default=400, help="held-out utterances per engine")
    parser.add_argument("--engines", nargs="+", default=list(DEFAULT_ENGINES), choices=ENGINES)
    parser.add_argument("--espeak", default="espeak-ng", help="the espeak-ng command (a shell-quoted prefix)")
    parser.add_argument("--flite", default="flite", help="the flite command (a shell-quoted prefix)")
    parser.add_argument(
        "--festival",
        default="festival",
        help="the festival command (a shell-quoted prefix; an unpacked one needs --datadir DIR/usr/share/festival)",
    )
    parser.add_argument("--wordlist", default=DEFAULT_WORDLIST, help="one word a line (Debian's wamerican)")
    parser.add_argument(
        "--frequency-text",
        nargs="+",
        default=[],
        metavar="PATH",
        help="English text files or folders (Debian's fortunes: /usr/share/games/fortunes) whose word counts "
        "weight the words (default: shorter words more often)",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="synthesis processes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.hours > 0:
        parser.error(f"--hours must be > 0, got {args.hours}")
    check_counts(parser, args, ("eval_per_engine", "workers"))
    return args


def make_corpus(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Synthesise the corpus ``args`` asks for; ``argv`` is recorded in ``corpus.json`` as the command."""
    started = time.perf_counter()
    manifest = args.out / "manifest.jsonl"
    if manifest.exists():
        raise ValueError(f"--out {str(args.out)!r} already holds a corpus (manifest.jsonl)")
    commands = {
        "espeak-ng": shlex.split(args.espeak),
        "flite": shlex.split(args.flite),
        "festival": shlex.split(args.festival),
    }
    versions = {engine: check_engine(engine, commands[engine]) for engine in args.engines}
    words = read_vocabulary(args.wordlist)
    counts = None
    if args.frequency_text:
        frequency_files = text_files(args.frequency_text)
        frequency_bytes = [path.read_bytes() for path in frequency_files]
        counts = word_counts([data.decode("utf-8", errors="replace") for data in frequency_bytes], words)
    variants = espeak_variants(commands["espeak-ng"]) if "espeak-ng" in args.engines else []
    installed = flite_voices(commands["flite"]) if "flite" in args.engines else []
    festival = festival_voices(commands["festival"]) if "festival" in args.engines else []
    split_voices = voice_split(args.engines, variants, installed, festival)
    jobs = plan_jobs(words, split_voices, args.hours, args.eval_per_engine, args.seed, counts)
    print(f"{len(words)} words, {len(jobs)} utterances to synthesise with {args.workers} workers", flush=True)
    (args.out / "wav").mkdir(parents=True, exist_ok=True)
    records = []
    tasks = [(job, commands, str(args.out)) for job in jobs]
    with contextlib.ExitStack() as stack:
        if args.workers == 1:  # in this process: no start-up cost for small corpora
            _init_worker()
            done = map(synthesise, tasks)
        else:
            pool = stack.enter_context(
                multiprocessing.get_context("spawn").Pool(args.workers, initializer=_init_worker)
            )
            done = pool.imap_unordered(synthesise, tasks, chunksize=8)
        for record in done:
            records.append(record)
            if len(records) % 2000 == 0:
                print(f"{time.perf_counter() - started:7.1f} s  {len(records)}/{len(jobs)} utterances", flush=True)
    records.sort(key=lambda record: record["id"])
    manifest.write_text("".join(json.dumps(record) + "\n" for record in records))
    summary = {
        "command": shlex.join([Path(sys.executable).name, "-m", __spec__.name, *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seed": args.seed,
        "engines": versions,
        "wordlist": {
            "path": str(args.wordlist),
            "sha256": hashlib.sha256(Path(args.wordlist).read_bytes()).hexdigest(),
            "words_used": len(words),
        },
        "frequency_text": None
        if counts is None
        else {
            "paths": [str(path) for path in args.frequency_text],
            "files": len(frequency_files),
            "sha256": hashlib.sha256(b"".join(frequency_bytes)).hexdigest(),
            "word_tokens_counted": int(counts.sum()),
            "words_seen": int((counts > 0).sum()),
            "unseen_word_count": UNSEEN_WORD_COUNT,
        },
        "held_out": {
            "espeak-ng accents": list(ESPEAK_HELD_OUT_ACCENTS),
            "espeak-ng variants": list(ESPEAK_HELD_OUT_VARIANTS),
            "flite voices": list(FLITE_HELD_OUT_VOICES),
            "festival voices": list(FESTIVAL_HELD_OUT_VOICES),
        },
        "voices": split_voices,
        "splits": summarise(records),
        "synthesis_s": round(time.perf_counter() - started, 1),
        "workers": args.workers,
    }
    (args.out / "corpus.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["splits"]), f"in {summary['synthesis_s']} s", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the step with ``argv`` (default: the command line); a bad input exits with a message naming it."""
    return run_step(make_corpus, parse_args, argv, "corpus")


if __name__ == "__main__":
    sys.exit(main())
