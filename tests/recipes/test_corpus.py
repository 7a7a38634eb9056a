"""recipes.ctc_small.corpus: a tiny corpus of real synthesised speech, its manifest and its held-out splits."""

from __future__ import annotations

import doctest
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audiomask.constants import SAMPLE_RATE
from recipes.ctc_small import corpus

ESPEAK = shutil.which("espeak-ng")
FLITE = shutil.which("flite")
WORDS = (
    "a the of to and in is it we on cat dog sun red blue green house water light river stone apple bread chair "
    "table window garden music paper yellow orange summer winter morning evening friend family street market "
    "doctor teacher pocket silver golden quiet happy simple button candle don't we're they'll dog's Dover cm xiv"
).split()

needs_espeak = pytest.mark.skipif(ESPEAK is None, reason="needs espeak-ng (apt-get install espeak-ng)")


@pytest.fixture(scope="module")
def wordlist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("words") / "words.txt"
    path.write_text("\n".join(WORDS) + "\n")
    return path


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory: pytest.TempPathFactory, wordlist: Path) -> Path:
    """Espeak-ng (and flite where installed): 3 held-out utterances per engine and ~40 s of training speech."""
    if ESPEAK is None:
        pytest.skip("needs espeak-ng")
    out = tmp_path_factory.mktemp("corpus")
    engines = ["espeak-ng"] + (["flite"] if FLITE else [])
    corpus.main(
        [
            "--out",
            str(out),
            "--hours",
            "0.01",
            "--eval-per-engine",
            "3",
            "--workers",
            "1",
            "--wordlist",
            str(wordlist),
            "--engines",
            *engines,
            "--seed",
            "3",
        ]
    )
    return out


def read(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]


def test_doctests() -> None:
    assert doctest.testmod(corpus).failed == 0


@needs_espeak
def test_wavs_match_manifest(small_corpus: Path) -> None:
    records = read(small_corpus)
    assert len(records) >= 8
    for record in records:
        data, rate = sf.read(small_corpus / record["path"], dtype="float32")
        assert rate == SAMPLE_RATE and data.ndim == 1
        assert len(data) / rate == pytest.approx(record["seconds"], abs=1e-3)
        assert np.abs(data).max() > 0.01  # speech, not silence
        assert set(record["text"]) <= set(corpus.ALPHABET)
        assert record["text"] == record["text"].strip() and "  " not in record["text"]


@needs_espeak
def test_held_out_voices_and_sentences_are_disjoint(small_corpus: Path) -> None:
    records = read(small_corpus)
    summary = json.loads((small_corpus / "corpus.json").read_text())
    train = [r for r in records if r["split"] == "train"]
    held_out = [r for r in records if r["split"] == "eval"]
    assert train and held_out
    assert not {r["text"] for r in train} & {r["text"] for r in held_out}
    assert not {(r["engine"], r["voice"]) for r in train} & {(r["engine"], r["voice"]) for r in held_out}
    for record in held_out:
        assert record["voice"] in summary["voices"][record["engine"]]["eval"]
        assert record["voice"] not in summary["voices"][record["engine"]]["train"]
    counts = {
        split: sum(entry["utterances"] for entry in engines.values()) for split, engines in summary["splits"].items()
    }
    assert counts == {"eval": len(held_out), "train": len(train)}


@needs_espeak
def test_out_with_a_corpus_is_refused(small_corpus: Path, wordlist: Path) -> None:
    with pytest.raises(SystemExit, match="already holds a corpus"):
        corpus.main(["--out", str(small_corpus), "--hours", "0.001", "--wordlist", str(wordlist)])


def test_missing_wordlist_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--wordlist .*cannot read it"):
        corpus.main(
            [
                "--out",
                str(tmp_path / "c"),
                "--engines",
                "espeak-ng",
                "--wordlist",
                str(tmp_path / "no"),
                "--espeak",
                sys.executable,
            ]
        )  # any program that prints a version


def test_engine_that_cannot_run_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--flite: cannot run 'no-such-flite'"):
        corpus.main(["--out", str(tmp_path / "c"), "--engines", "flite", "--flite", "no-such-flite"])


def test_voice_split_holds_out_accents_and_variants() -> None:
    variants = ["m1", "f1", "whisper", *corpus.ESPEAK_HELD_OUT_VARIANTS]
    split = corpus.voice_split(["espeak-ng", "flite"], variants, corpus.FLITE_VOICES)
    espeak = split["espeak-ng"]
    assert not set(espeak["train"]) & set(espeak["eval"])
    assert len(espeak["train"]) + len(espeak["eval"]) == len(corpus.ESPEAK_ACCENTS) * (len(variants) + 1)
    for voice in espeak["train"]:
        accent, _, variant = voice.partition("+")
        assert accent not in corpus.ESPEAK_HELD_OUT_ACCENTS
        assert variant not in corpus.ESPEAK_HELD_OUT_VARIANTS
    assert split["flite"]["eval"] == list(corpus.FLITE_HELD_OUT_VOICES)
    with pytest.raises(ValueError, match="lacks the held-out variants"):
        corpus.voice_split(["espeak-ng"], ["m1"])


