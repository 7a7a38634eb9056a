"""audiomask.audio: formats and rates, mix-down, every bad input, blocks, the streaming resampler, memory."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio
from hypothesis import given, settings
from hypothesis import strategies as st

import audiomask
from audiomask.audio import MAX_CHANNELS, Resampler, TruncatedAudioWarning, iter_blocks, load
from audiomask.bench.signals import speech_like

ULP = float(np.spacing(np.float32(1.0)))  # the resampler's documented bound against the whole-file call
RATES = [8000, 16000, 22050, 44100, 48000]
# (extension, soundfile format, subtype, max abs error of one sample against the float32 written)
FORMATS = [
    ("wav", "WAV", "PCM_16", 2**-15),
    ("wav", "WAV", "PCM_24", 2**-23),
    ("wav", "WAV", "PCM_32", 2**-31 * 2),
    ("wav", "WAV", "FLOAT", 0.0),
    ("flac", "FLAC", "PCM_16", 2**-15),
    ("ogg", "OGG", "VORBIS", None),  # lossy: checked by correlation
]


def resampled(samples: np.ndarray, rate: int) -> np.ndarray:
    """The whole-signal reference: torchaudio's resample in float64, rounded once."""
    if rate == 16000:
        return samples.astype(np.float32)
    x = torch.from_numpy(samples.astype(np.float64))
    return torchaudio.functional.resample(x, rate, 16000).float().numpy()


def write(path: Path, samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str = "PCM_16") -> Path:
    sf.write(path, samples, rate, format=fmt, subtype=subtype)
    return path


@pytest.mark.parametrize(("ext", "fmt", "subtype", "tolerance"), FORMATS, ids=[f"{f[1]}-{f[2]}" for f in FORMATS])
@pytest.mark.parametrize("rate", RATES)
def test_load_reads_every_format_and_rate(tmp_path, ext, fmt, subtype, tolerance, rate):
    x = speech_like(0.6, seed=rate % 7, level_db=-3.0, sample_rate=rate)
    path = write(tmp_path / f"speech.{ext}", x, rate, fmt, subtype)
    samples, sr = load(path)
    assert sr == 16000 and samples.dtype == np.float32 and samples.ndim == 1
    assert len(samples) == math.ceil(len(x) * 16000 / rate)
    if tolerance is None:  # Vorbis: the waveform survives, not the samples
        written = sf.read(path, dtype="float32")[0]
        assert np.corrcoef(resampled(written, rate), samples)[0, 1] > 0.999
        assert np.corrcoef(resampled(x, rate), samples)[0, 1] > 0.95
    else:
        np.testing.assert_allclose(samples, resampled(sf.read(path, dtype="float32")[0], rate), rtol=0, atol=ULP)
        assert np.abs(samples - resampled(x, rate)).max() <= 4 * tolerance + 2 * ULP


@pytest.mark.parametrize("channels", [2, 6, MAX_CHANNELS])
def test_channels_are_mixed_down_by_their_mean(tmp_path, channels):
    rng = np.random.default_rng(channels)
    x = (rng.uniform(-0.5, 0.5, (8000, channels))).astype(np.float32)
    path = write(tmp_path / "multi.wav", x, 16000, subtype="FLOAT")
    samples, sr = load(path)
    np.testing.assert_allclose(samples, x.mean(axis=1), rtol=0, atol=ULP)


def test_stereo_44k_sample_mixes_down_and_resamples():
    native, sr = load("samples/stereo_44k.wav", target_sr=None)
    stereo = sf.read("samples/stereo_44k.wav", dtype="float32")[0]
    assert sr == 44100 and stereo.shape[1] == 2
    np.testing.assert_allclose(native, stereo.mean(axis=1), rtol=0, atol=ULP)
    samples, sr = load("samples/stereo_44k.wav")
    assert sr == 16000
    np.testing.assert_allclose(samples, resampled(native, 44100), rtol=0, atol=ULP)


def test_target_rate_may_be_any_rate(tmp_path):
    x = speech_like(0.5, seed=1)
    path = write(tmp_path / "a.wav", x, 16000, subtype="FLOAT")
    samples, sr = load(path, target_sr=24000)
    expected = torchaudio.functional.resample(torch.from_numpy(x).double(), 16000, 24000).float().numpy()
    assert sr == 24000
    np.testing.assert_allclose(samples, expected, rtol=0, atol=ULP)


# ---- bad input: each case raises AudioError naming the file and the reason ----


