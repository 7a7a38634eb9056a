"""Hostile audio files and samples: a clear AudioError naming the file, or correct samples; never more.

Every property writes the file it draws (random bytes, valid files of 13
formats cut short or with header fields overwritten by extreme values, huge
declared sizes and rates, NaN/Inf/denormal/huge samples, 8 channels, 8 and
192 kHz) and reads it with :func:`load` and :func:`iter_blocks` inside an
address space only ``HEADROOM_BYTES`` larger than the process's, so an
unbounded allocation fails the test. Accepted files must give the same
samples both ways (to within one float32 ulp), finite and 16 kHz, whose
features are finite.

Each property runs half the examples of the hypothesis profile; for many
more, run them under the ``fuzz`` profile:
``python -m pytest tests/test_audio_hostile.py --hypothesis-profile=fuzz``.
"""

from __future__ import annotations

import functools
import io
import math
import re
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask import AudioError
from audiomask.audio import (
    MAX_CHANNELS,
    MAX_SAMPLE_MAGNITUDE,
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    TARGET_SR,
    Resampler,
    TruncatedAudioWarning,
    check_samples,
    iter_blocks,
    load,
)
from audiomask.features import Phi4MMFrontend, WhisperFrontend
from audiomask.samples import as_samples, first_unusable

ULP = float(np.spacing(np.float32(1.0)))  # iter_blocks' documented bound against load
BLOCK_SAMPLES = 4000
# Address space allowed above the process's own while a file is read: far more than reading
# any accepted file needs, far less than a header's declared size could make a reader ask.
HEADROOM_BYTES = 512 * 2**20
# (format, subtype, rate, channels): what libsndfile writes, each a different header and decoder.
FORMATS = [
    ("WAV", "PCM_16", 16000, 1),
    ("WAV", "FLOAT", 44100, 2),
    ("WAV", "PCM_24", 8000, 1),
    ("WAVEX", "PCM_16", 48000, MAX_CHANNELS),
    ("FLAC", "PCM_16", 22050, 1),
    ("OGG", "VORBIS", 16000, 1),
    ("MP3", "MPEG_LAYER_III", 16000, 1),
    ("AIFF", "PCM_16", 16000, 1),
    ("AU", "FLOAT", 16000, 1),
    ("CAF", "ALAC_16", 44100, 1),
    ("W64", "PCM_16", 16000, 1),
    ("RF64", "PCM_16", 192000, 1),
    ("NIST", "PCM_16", 16000, 1),
]
# 16-, 32- and 64-bit patterns written over header fields: sizes, rates, channel counts.
EXTREME_FIELDS = [0, 1, 2, 3, 7, 8, 9, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000]
EXTREME_FIELDS += [0xFFFFFFFF, 0x100000000, 2**62, 2**63 - 1, 2**64 - 1, 16001, 44101, 768001, 3999]


def examples() -> int:
    """Examples per property: half the hypothesis profile's (each writes and reads a file)."""
    return max(1, settings.default.max_examples // 2)


def signal(rate: int, channels: int, seconds: float = 0.3, seed: int = 0) -> np.ndarray:
    """A tone plus noise, ``(frames, channels)`` float32 within +-0.5."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    tone = 0.3 * np.sin(2 * np.pi * 440 * t)[:, None] + 0.1 * rng.standard_normal((len(t), channels))
    return tone.clip(-0.5, 0.5).astype(np.float32)


@functools.cache
def encoded(index: int) -> bytes:
    """The bytes of ``FORMATS[index]`` holding :func:`signal`."""
    fmt, subtype, rate, channels = FORMATS[index]
    buffer = io.BytesIO()
    sf.write(buffer, signal(rate, channels), rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


@functools.cache
def frontends() -> tuple[Phi4MMFrontend, WhisperFrontend]:
    return Phi4MMFrontend(), WhisperFrontend()


def features_are_finite(samples: np.ndarray) -> bool:
    return all(bool(np.isfinite(frontend(samples)).all()) for frontend in frontends())


def check_file(path: Path) -> tuple[str, np.ndarray | None]:
    """Read ``path`` both ways; assert a clear refusal or the same correct samples. ``("refused" | "accepted", samples)``.

    Truncation warnings are allowed (the data that is there is used). Any
    exception other than AudioError fails the caller, MemoryError included.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedAudioWarning)
        try:
            samples, rate = load(path)
        except AudioError as error:
            assert str(error).startswith(f"{path}: "), str(error)
            with pytest.raises(AudioError, match="^" + re.escape(str(path))):
                list(iter_blocks(path, BLOCK_SAMPLES))
            return "refused", None
        blocks = list(iter_blocks(path, BLOCK_SAMPLES))
    assert rate == TARGET_SR and samples.dtype == np.float32 and samples.ndim == 1 and len(samples) > 0
    assert np.isfinite(samples).all() and np.abs(samples).max() <= MAX_SAMPLE_MAGNITUDE * 2  # resampling overshoot
    assert all(len(b) == BLOCK_SAMPLES for b in blocks[:-1])
    np.testing.assert_allclose(np.concatenate(blocks), samples, rtol=0, atol=ULP * max(1.0, np.abs(samples).max()))
    assert features_are_finite(samples)
    return "accepted", samples


