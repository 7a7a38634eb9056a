"""Audio input: read any file libsndfile reads, mix down to mono, resample, validate.

- :func:`load`: a whole file as float32 mono samples at ``target_sr``.
- :func:`iter_blocks`: the same samples in fixed-size blocks, read
  incrementally, so memory stays bounded for files of any length.
- :func:`iter_stream_blocks`: the same from a pipe, FIFO or character
  device, as the samples arrive.
- :class:`~audiomask.resample.Resampler` (from :mod:`audiomask.resample`): the
  streaming resampler :func:`iter_blocks` uses, for live samples as well.

Files are read with soundfile (libsndfile: WAV PCM 16/24/32-bit and float,
FLAC, Ogg Vorbis/Opus, AIFF, ...). Several channels are mixed down by their
mean. Resampling is torchaudio's windowed-sinc filter
(``torchaudio.functional.resample`` defaults), computed in float64 and rounded
to float32 once: :class:`~audiomask.resample.Resampler` applies the same filter with the overlap
between pushes carried over, so any chunking gives the samples of the
whole-file call (float64 sums differ from it by rounding noise only, far below
half a float32 ulp; the tests assert equality to within one ulp).

Every unusable input raises :class:`audiomask.AudioError` naming the file and
the reason. A WAV or AIFF header may declare fewer bits per sample than the
bytes holding each (7 in 8, 12 in 16): the sample fills the high bits, the
rest are zero, so the container is read whole; a padding bit set is refused. A file whose data ends before its header says it should is read
as far as its data goes, with a :class:`TruncatedAudioWarning` naming it. Two
sizes say nothing about the data, so they never warn: the markers of writers
that stream to a pipe (a WAV data size of 0x7FFFF000, 0x7FFFFFFF or
0xFFFFFFFF: "unknown") and an MP3's frame count, which libsndfile estimates
from the file size and bit rate when the file has no Xing/Info tag (a cut MP3
is read as far as it goes).

Hostile files cannot make a reader allocate without bound: files are read in
blocks of :data:`READ_BLOCK_FRAMES`, never as one array of the size their
header declares (a FLAC header may declare 2^36 frames); sample rates outside
:data:`MIN_SAMPLE_RATE` .. :data:`MAX_SAMPLE_RATE` are refused (a 1 Hz header
would make every frame 16,000 output samples); and so are rate pairs whose
resampling filter exceeds :data:`MAX_RESAMPLE_FILTER_BYTES` (16001 -> 16000 Hz
needs a 2 GB filter: coprime rates make one filter phase per output sample).
Samples must be finite and within :data:`MAX_SAMPLE_MAGNITUDE`
(:func:`check_samples`): NaN, Inf or absurd values are refused, never
sanitised, so the front ends never turn them into NaN features.
"""

from __future__ import annotations

import errno
import math
import os
import re
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio

from audiomask.checks import check_int
from audiomask.constants import SAMPLE_RATE
from audiomask.errors import AudioError
from audiomask.resample import MAX_RESAMPLE_FILTER_BYTES, Resampler, resample_refusal
from audiomask.samples import MAX_SAMPLE_MAGNITUDE, check_samples, first_unusable

__all__ = [
    "MAX_CHANNELS",
    "MAX_RESAMPLE_FILTER_BYTES",
    "MAX_SAMPLE_MAGNITUDE",
    "MAX_SAMPLE_RATE",
    "MIN_SAMPLE_RATE",
    "READ_BLOCK_FRAMES",
    "TARGET_SR",
    "Resampler",
    "TruncatedAudioWarning",
    "check_samples",
    "iter_blocks",
    "iter_stream_blocks",
    "load",
]