def test_plan_is_seeded_and_sentences_never_repeat() -> None:
    words = corpus.usable_words(WORDS)
    voices = corpus.voice_split(["flite"], flite_installed=corpus.FLITE_VOICES)
    plan = corpus.plan_jobs(words, voices, hours=0.02, eval_per_engine=5, seed=1)
    assert plan == corpus.plan_jobs(words, voices, hours=0.02, eval_per_engine=5, seed=1)
    assert plan != corpus.plan_jobs(words, voices, hours=0.02, eval_per_engine=5, seed=2)
    texts = [job["text"] for job in plan]
    assert len(set(texts)) == len(texts)
    assert [job["split"] for job in plan[:5]] == ["eval"] * 5 and plan[5]["split"] == "train"
    low, high = corpus.WORDS_PER_SENTENCE
    assert all(low <= len(text.split()) <= high for text in texts)
    for job in plan:
        stretch = job["settings"]["duration_stretch"]
        assert corpus.FLITE_STRETCH[0] <= stretch <= corpus.FLITE_STRETCH[1]
        assert job["split"] == "train" or "int_f0_target_mean" not in job["settings"]


def test_frequency_text_folder_reads_only_the_text_files(tmp_path: Path) -> None:
    (tmp_path / "art").write_text("the cat and the dog\n%\nthe end\n")
    (tmp_path / "art.dat").write_bytes(b"\x00\x02the the the")  # fortune's index: not text
    (tmp_path / "art.u8").symlink_to("art")  # the same text again
    files = corpus.text_files([tmp_path])
    assert files == [tmp_path / "art"]
    counts = corpus.word_counts([f.read_text() for f in files], ["the", "cat", "zebra"])
    assert counts.tolist() == [3, 1, 0]
    with pytest.raises(ValueError, match="--frequency-text .*no such file"):
        corpus.text_files([tmp_path / "missing"])


def test_frequency_counts_make_common_words_common() -> None:
    words = corpus.usable_words(WORDS)
    common, rare = words[0], words[-1]
    counts = np.zeros(len(words), np.int64)
    counts[0] = 50  # not so many that the distinct-sentence rule rejects most draws
    voices = corpus.voice_split(["flite"], flite_installed=corpus.FLITE_VOICES)
    plan = corpus.plan_jobs(words, voices, hours=0.05, eval_per_engine=5, seed=0, counts=counts)
    said = [word for job in plan for word in job["text"].split()]
    share = said.count(common) / len(said)
    expected = (50 + corpus.UNSEEN_WORD_COUNT) / (50 + len(words) * corpus.UNSEEN_WORD_COUNT)
    assert share == pytest.approx(expected, abs=0.06)  # repeated sentences are redrawn: a small bias
    assert said.count(rare) < said.count(common) / 20


def test_festival_is_a_training_only_engine_that_leaves_the_held_out_set_alone() -> None:
    words = corpus.usable_words(WORDS)
    without = corpus.voice_split(["flite"], flite_installed=corpus.FLITE_VOICES)
    with_festival = corpus.voice_split(
        ["flite", "festival"], flite_installed=corpus.FLITE_VOICES, festival_installed=corpus.FESTIVAL_VOICES
    )
    assert with_festival["festival"] == {"train": list(corpus.FESTIVAL_VOICES), "eval": []}
    plan = corpus.plan_jobs(words, with_festival, hours=0.05, eval_per_engine=4, seed=3)
    held_out = [job for job in plan if job["split"] == "eval"]
    assert held_out == [job for job in corpus.plan_jobs(words, without, 0.05, 4, 3) if job["split"] == "eval"]
    festival = [job for job in plan if job["engine"] == "festival"]
    assert festival and all(job["split"] == "train" for job in festival)
    for job in festival:
        low, high = corpus.FESTIVAL_STRETCH
        assert low <= job["settings"]["duration_stretch"] <= high
    with pytest.raises(ValueError, match="--festival lacks the voices"):
        corpus.voice_split(["festival"], festival_installed=["kal_diphone"])


def test_festival_command_synthesises_the_text_into_the_wav() -> None:
    job = {"engine": "festival", "voice": "ked_diphone", "settings": {"duration_stretch": 1.1}, "text": "we don't"}
    command = corpus.tts_command(job, {"festival": ["festival", "--datadir", "/d"]}, "/tmp/x.wav")
    assert command == [
        "festival",
        "--datadir",
        "/d",
        "-b",
        "(voice_ked_diphone)",
        "(Parameter.set 'Duration_Stretch 1.1)",
        '(utt.save.wave (utt.synth (Utterance Text "we don\'t")) "/tmp/x.wav" \'riff)',
    ]