def check_bytes(data: bytes, directory: Path, bound: Callable, suffix: str = ".wav") -> tuple[str, np.ndarray | None]:
    """Write ``data`` in ``directory`` and :func:`check_file` it inside ``bound(HEADROOM_BYTES)``."""
    path = directory / f"hostile{suffix}"
    path.write_bytes(data)
    with bound(HEADROOM_BYTES):
        return check_file(path)


def overwrite(data: bytes, offset: int, value: int, width: int, order: str) -> bytes:
    """``data`` with ``value`` (two's complement, truncated to ``width`` bytes) written at ``offset``."""
    field = (value % 2 ** (8 * width)).to_bytes(width, order)
    return data[:offset] + field + data[offset + width :]


# ---- properties over hostile files ----


@dataclass(frozen=True)
class HostileFile:
    """A drawn file and what reading it must give besides a clear refusal or correct samples."""

    data: bytes = field(repr=False)
    suffix: str = ".wav"  # libsndfile guesses some formats from it
    prefix_of: np.ndarray | None = field(default=None, repr=False)  # accepted samples must start this signal
    refusal: str | None = None  # the file must be refused with this in the message
    accepted: bool = False  # the file must be read


def check_hostile_file(drawn: HostileFile, directory: Path, bound: Callable) -> str:
    """Write ``drawn`` in ``directory`` and check reading it (as :func:`check_bytes`); ``"refused"`` or ``"accepted"``."""
    outcome, samples = check_bytes(drawn.data, directory, bound, drawn.suffix)
    if drawn.refusal is not None:
        assert outcome == "refused", f"accepted a file that must be refused for {drawn.refusal!r}"
        with pytest.raises(AudioError, match=re.escape(drawn.refusal)):
            load(directory / f"hostile{drawn.suffix}")
    assert outcome == "accepted" or not drawn.accepted, "refused a file that must be read"
    if outcome == "accepted" and drawn.prefix_of is not None:
        assert len(samples) <= len(drawn.prefix_of)
        np.testing.assert_array_equal(samples, drawn.prefix_of[: len(samples)])
    return outcome


def suffix(index: int) -> str:
    return "." + FORMATS[index][0].lower()


def cut(index: int, fraction: float) -> HostileFile:
    data = encoded(index)
    prefix_of = load_bytes(data) if FORMATS[index][:3] == ("WAV", "PCM_16", TARGET_SR) else None
    return HostileFile(data[: int(len(data) * fraction)], suffix(index), prefix_of)


def flipped(index: int, flips: list[tuple[float, int]]) -> HostileFile:
    data = bytearray(encoded(index))
    for where, mask in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= mask
    return HostileFile(bytes(data), suffix(index))


def with_special_samples(positions: list[float], value: float, rate: int, channels: int) -> HostileFile:
    """A float WAV with ``value`` (NaN, Inf, huge) in channel 0 at ``positions``: refused at the first."""
    x = signal(rate, channels, seconds=0.4)
    frames = sorted({min(int(p * len(x)), len(x) - 1) for p in positions})
    x[frames, 0] = value
    buffer = io.BytesIO()
    sf.write(buffer, x, rate, format="WAV", subtype="FLOAT")
    where = f"at frame {frames[0]} ({frames[0] / rate:.3f} s)"
    refusal = f"non-finite sample ({value}) {where}" if not np.isfinite(value) else f"{where} is beyond +-2^31"
    return HostileFile(buffer.getvalue(), ".wav", refusal=refusal)