TARGET_SR = SAMPLE_RATE  # Hz: the rate both front ends take
# 7.1 surround. Files with more channels are microphone arrays or ambisonics,
# whose channels cancel each other in a plain average: refused, not mixed.
MAX_CHANNELS = 8
# Hz. Below 4 kHz a recording holds no speech band at all (it would keep 0-2 kHz only); above
# 768 kHz (the highest rate converters offer) a header is corrupt, not audio.
MIN_SAMPLE_RATE = 4000
MAX_SAMPLE_RATE = 768000
# Frames per read, for load and iter_blocks alike: whatever a header declares, memory follows the
# data actually there (2 MiB a read at 8 channels). At least FLAC's largest block (65535 frames):
# when a corrupt header misstates block sizes, libsndfile fails reads shorter than a block.
# The same reads in both readers make them agree on whatever a damaged file gives.
READ_BLOCK_FRAMES = 2**16
# Leading bytes of the containers libsndfile reads: a file that starts like one
# but does not open has a corrupt header rather than being "not audio".
_AUDIO_MAGIC = (b"RIFF", b"RIFX", b"RF64", b"FORM", b"fLaC", b"OggS", b".snd", b"caff", b"riff", b"NIST")
# libsndfile's log line for a chunk whose declared size exceeds the file:
# "data : 32000 (should be 15978)" (WAV, W64, RF64) or "SSND : ..." (AIFF).
_SHORT_CHUNK = re.compile(r"^\s*(?:data|SSND)\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
# Writers that stream to a pipe cannot seek back to fill in the data size and leave a marker
# that says "unknown", not "truncated": 0x7ffff000 (sox, espeak-ng --stdout), 0x7fffffff
# (arecord), 0xffffffff (-1: ffmpeg). Any other size beyond the file's data is a truncation.
_UNKNOWN_SIZE_MARKERS = frozenset({0x7FFFF000, 0x7FFFFFFF, 0xFFFFFFFF})
# Formats whose frame count libsndfile estimates when the file does not state it (an MP3
# without a Xing/Info tag: file size / bit rate, which can overshoot the decoded frames).
_ESTIMATED_LENGTH_FORMATS = frozenset({"MP3"})
# A header may declare fewer bits per sample than the bytes holding each (WAV's wBitsPerSample 7, 12, 20;
# AIFF's sample size 12, 20). Both formats put such a sample in the container's high bits, the rest zero;
# libsndfile reads the container (subtype) whole, which is then exact, and logs the declared width as
# "Bit Width : 7" (WAV) or "Sample Size : 12" (AIFF). Data with a low (padding) bit set is refused.
_DECLARED_BITS = re.compile(r"^\s*(?:Bit Width|Sample Size)\s*:\s*(\d+)", re.MULTILINE)
_CONTAINER_BITS = {"PCM_S8": 8, "PCM_U8": 8, "PCM_16": 16, "PCM_24": 24, "PCM_32": 32}
_INT32_BITS = 32  # libsndfile's int32 reads put every container's bits at the top of 32


class TruncatedAudioWarning(UserWarning):
    """The file's data ends before its header says it should; what is there was used."""


def _fail(path: Path, reason: str) -> AudioError:
    return AudioError(f"{path}: {reason}")


def _open(path: str | os.PathLike, target_sr: int | None) -> tuple[sf.SoundFile, Path]:
    """Open ``path`` to be read at ``target_sr`` Hz (``None``: its own), turning every failure into an AudioError."""
    path = Path(path)
    missing = _missing_reason(path)
    if missing:
        raise _fail(path, missing)
    if path.is_dir():
        raise _fail(path, "is a directory, not an audio file")
    try:
        with path.open("rb") as raw:
            head = raw.read(4)
    except OSError as err:
        raise _fail(path, f"cannot be read ({err.strerror})") from None
    return _open_checked(path, path, head, target_sr, "file"), path


def _open_checked(source: Path | int, path: Path, head: bytes, target_sr: int | None, kind: str) -> sf.SoundFile:
    """``source`` (a path or a descriptor left open) opened and its header checked; failures name ``path``.

    ``head``: its first bytes, which tell a corrupt audio header from data that is no audio ``kind`` at all.
    """
    if not head:
        raise _fail(path, "empty file (0 bytes)")
    try:
        handle = sf.SoundFile(source, closefd=not isinstance(source, int))
    except sf.LibsndfileError as err:
        if head in _AUDIO_MAGIC:
            raise _fail(path, f"corrupt or truncated header ({err.error_string})") from None
        raise _fail(path, f"not an audio {kind} ({err.error_string})") from None
    try:
        _check_header(handle, path, target_sr)
    except AudioError:
        handle.close()
        raise
    return handle


def _missing_reason(path: Path) -> str | None:
    """Why ``path`` names no file (a symbolic link loop, a dangling link, nothing), or ``None`` when it does."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "symbolic link loop (too many levels of symbolic links)"
        if err.errno == errno.ENOENT and path.is_symlink():
            return f"dangling symbolic link (to {os.readlink(path)}, which does not exist)"
        if err.errno == errno.ENOTDIR:
            return "no such file (a part of its path is a file, not a directory)"
        return "no such file" if err.errno == errno.ENOENT else f"cannot be read ({err.strerror})"
    return None


def _check_header(handle: sf.SoundFile, path: Path, target_sr: int | None) -> None:
    """Refuse what cannot become mono samples at ``target_sr`` in bounded memory; warn about data cut short."""
    if handle.format == "RAW":
        # libsndfile guesses headerless data from the extension (.au -> 8 kHz u-law, .vox -> ADPCM):
        # a file with no header it knows is not audio to us, and its guessed decoding even changes
        # with the read sizes (a .au file whose magic is zeroed decodes differently read by read).
        raise _fail(path, f"not an audio file (no header libsndfile recognises; it would guess {handle.subtype})")
    if not 1 <= handle.channels <= MAX_CHANNELS:
        raise _fail(
            path,
            f"unsupported channel layout: {handle.channels} channels (1 to {MAX_CHANNELS} are mixed down to mono)",
        )
    if not MIN_SAMPLE_RATE <= handle.samplerate <= MAX_SAMPLE_RATE:
        raise _fail(
            path,
            f"unsupported sample rate: {handle.samplerate} Hz (audio is read at {MIN_SAMPLE_RATE} to "
            f"{MAX_SAMPLE_RATE} Hz; the header is likely corrupt)",
        )
    refusal = None if target_sr is None else resample_refusal(handle.samplerate, target_sr)
    if refusal:
        raise _fail(path, refusal)
    log = handle.extra_info
    truncated = None
    for declared, actual in _SHORT_CHUNK.findall(log):
        if int(actual) < int(declared) and int(declared) not in _UNKNOWN_SIZE_MARKERS:
            truncated = f"data ends after {actual} of the {declared} bytes its header declares"
    # libsndfile's Ogg reader decodes up to the last complete page of a cut
    # stream and reports only that much; its log says why the stream ended.
    if "ended unexpectedly" in log or "lacks an end-of-stream bit" in log:
        truncated = "the Ogg stream ends without its end-of-stream page"
    elif "Junk after the last page" in log:
        truncated = "the Ogg stream ends in a partial page"
    if handle.frames == 0:
        raise _fail(path, f"truncated: {truncated}" if truncated else "zero samples")
    if truncated:
        warnings.warn(
            f"{path}: truncated: {truncated}; using the {handle.frames} frames that are there",
            TruncatedAudioWarning,
            stacklevel=4,
        )


def _mono(block: np.ndarray) -> np.ndarray:
    """``(frames, channels)`` float32 -> ``(frames,)`` float32, the channels' mean."""
    if block.shape[1] == 1:
        return np.ascontiguousarray(block[:, 0])
    return block.mean(axis=1, dtype=np.float32)


def _mono_blocks(handle: sf.SoundFile, path: Path, read_frames: int = READ_BLOCK_FRAMES) -> Iterator[np.ndarray]:
    """The file's mono float32 samples, ``read_frames`` per read; the usable ones before a refusal.

    A read holding an unusable sample yields the samples before it, then
    raises the :class:`AudioError` of :func:`check_samples`.
    """
    rate = handle.samplerate
    narrow = _narrow_width(handle)
    offset = 0
    while True:
        try:
            block = handle.read(read_frames, dtype="int32" if narrow else "float32", always_2d=True)
        except sf.LibsndfileError as err:
            raise _read_error(path, err, offset, rate) from None
        if len(block) == 0:
            return
        if narrow:
            block, misfit = _narrow_samples(block, narrow[0])
            if misfit is not None:
                if misfit:
                    yield _mono(block[:misfit])
                raise _fail(path, _misfit_reason(offset + misfit, rate, *narrow))
        samples = _mono(block)
        first = first_unusable(samples)
        if first is not None:
            if first:
                yield samples[:first]
            check_samples(samples[first:], path, offset + first, rate)
        offset += len(samples)
        yield samples


def _narrow_width(handle: sf.SoundFile) -> tuple[int, int] | None:
    """``(declared, container)`` bits per sample of integer PCM declared narrower than its container, else ``None``."""
    container = _CONTAINER_BITS.get(handle.subtype)
    declared = _DECLARED_BITS.search(handle.extra_info)
    if container is None or declared is None or int(declared[1]) >= container:
        return None
    return int(declared[1]), container


def _narrow_samples(block: np.ndarray, declared: int) -> tuple[np.ndarray, int | None]:
    """``(frames, channels)`` int32 ``block`` as libsndfile's float32 samples (full scale 2^31 -> 1.0, exact
    below 25 bits), and its first frame with a bit set below its top ``declared`` (``None``: there is none)."""
    padding = (1 << (_INT32_BITS - declared)) - 1
    misfits = np.flatnonzero((block & padding).any(axis=1))
    return (block * 2.0**-31).astype(np.float32), (int(misfits[0]) if len(misfits) else None)


def _misfit_reason(frame: int, sample_rate: int, declared: int, container: int) -> str:
    """Why the sample at ``frame`` is refused: a padding bit below its ``declared`` of ``container`` bits is set."""
    padding = container - declared
    low = f"the low {padding} bit of" if padding == 1 else f"the low {padding} bits of"
    return (
        f"sample at frame {frame} ({frame / sample_rate:.3f} s) does not fit the header's {declared} bits per sample "
        f"({low} its {container}-bit container {'is' if padding == 1 else 'are'} set): the data is not laid out as "
        "the header says"
    )


def _read_error(path: Path, err: sf.LibsndfileError, offset: int, sample_rate: int) -> AudioError:
    where = f"after frame {offset} ({offset / sample_rate:.3f} s)"
    return _fail(path, f"corrupt or truncated audio data {where} ({err.error_string})")


def _declared_frames(handle: sf.SoundFile) -> int | None:
    """The frames the file's header declares; ``None`` where libsndfile's count is an estimate."""
    return None if handle.format in _ESTIMATED_LENGTH_FORMATS else handle.frames


def _check_count(path: Path, read: int, declared: int | None) -> None:
    """Refuse a file that gave no samples; warn when it gave fewer than its header declares."""
    if read == 0:
        raise _fail(path, "zero samples")
    if declared is not None and read < declared:
        warnings.warn(
            f"{path}: truncated: {read} of the {declared} frames its header declares could be read",
            TruncatedAudioWarning,
            stacklevel=3,
        )


def _check_target_sr(target_sr: object) -> int:
    target_sr = check_int("target_sr", target_sr, minimum=1)
    if target_sr > MAX_SAMPLE_RATE:
        raise ValueError(f"target_sr must be <= MAX_SAMPLE_RATE ({MAX_SAMPLE_RATE} Hz), got {target_sr}")
    return target_sr


def load(path: str | os.PathLike, target_sr: int | None = TARGET_SR) -> tuple[np.ndarray, int]:
    """Read a whole audio file as mono float32 samples at ``target_sr``.

    Args:
        path: any file libsndfile reads (WAV PCM 16/24/32-bit or float, FLAC,
            Ogg, AIFF, ...), at any sample rate, with 1 to :data:`MAX_CHANNELS`
            channels (mixed down by their mean).
        target_sr: output rate in Hz; ``None`` keeps the file's rate.

    Returns:
        ``(samples, sample_rate)``: ``(T,)`` C-contiguous float32 in the file's
        scale (full-scale PCM = +-1.0) and the rate in Hz.

    Raises:
        AudioError: missing, not audio, corrupt header or data, zero samples,
            NaN/Inf or absurd samples, samples wider than the bits per
            sample the header declares, too many channels, a sample rate outside
            ``MIN_SAMPLE_RATE .. MAX_SAMPLE_RATE`` or one that cannot be
            resampled to ``target_sr`` in bounded memory; the message names the file.
        ValueError: ``target_sr`` not an integer in ``1 .. MAX_SAMPLE_RATE``.

    Memory: the samples read (in blocks, so a header cannot inflate it) plus
    their concatenation, at most twice the mono float32 samples.

    >>> samples, sr = load("samples/stereo_44k.wav")   # 44.1 kHz stereo, 3.04 s
    >>> samples.dtype, samples.shape, sr
    (dtype('float32'), (48561,), 16000)
    """
    if target_sr is not None:
        target_sr = _check_target_sr(target_sr)
    handle, path = _open(path, target_sr)
    with handle:
        rate = handle.samplerate
        pieces = list(_mono_blocks(handle, path))
        declared = _declared_frames(handle)
    read = sum(len(piece) for piece in pieces)
    _check_count(path, read, declared)
    samples = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    del pieces
    if target_sr is None or target_sr == rate:
        return samples, rate
    resampled = torchaudio.functional.resample(torch.from_numpy(samples).double(), rate, target_sr)
    return resampled.float().numpy(), target_sr


def iter_blocks(
    path: str | os.PathLike,
    block_samples: int,
    target_sr: int | None = TARGET_SR,
) -> Iterator[np.ndarray]:
    """Yield a file's mono samples at ``target_sr`` in blocks, reading it incrementally.

    Concatenated, the blocks equal ``load(path, target_sr)[0]`` (to within one
    float32 ulp; see the module docstring). Memory stays bounded by a few
    blocks whatever the file's length. Checks happen as the data arrives: the
    file's header before the first block, NaN/Inf samples and read errors in
    the block where they occur (earlier blocks have then been yielded).

    Args:
        path: as for :func:`load`.
        block_samples: samples per yielded block at ``target_sr``, ``>= 1``;
            every block has exactly this many except the last (``1 ..
            block_samples``).
        target_sr: output rate in Hz; ``None`` keeps the file's rate.

    Yields:
        ``(block_samples,)`` float32 arrays (the last may be shorter).

    Raises:
        AudioError: as :func:`load`.

    >>> blocks = list(iter_blocks("samples/hello_world.wav", 16000))
    >>> [len(b) for b in blocks]
    [16000, 16000, 15412]
    """
    block_samples = check_int("block_samples", block_samples, minimum=1)
    if target_sr is not None:
        target_sr = _check_target_sr(target_sr)
    handle, path = _open(path, target_sr)
    yield from _resampled_blocks(handle, path, block_samples, target_sr, stream=False)


def iter_stream_blocks(
    fd: int,
    name: str,
    block_samples: int,
    target_sr: int | None = TARGET_SR,
) -> Iterator[np.ndarray]:
    """Yield the mono samples of audio arriving on the pipe, FIFO or character device ``fd``, as they arrive.

    Like :func:`iter_blocks`, for a source that cannot seek: the header is
    read once, from the start of the stream, and every block is yielded as
    soon as its samples (about one block of input) have arrived, so a live
    source gets its blocks at its own pace. Memory stays bounded by a few
    blocks. A header from a pipe has no reliable length (its writer cannot
    seek back to fill it in): a stream ends where its data ends, without a
    truncation warning. Formats libsndfile reads only from a seekable file
    (FLAC, Ogg, ...) are refused as not an audio stream.

    Args: ``fd``, an open readable descriptor (not closed here); ``name``,
    the source as errors name it (``"-"`` for stdin); ``block_samples`` and
    ``target_sr`` as for :func:`iter_blocks`, and so are the ``(block_samples,)``
    float32 blocks. Raises :class:`AudioError` as :func:`load`, naming ``name``.
    """
    block_samples = check_int("block_samples", block_samples, minimum=1)
    if target_sr is not None:
        target_sr = _check_target_sr(target_sr)
    path = Path(name)
    read, write = os.pipe()  # the stream, its first bytes put back, for libsndfile (which cannot un-read)
    head = _read_head(fd, len(_AUDIO_MAGIC[0]))
    relay = threading.Thread(target=_relay, args=(head, fd, write), name="audiomask-stream-relay", daemon=True)
    relay.start()
    try:
        handle = _open_checked(read, path, head, target_sr, "stream")
        yield from _resampled_blocks(handle, path, block_samples, target_sr, stream=True)
    finally:
        os.close(read)  # the relay's next write fails: it stops, and closes its end
        relay.join()


def _read_head(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of ``fd`` (fewer only at its end)."""
    head = b""
    while len(head) < size and (piece := os.read(fd, size - len(head))):
        head += piece
    return head


def _relay(head: bytes, source: int, sink: int) -> None:
    """``head``, then the rest of ``source``, into ``sink``, until ``source`` ends or ``sink``'s reader is gone."""
    try:
        data = head
        while data:
            view = memoryview(data)
            while view:
                view = view[os.write(sink, view) :]
            data = os.read(source, READ_BLOCK_FRAMES)
    except OSError:  # the reader closed its end (an error or an interrupt ended the stream early)
        pass
    finally:
        os.close(sink)


def _resampled_blocks(
    handle: sf.SoundFile, path: Path, block_samples: int, target_sr: int | None, *, stream: bool
) -> Iterator[np.ndarray]:
    """``handle``'s samples at ``target_sr`` in blocks; ``stream``: read one block at a time, trust no length."""
    with handle:
        rate = handle.samplerate
        resampler = Resampler(rate, target_sr or rate)
        # Input frames that make about one output block: the resampler's float64 temporaries
        # stay a few blocks in size whatever the size of a read.
        push_frames = max(1, math.ceil(block_samples * rate / (target_sr or rate)))
        read_frames = min(push_frames, READ_BLOCK_FRAMES) if stream else READ_BLOCK_FRAMES
        pending = np.empty(0, dtype=np.float32)
        offset = 0
        for samples in _mono_blocks(handle, path, read_frames):
            offset += len(samples)
            for first in range(0, len(samples), push_frames):
                out = resampler.push(samples[first : first + push_frames])
                pending = np.concatenate((pending, out)) if len(pending) else out
                full = len(pending) // block_samples * block_samples
                for start in range(0, full, block_samples):
                    yield pending[start : start + block_samples]
                pending = pending[full:]
        declared = None if stream else _declared_frames(handle)
    _check_count(path, offset, declared)
    pending = np.concatenate((pending, resampler.flush()))
    for start in range(0, len(pending), block_samples):
        yield pending[start : start + block_samples]