def make_bad(tmp_path: Path, case: str) -> Path:
    path = tmp_path / f"bad_{case}.wav"
    x = speech_like(0.5, seed=2)
    if case == "missing":
        return path
    if case == "directory":
        path.mkdir()
    elif case == "empty_file":
        path.write_bytes(b"")
    elif case == "not_audio":
        path.write_text("this is a transcript, not a recording\n" * 20)
    elif case == "corrupt_header":
        data = write(path, x, 16000).read_bytes()
        path.write_bytes(data[:30])  # RIFF/WAVE/fmt cut short: no data chunk
    elif case == "garbled_header":
        data = bytearray(write(path, x, 16000).read_bytes())
        data[20:36] = b"\xff" * 16  # the fmt chunk overwritten
        path.write_bytes(bytes(data))
    elif case == "zero_samples":
        write(path, np.zeros(0, np.float32), 16000)
    elif case in ("nan", "inf"):
        x = x.copy()
        x[1234] = np.nan if case == "nan" else -np.inf
        write(path, x, 16000, subtype="FLOAT")
    elif case == "too_many_channels":
        write(path, np.zeros((100, MAX_CHANNELS + 1), np.float32), 16000)
    elif case == "truncated_ogg":  # cut so early that no complete page of audio is left
        path = tmp_path / "bad_truncated.ogg"
        data = write(path, speech_like(3.0, seed=2), 16000, "OGG", "VORBIS").read_bytes()
        path.write_bytes(data[: len(data) * 3 // 10])
    elif case == "truncated_flac":
        path = tmp_path / "bad_truncated.flac"
        data = write(path, speech_like(3.0, seed=3), 16000, "FLAC").read_bytes()
        path.write_bytes(data[: len(data) // 2])
    return path


BAD = {
    "missing": "no such file",
    "directory": "is a directory",
    "empty_file": "empty file (0 bytes)",
    "not_audio": "not an audio file (Format not recognised",
    "corrupt_header": "corrupt or truncated header",
    "garbled_header": "corrupt or truncated header",
    "zero_samples": "zero samples",
    "nan": "non-finite sample (nan) at frame 1234 (0.077 s)",
    "inf": "non-finite sample (-inf) at frame 1234 (0.077 s)",
    "too_many_channels": f"unsupported channel layout: {MAX_CHANNELS + 1} channels",
    "truncated_ogg": "truncated: the Ogg stream ends without its end-of-stream page",
    "truncated_flac": "corrupt or truncated audio data after frame",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_audio_error_naming_file_and_reason(tmp_path, case):
    path = make_bad(tmp_path, case)
    for read in (load, lambda p: list(iter_blocks(p, 4000))):
        with pytest.raises(audiomask.AudioError) as caught:
            read(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and BAD[case] in message, message
        assert isinstance(caught.value, ValueError)


def test_truncated_data_warns_naming_the_file_and_uses_what_is_there(tmp_path):
    x = speech_like(1.0, seed=4)
    path = write(tmp_path / "cut.wav", x, 16000, subtype="FLOAT")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.warns(TruncatedAudioWarning, match=re.escape(f"{path}: truncated: data ends after")):
        samples, _ = load(path)
    kept = (len(data) // 2 - 44) // 4  # header 44 bytes (+ fact chunk), 4 bytes a sample
    assert 0 < len(samples) <= kept
    np.testing.assert_array_equal(samples, x[: len(samples)])
    with pytest.warns(TruncatedAudioWarning, match="truncated"):
        blocks = list(iter_blocks(path, 1000))
    np.testing.assert_array_equal(np.concatenate(blocks), samples)


@pytest.mark.parametrize(("fraction", "reason"), [(0.8, "without its end-of-stream page"), (0.99, "in a partial page")])
def test_truncated_ogg_warns_and_decodes_its_complete_pages(tmp_path, fraction, reason):
    path = write(tmp_path / "cut.ogg", speech_like(3.0, seed=2), 16000, "OGG", "VORBIS")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.warns(TruncatedAudioWarning, match=re.escape(f"{path}: truncated: the Ogg stream ends {reason}")):
        samples, _ = load(path)
    assert 0 < len(samples) < 48000


def with_data_size(path: Path, declared: int, kept_bytes: int | None = None) -> Path:
    """The 44-byte-header PCM WAV ``path`` with its data size field set to ``declared``, its data cut to ``kept_bytes``."""
    data = bytearray(path.read_bytes())
    data[40:44] = declared.to_bytes(4, "little")  # the data chunk's size field
    path.write_bytes(bytes(data if kept_bytes is None else data[: 44 + kept_bytes]))
    return path


@pytest.mark.parametrize("marker", [0x7FFFF000, 0x7FFFFFFF, 0xFFFFFFFF])
def test_streamed_header_placeholder_is_not_truncation(tmp_path, marker):
    """Writers piping to stdout leave a marker for the data size (sox, espeak-ng --stdout: 0x7ffff000)."""
    path = with_data_size(write(tmp_path / "piped.wav", speech_like(0.3, seed=5), 16000), marker)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples, _ = load(path)
    assert len(samples) == 4800


@pytest.mark.parametrize("declared", [0x7FFF0000, 0x80000000, 0xFFFFFFF0])
def test_a_data_size_far_beyond_the_file_warns(tmp_path, declared):
    """Any size beyond the data but the pipe writers' markers is a truncation: never read silently."""
    path = with_data_size(write(tmp_path / "huge.wav", speech_like(0.3, seed=5), 16000), declared, kept_bytes=2000)
    message = f"{path}: truncated: data ends after 2000 of the {declared} bytes its header declares"
    with pytest.warns(TruncatedAudioWarning, match=re.escape(message)):
        samples, _ = load(path)
    assert len(samples) == 1000
    with pytest.warns(TruncatedAudioWarning, match=re.escape(message)):
        assert len(np.concatenate(list(iter_blocks(path, 4000)))) == 1000


MPEG1_LAYER3_KBPS = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)  # by bit-rate index


def without_length_tag(path: Path) -> Path:
    """The MPEG-1 Layer III file ``path`` without its first frame, the Xing/Info tag that states its length.

    libsndfile then estimates the length from the file size and bit rate, as
    for MP3 writers that leave no tag.
    """
    data = path.read_bytes()
    header = int.from_bytes(data[:4], "big")
    assert header >> 21 == 0x7FF and header >> 17 & 0xF == 0b1101  # frame sync, MPEG-1, Layer III
    rate = (44100, 48000, 32000)[header >> 10 & 3]
    frame_bytes = 144 * 1000 * MPEG1_LAYER3_KBPS[header >> 12 & 0xF] // rate + (header >> 9 & 1)
    assert b"Info" in data[:frame_bytes] and data[frame_bytes : frame_bytes + 2] == data[:2]
    path.write_bytes(data[frame_bytes:])
    return path


@pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile cannot write MP3 (needs >= 1.1)")
def test_a_complete_mp3_without_a_length_tag_reads_without_a_warning(tmp_path):
    """libsndfile's length of such a file is an estimate (here more frames than decode): not a truncation."""
    x = speech_like(3.0, seed=3, sample_rate=44100)
    path = tmp_path / "untagged.mp3"
    sf.write(path, x, 44100, format="MP3", bitrate_mode="CONSTANT", compression_level=0.5)  # 160 kbit/s
    without_length_tag(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        native, rate = load(path, target_sr=None)
        samples, _ = load(path)
        blocks = list(iter_blocks(path, 4000))
    with sf.SoundFile(path) as handle:
        assert handle.frames > len(native)  # the estimate overshoots what decodes
    assert rate == 44100 and len(native) >= len(x)  # all of the audio (and the codec's delay)
    np.testing.assert_allclose(np.concatenate(blocks), samples, rtol=0, atol=ULP)


# ---- iter_blocks ----


# One-sample blocks only without resampling (one conv call a sample is slow; the resampler's
# chunking tests cover tiny chunks).
BLOCK_CASES = [(16000, 1)] + [(rate, block) for rate in RATES for block in (160, 4000, 16000, 10**6)]


@pytest.mark.parametrize(("rate", "block"), BLOCK_CASES)
def test_blocks_concatenate_to_load(tmp_path, rate, block):
    channels = 2 if rate == 44100 else 1
    x = np.stack([speech_like(1.3, seed=c, sample_rate=rate) for c in range(channels)], axis=1)
    path = write(tmp_path / "a.wav", x if channels > 1 else x[:, 0], rate, subtype="FLOAT")
    blocks = list(iter_blocks(path, block))
    expected, _ = load(path)
    assert all(len(b) == block for b in blocks[:-1]) and 1 <= len(blocks[-1]) <= block
    assert all(b.dtype == np.float32 for b in blocks)
    np.testing.assert_allclose(np.concatenate(blocks), expected, rtol=0, atol=ULP)


def test_blocks_stop_at_the_first_bad_sample_after_yielding_the_good_ones(tmp_path):
    x = speech_like(2.0, seed=6)
    x[20000] = np.nan
    path = write(tmp_path / "nan.wav", x, 16000, subtype="FLOAT")
    blocks = iter_blocks(path, 8000)
    good = [next(blocks), next(blocks)]
    np.testing.assert_array_equal(np.concatenate(good), x[:16000])
    with pytest.raises(
        audiomask.AudioError, match=re.escape(f"{path}: non-finite sample (nan) at frame 20000 (1.250 s)")
    ):
        next(blocks)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: list(iter_blocks("samples/numbers.wav", 0)), "block_samples must be >= 1, got 0"),
        (lambda: list(iter_blocks("samples/numbers.wav", 1.5)), "block_samples must be an integer, got 1.5"),
        (lambda: load("samples/numbers.wav", target_sr=0), "target_sr must be >= 1, got 0"),
        (lambda: Resampler(0, 16000), "orig_sr must be >= 1, got 0"),
        (lambda: Resampler(16000, 8000).push(np.zeros((2, 2))), "samples must be 1-D, got shape (2, 2)"),
    ],
)
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


# ---- the streaming resampler ----


@pytest.mark.parametrize(
    ("orig", "new"), [(44100, 16000), (48000, 16000), (8000, 16000), (22050, 16000), (16000, 8000), (11025, 16000)]
)
@settings(max_examples=12)
@given(cuts=st.lists(st.integers(0, 12000), max_size=20))
def test_resampler_equals_the_whole_signal_for_any_chunking(orig, new, cuts):
    x = speech_like(12000 / orig, seed=orig % 11, sample_rate=orig)
    r = Resampler(orig, new)
    out = np.concatenate([r.push(chunk) for chunk in np.split(x, sorted(cuts))] + [r.flush()])
    expected = torchaudio.functional.resample(torch.from_numpy(x).double(), orig, new).float().numpy()
    assert out.dtype == np.float32 and out.shape == expected.shape
    assert np.abs(out - expected).max() <= ULP


def test_resampler_short_and_empty_signals():
    for n in (0, 1, 5, 40):
        r = Resampler(44100, 16000)
        x = np.linspace(-0.5, 0.5, n, dtype=np.float32)
        out = np.concatenate([r.push(x), r.flush()])
        assert len(out) == math.ceil(n * 16000 / 44100)
        if n:
            ref = torchaudio.functional.resample(torch.from_numpy(x).double(), 44100, 16000).float().numpy()
            assert np.abs(out - ref).max() <= ULP


def test_resampler_passes_equal_rates_through():
    x = speech_like(0.1, seed=9)
    r = Resampler(16000, 16000)
    np.testing.assert_array_equal(np.concatenate([r.push(x[:700]), r.push(x[700:]), r.flush()]), x)


def test_resampler_refuses_use_after_flush():
    r = Resampler(8000, 16000)
    r.flush()
    with pytest.raises(ValueError, match="push after flush"):
        r.push(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="flush called twice"):
        r.flush()


# ---- memory: an hour of audio through iter_blocks ----

HOUR_SECONDS = 3600
RSS_LIMIT_MB = 200  # the bound on peak RSS above the interpreter's baseline

MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    from audiomask.audio import iter_blocks

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
        return None

    baseline = status("VmRSS:")
    try:  # reset the peak to now (Linux >= 4.0), so the peak seen is iter_blocks' own
        open("/proc/self/clear_refs", "w").write("5")
        resettable = True
    except OSError:
        resettable = False
    sampled_peak, total, checksum = baseline, 0, 0.0
    for block in iter_blocks(sys.argv[1], int(sys.argv[2])):
        total += len(block)
        checksum += float(block.sum(dtype=np.float64))
        sampled_peak = max(sampled_peak, status("VmRSS:"))
    peak = status("VmHWM:") if resettable else sampled_peak
    print(json.dumps({"baseline": baseline, "peak": max(peak, sampled_peak), "resettable": resettable,
                      "total": total, "checksum": checksum}))
    """
)


def write_hour(path: Path, rate: int = 16000) -> float:
    """One hour of PCM16 (115 MB at 16 kHz), written 10 s at a time so the writer stays small.

    Returns the float64 sum of the samples as soundfile reads them back, for iter_blocks to match.
    """
    block = speech_like(10.0, seed=8, level_db=-6.0, sample_rate=rate)
    with sf.SoundFile(path, "w", samplerate=rate, channels=1, subtype="PCM_16") as f:
        for i in range(HOUR_SECONDS // 10):
            f.write(block * np.float32(0.5 + 0.5 * (i % 7) / 6))  # vary the level so the blocks differ
    return sum(float(b.sum(dtype=np.float64)) for b in sf.blocks(path, blocksize=160000, dtype="float32"))


@pytest.mark.system  # a soak: an hour of audio
@pytest.mark.parametrize("rate", [16000, 8000])
def test_iter_blocks_reads_an_hour_in_bounded_memory(tmp_path, rate):
    """Peak RSS of iter_blocks over a 1-hour file (read as is, or resampled from 8 kHz), in a fresh
    interpreter, grows far less than 200 MB above the interpreter's baseline (measured: under 1 MB)."""
    path = tmp_path / "hour.wav"
    checksum = write_hour(path, rate)
    assert path.stat().st_size > HOUR_SECONDS * rate * 2
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), "16000"], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    grown_mb = (result["peak"] - result["baseline"]) / 2**20
    assert result["total"] == HOUR_SECONDS * 16000
    if rate == 16000:
        assert result["checksum"] == pytest.approx(checksum, rel=1e-6)
    assert grown_mb < RSS_LIMIT_MB, result
    assert grown_mb < 20, f"iter_blocks grew by {grown_mb:.1f} MB: more than a few blocks"