def with_denormals(exponent: int, sign: float, rate: int) -> HostileFile:
    """A float WAV of denormal samples (and zeros): read exactly at 16 kHz."""
    x = np.full(rate // 4, sign * 2.0**exponent, np.float32)
    x[::3] = 0.0
    buffer = io.BytesIO()
    sf.write(buffer, x, rate, format="WAV", subtype="FLOAT")
    return HostileFile(buffer.getvalue(), ".wav", prefix_of=x if rate == TARGET_SR else None, accepted=True)


magic = st.sampled_from([b"", b"RIFF", b"RIFF\xff\xff\xff\xffWAVEfmt ", b"fLaC", b"OggS", b"FORM", b".snd", b"caff"])
format_index = st.integers(0, len(FORMATS) - 1)
# Huge values at least 4x the bound: mixed down with a normal channel they stay beyond it.
special_values = st.sampled_from([np.nan, np.inf, -np.inf, 1e20, -3.4e38, MAX_SAMPLE_MAGNITUDE * 4])
# Case name -> strategy of hostile files.
HOSTILE_FILES: dict[str, st.SearchStrategy[HostileFile]] = {
    "random bytes": st.builds(lambda head, body: HostileFile(head + body, ".wav"), magic, st.binary(max_size=600)),
    "cut at any byte": st.builds(cut, format_index, st.floats(0, 1)),
    "header field overwritten": st.builds(
        lambda index, offset, value, width, order: HostileFile(
            overwrite(encoded(index), offset, value, width, order), suffix(index)
        ),
        format_index,
        st.integers(0, 79),
        st.sampled_from(EXTREME_FIELDS),
        st.sampled_from([2, 4, 8]),
        st.sampled_from(["little", "big"]),
    ),
    "bytes flipped": st.builds(
        flipped, format_index, st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=8)
    ),
    "NaN, Inf or huge samples": st.builds(
        with_special_samples,
        st.lists(st.floats(0, 1), min_size=1, max_size=4),
        special_values,
        st.sampled_from([16000, 44100]),
        st.sampled_from([1, 2]),
    ),
    "denormal samples": st.builds(
        with_denormals, st.integers(-149, -126), st.sampled_from([-1.0, 1.0]), st.sampled_from([16000, 8000])
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_FILES))
def test_hostile_files_are_refused_clearly_or_read_correctly(tmp_path_factory, case, bounded_address_space):
    outcomes = []

    @settings(max_examples=examples())
    @given(drawn=HOSTILE_FILES[case])
    def property_(drawn):
        outcomes.append(check_hostile_file(drawn, tmp_path_factory.mktemp("hostile"), bounded_address_space))

    property_()
    reached = {"random bytes": {"refused"}, "NaN, Inf or huge samples": {"refused"}, "denormal samples": {"accepted"}}
    assert reached.get(case, {"refused", "accepted"}) <= set(outcomes)  # the strategies reach both sides


def load_bytes(data: bytes) -> np.ndarray:
    with sf.SoundFile(io.BytesIO(data)) as handle:
        return handle.read(dtype="float32")


# ---- declared sizes and rates ----


def flac_total_samples(data: bytes, total: int) -> bytes:
    """FLAC STREAMINFO's 36-bit total-samples field (after 'fLaC', the block header and 10 bytes) set to ``total``."""
    offset = 4 + 4 + 10
    bits = int.from_bytes(data[offset : offset + 8], "big")
    bits = (bits & ~(2**36 - 1)) | total
    return data[:offset] + bits.to_bytes(8, "big") + data[offset + 8 :]


def chunk_field(data: bytes, chunk: bytes, after: int, value: int, width: int, order: str) -> bytes:
    """Overwrite the field ``after`` bytes past the first occurrence of ``chunk``."""
    return overwrite(data, data.index(chunk) + after, value, width, order)


HUGE_SIZES = {
    "wav data size": (0, lambda d: chunk_field(d, b"data", 4, 0xFFFFFFF0, 4, "little")),
    "wav riff size": (0, lambda d: overwrite(d, 4, 0xFFFFFFF0, 4, "little")),
    "wav data size just past the file": (0, lambda d: chunk_field(d, b"data", 4, len(d) * 2, 4, "little")),
    "flac 2^36 - 1 frames": (4, lambda d: flac_total_samples(d, 2**36 - 1)),
    "flac 2^32 frames": (4, lambda d: flac_total_samples(d, 2**32)),
    "aiff 2^31 frames": (7, lambda d: chunk_field(d, b"COMM", 10, 2**31, 4, "big")),
    "aiff ssnd size": (7, lambda d: chunk_field(d, b"SSND", 4, 0xFFFFFFF0, 4, "big")),
    "au data size": (8, lambda d: overwrite(d, 8, 0xFFFFFFF0, 4, "big")),
    "w64 data size": (10, lambda d: chunk_field(d, b"data", 16, 2**62, 8, "little")),
    "rf64 ds64 sizes": (11, lambda d: chunk_field(d, b"ds64", 16, 2**62, 8, "little")),
    "nist sample_count": (  # the header keeps its 1024 bytes: the 8 more digits take 8 of its padding zeros
        12,
        lambda d: d.replace(
            b"sample_count -i 4800\nend_head\n" + bytes(8), b"sample_count -i 999999999999\nend_head\n"
        ),
    ),
}


@pytest.mark.parametrize("case", list(HUGE_SIZES))
def test_huge_declared_sizes_read_what_is_there(tmp_path, case, bounded_address_space):
    index, mutate = HUGE_SIZES[case]
    data = encoded(index)
    mutated = mutate(data)
    assert mutated != data
    outcome, samples = check_bytes(mutated, tmp_path, bounded_address_space, "." + FORMATS[index][0].lower())
    if outcome == "accepted":  # never more than the data holds (resampled to 16 kHz)
        rate = FORMATS[index][2]
        assert len(samples) <= math.ceil(len(load_bytes(data)) * TARGET_SR / rate)


def wav_with_rate(rate: int) -> bytes:
    data = bytearray(encoded(0))
    data[24:28] = struct.pack("<I", rate)
    data[28:32] = struct.pack("<I", rate * 2)  # byte rate, kept consistent
    return bytes(data)


@pytest.mark.parametrize(
    ("rate", "reason"),
    [
        (1, "unsupported sample rate: 1 Hz"),
        (MIN_SAMPLE_RATE - 1, f"unsupported sample rate: {MIN_SAMPLE_RATE - 1} Hz"),
        (MAX_SAMPLE_RATE + 1, f"unsupported sample rate: {MAX_SAMPLE_RATE + 1} Hz"),
        (2**31 - 1, "unsupported sample rate: 2147483647 Hz"),
        (16001, "cannot resample 16001 Hz to 16000 Hz: their ratio needs a 1,955 MiB filter"),
        (44101, "cannot resample 44101 Hz to 16000 Hz"),
    ],
)
def test_hostile_header_rates_are_refused_before_allocating(tmp_path, rate, reason, bounded_address_space):
    """16001 Hz took 15 s and 8.6 GB before it was refused; now nothing is attempted (128 MiB to spare)."""
    path = tmp_path / "rate.wav"
    path.write_bytes(wav_with_rate(rate))
    for read in (load, lambda p: list(iter_blocks(p, BLOCK_SAMPLES))):
        with (
            bounded_address_space(128 * 2**20),
            pytest.raises(AudioError, match=f"^{re.escape(str(path))}: ") as caught,
        ):
            read(path)
        assert reason in str(caught.value)
    if MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:  # a plausible rate: read as it is, no filter needed
        samples, native = load(path, target_sr=None)
        assert native == rate and len(samples) == len(signal(16000, 1))


def test_rate_arguments_are_bounded():
    with pytest.raises(ValueError, match=f"target_sr must be <= MAX_SAMPLE_RATE \\({MAX_SAMPLE_RATE} Hz\\), got"):
        load("samples/numbers.wav", target_sr=10**9)
    with pytest.raises(AudioError, match="cannot resample 16000 Hz to 16001 Hz"):
        load("samples/numbers.wav", target_sr=16001)
    with pytest.raises(ValueError, match="orig_sr and new_sr: cannot resample 16001 Hz to 16000 Hz"):
        Resampler(16001, 16000)


# ---- lengths, channels, rates ----


@pytest.mark.parametrize("index", range(len(FORMATS)))
def test_zero_frames_are_refused(tmp_path, index):
    fmt, subtype, rate, channels = FORMATS[index]
    path = tmp_path / f"empty.{fmt.lower()}"
    sf.write(path, np.zeros((0, channels), np.float32), rate, format=fmt, subtype=subtype)
    reasons = "zero samples|empty file|truncated|corrupt|not an audio file"
    with pytest.raises(AudioError, match=f"^{re.escape(str(path))}: .*({reasons})"):
        load(path)


@pytest.mark.parametrize("rate", [8000, 16000, 44100, 192000])
@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "AIFF"])
def test_a_single_frame_gives_its_resampled_length(tmp_path, rate, fmt):
    path = tmp_path / f"one.{fmt.lower()}"
    sf.write(path, np.array([0.25], np.float32), rate, format=fmt, subtype="PCM_16")
    outcome, samples = check_file(path)
    assert outcome == "accepted" and len(samples) == math.ceil(TARGET_SR / rate)
    if rate == TARGET_SR:
        assert samples.tolist() == [0.25]


@pytest.mark.parametrize("rate", [8000, 192000])
def test_eight_channels_at_8_and_192_khz_mix_and_resample_exactly(tmp_path, rate):
    x = signal(rate, MAX_CHANNELS, seconds=0.5, seed=rate)
    path = tmp_path / "octo.wav"
    sf.write(path, x, rate, subtype="FLOAT")
    outcome, samples = check_file(path)
    mono = torch.from_numpy(x.mean(axis=1, dtype=np.float32).astype(np.float64))
    expected = torchaudio.functional.resample(mono, rate, TARGET_SR).float().numpy()
    assert outcome == "accepted"
    np.testing.assert_allclose(samples, expected, rtol=0, atol=ULP)


# ---- sample values ----

finite_samples = st.lists(
    st.one_of(
        st.floats(-MAX_SAMPLE_MAGNITUDE, MAX_SAMPLE_MAGNITUDE, width=32),
        st.sampled_from([MAX_SAMPLE_MAGNITUDE, -MAX_SAMPLE_MAGNITUDE, 2.0**-149, 0.0]),
    ),
    min_size=1,
    max_size=64,
)


def _first_unusable_by_sample(samples: np.ndarray) -> int | None:
    """The rule, one sample at a time: the first NaN, Inf or magnitude beyond the bound."""
    for index, value in enumerate(samples.tolist()):
        if not abs(value) <= MAX_SAMPLE_MAGNITUDE:
            return index
    return None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_unusable_is_the_sample_by_sample_rule(dtype):
    """Its sum-of-squares shortcut never passes an unusable sample, nor refuses loud usable audio."""
    bound = dtype(MAX_SAMPLE_MAGNITUDE)
    beyond = np.nextafter(bound, dtype(np.inf))
    edge = st.sampled_from([bound, -bound, beyond, -beyond, np.nan, np.inf, -np.inf, dtype(0.0), dtype(2.0**-149)])
    values = st.one_of(st.floats(-MAX_SAMPLE_MAGNITUDE, MAX_SAMPLE_MAGNITUDE, width=32), edge)

    @settings(max_examples=examples())
    @given(pattern=st.lists(values, max_size=40), repeats=st.integers(1, 300), stride=st.integers(1, 3))
    def property_(pattern, repeats, stride):
        samples = np.tile(np.array(pattern, dtype), repeats)[::stride]  # any strides; +-2^31 tiled: sums past 2^62
        assert first_unusable(samples) == _first_unusable_by_sample(samples)

    property_()


def test_front_ends_stay_finite_on_every_sample_check_samples_accepts():
    """The bound is safe: the loudest accepted waveforms (square waves at +-2^31 too) give finite features."""

    @settings(max_examples=examples())
    @given(pattern=finite_samples, repeats=st.integers(1, 200))
    def property_(pattern, repeats):
        samples = np.tile(np.array(pattern, np.float32), repeats)
        check_samples(samples, "pattern")
        assert features_are_finite(samples)

    property_()


def test_check_samples_names_the_source_and_position():
    with pytest.raises(AudioError, match=r"^live: non-finite sample \(nan\) at frame 16002 \(1\.000 s\)$"):
        check_samples(np.array([0.0, 0.0, np.nan], np.float32), "live", offset=16000)
    with pytest.raises(AudioError, match=r"^live: sample 3e\+09 at frame 1 \(0\.000 s\) is beyond \+-2\^31"):
        check_samples(np.array([0.0, 3e9], np.float32), "live")
    check_samples(np.array([MAX_SAMPLE_MAGNITUDE, -MAX_SAMPLE_MAGNITUDE, 2.0**-149], np.float32), "live")


def wav_declaring(bits_per_sample: int, data: bytes, rate: int = TARGET_SR) -> bytes:
    """A mono WAVE_FORMAT_PCM file declaring ``bits_per_sample`` (in containers of whole bytes) around ``data``."""
    block_align = -(-bits_per_sample // 8)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * block_align, block_align, bits_per_sample)
    body = b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(("bits", "container"), [(7, 8), (12, 16), (20, 24), (28, 32)])
def test_narrow_samples_in_wider_containers_read_as_the_wav_spec_lays_them_out(tmp_path, bits, container):
    """WAVE PCM puts a sample of fewer bits than its container in the container's high bits, the rest zero."""
    width = container // 8
    rng = np.random.default_rng(bits)
    values = rng.integers(0, 2**bits, 4000, dtype=np.int64) << (container - bits)
    data = b"".join(int(v).to_bytes(width, "little") for v in values)
    if container > 8:  # signed, two's complement in the container's bytes
        data = b"".join(int(v - 2 ** (container - 1)).to_bytes(width, "little", signed=True) for v in values)
    narrow, whole = tmp_path / "narrow.wav", tmp_path / "whole.wav"
    narrow.write_bytes(wav_declaring(bits, data))
    whole.write_bytes(wav_declaring(container, data))
    expected, _ = load(whole)
    assert np.array_equal(load(narrow)[0], expected)
    assert np.array_equal(np.concatenate(list(iter_blocks(narrow, BLOCK_SAMPLES))), expected)


@pytest.mark.parametrize(("bits", "container"), [(7, 8), (12, 16), (20, 24), (28, 32)])
def test_narrow_samples_whose_padding_bits_are_set_are_refused(tmp_path, bits, container):
    width = container // 8
    samples = [0] * 5000 + [1] + [0] * 100  # frame 5000 sets the lowest (padding) bit of its container
    path = tmp_path / "narrow.wav"
    path.write_bytes(wav_declaring(bits, b"".join(v.to_bytes(width, "little") for v in samples)))
    padding = container - bits
    message = (
        f"{path}: sample at frame 5000 (0.312 s) does not fit the header's {bits} bits per sample "
        f"(the low {padding} bit{'s' if padding > 1 else ''} of its {container}-bit container "
        f"{'are' if padding > 1 else 'is'} set): the data is not laid out as the header says"
    )
    for read in (load, lambda p: list(iter_blocks(p, BLOCK_SAMPLES))):
        with pytest.raises(AudioError) as caught:
            read(path)
        assert str(caught.value) == message


@pytest.mark.parametrize("value", [b"\x00\x01\x02\x03", bytearray(b"\x00\x01"), "0.1 0.2"])
def test_bytes_and_text_are_not_samples(value):
    kind = type(value).__name__
    with pytest.raises(ValueError) as caught:
        as_samples("samples for stream 'live'", value)
    message = str(caught.value)
    assert message.startswith(f"samples for stream 'live' must be a 1-D float array of {TARGET_SR} Hz samples")
    assert f"got {kind}" in message and "np.frombuffer" in message


def test_a_stream_given_bytes_says_what_to_pass(tiny_asr_model):
    from audiomask.asr.recognizer import StreamingRecognizer

    model = tiny_asr_model(time_reduction=4, chunk_size=8, left_chunk=4)
    with StreamingRecognizer(model, overlap=False) as recognizer:
        stream = recognizer.open_stream("live")
        with pytest.raises(ValueError, match=r"^samples for stream 'live' must be a 1-D float array .* got bytes"):
            stream.accept(b"\x00\x01")
        stream.accept(np.zeros(1600, np.float32))  # the stream is still usable
        stream.finish()
