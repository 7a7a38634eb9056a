"""Audio input: read any file libsndfile reads, mix down to mono, resample, validate.

- :func:`load`: a whole file as float32 mono samples at ``target_sr``.
- :func:`iter_blocks`: the same samples in fixed-size blocks, read
  incrementally, so memory stays bounded for files of any length.
- :class:`Resampler`: the streaming resampler :func:`iter_blocks` uses, for
  live samples as well.

Files are read with soundfile (libsndfile: WAV PCM 16/24/32-bit and float,
FLAC, Ogg Vorbis/Opus, AIFF, ...). Several channels are mixed down by their
mean. Resampling is torchaudio's windowed-sinc filter
(``torchaudio.functional.resample`` defaults), computed in float64 and rounded
to float32 once: :class:`Resampler` applies the same filter with the overlap
between pushes carried over, so any chunking gives the samples of the
whole-file call (float64 sums differ from it by rounding noise only, far below
half a float32 ulp; the tests assert equality to within one ulp).

Every unusable input raises :class:`audiomask.AudioError` naming the file and
the reason. A file whose data ends before its header says it should is read
as far as its data goes, with a :class:`TruncatedAudioWarning` naming it.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio

from audiomask._validate import check_int
from audiomask.errors import AudioError

__all__ = [
    "MAX_CHANNELS",
    "TARGET_SR",
    "Resampler",
    "TruncatedAudioWarning",
    "iter_blocks",
    "load",
]

TARGET_SR = 16000  # Hz: the rate both front ends take
# 7.1 surround. Files with more channels are microphone arrays or ambisonics,
# whose channels cancel each other in a plain average: refused, not mixed.
MAX_CHANNELS = 8
# Leading bytes of the containers libsndfile reads: a file that starts like one
# but does not open has a corrupt header rather than being "not audio".
_AUDIO_MAGIC = (b"RIFF", b"RIFX", b"RF64", b"FORM", b"fLaC", b"OggS", b".snd", b"caff", b"riff", b"NIST")
# libsndfile's log line for a chunk whose declared size exceeds the file:
# "data : 32000 (should be 15978)" (WAV, W64, RF64) or "SSND : ..." (AIFF).
_SHORT_CHUNK = re.compile(r"^\s*(?:data|SSND)\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
# Writers that stream to a pipe cannot seek back to fill in the data size and
# leave a placeholder near 2 or 4 GiB (espeak-ng --stdout writes 0x7ffff000):
# such a size says "unknown", not "truncated".
_PLACEHOLDER_BYTES = 0x7FFF0000


class TruncatedAudioWarning(UserWarning):
    """The file's data ends before its header says it should; what is there was used."""


def _fail(path: Path, reason: str) -> AudioError:
    return AudioError(f"{path}: {reason}")


def _open(path: str | os.PathLike) -> tuple[sf.SoundFile, Path]:
    """Open ``path`` for reading, turning every failure into an :class:`AudioError`."""
    path = Path(path)
    if not path.exists():
        raise _fail(path, "no such file")
    if path.is_dir():
        raise _fail(path, "is a directory, not an audio file")
    try:
        with path.open("rb") as raw:
            head = raw.read(4)
    except OSError as err:
        raise _fail(path, f"cannot be read ({err.strerror})") from None
    if not head:
        raise _fail(path, "empty file (0 bytes)")
    try:
        handle = sf.SoundFile(path)
    except sf.LibsndfileError as err:
        if head in _AUDIO_MAGIC:
            raise _fail(path, f"corrupt or truncated header ({err.error_string})") from None
        raise _fail(path, f"not an audio file ({err.error_string})") from None
    try:
        _check_header(handle, path)
    except AudioError:
        handle.close()
        raise
    return handle, path


def _check_header(handle: sf.SoundFile, path: Path) -> None:
    """Refuse what cannot become mono samples; warn about data cut short."""
    if not 1 <= handle.channels <= MAX_CHANNELS:
        raise _fail(
            path,
            f"unsupported channel layout: {handle.channels} channels (1 to {MAX_CHANNELS} are mixed down to mono)",
        )
    log = handle.extra_info
    truncated = None
    for declared, actual in _SHORT_CHUNK.findall(log):
        if int(actual) < int(declared) < _PLACEHOLDER_BYTES:
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


def _check_finite(samples: np.ndarray, path: Path, offset: int, sample_rate: int) -> None:
    finite = np.isfinite(samples)
    if not finite.all():
        index = offset + int(np.argmin(finite))
        value = samples[index - offset]
        raise _fail(path, f"non-finite sample ({value}) at frame {index} ({index / sample_rate:.3f} s)")


def _read_error(path: Path, err: sf.LibsndfileError, offset: int, sample_rate: int) -> AudioError:
    where = f"after frame {offset} ({offset / sample_rate:.3f} s)"
    return _fail(path, f"corrupt or truncated audio data {where} ({err.error_string})")


def _check_count(path: Path, read: int, declared: int) -> None:
    """Refuse a file that gave no samples; warn when it gave fewer than its header declares."""
    if read == 0:
        raise _fail(path, "zero samples")
    if read < declared:
        warnings.warn(
            f"{path}: truncated: {read} of the {declared} frames its header declares could be read",
            TruncatedAudioWarning,
            stacklevel=3,
        )


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
            NaN/Inf samples, or too many channels; the message names the file.

    >>> samples, sr = load("samples/stereo_44k.wav")   # 44.1 kHz stereo, 3.04 s
    >>> samples.dtype, samples.shape, sr
    (dtype('float32'), (48561,), 16000)
    """
    handle, path = _open(path)
    with handle:
        rate = handle.samplerate
        try:
            block = handle.read(dtype="float32", always_2d=True)
        except sf.LibsndfileError as err:
            raise _read_error(path, err, handle.tell(), rate) from None
        declared = handle.frames
    samples = _mono(block)
    del block
    _check_count(path, len(samples), declared)
    _check_finite(samples, path, 0, rate)
    if target_sr is None:
        return samples, rate
    target_sr = check_int("target_sr", target_sr, minimum=1)
    if target_sr == rate:
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
        target_sr = check_int("target_sr", target_sr, minimum=1)
    handle, path = _open(path)
    with handle:
        rate = handle.samplerate
        resampler = Resampler(rate, target_sr or rate)
        # Input frames that make about one output block (at least one frame).
        read_frames = max(1, math.ceil(block_samples * rate / (target_sr or rate)))
        pending = np.empty(0, dtype=np.float32)
        offset = 0
        while True:
            try:
                block = handle.read(read_frames, dtype="float32", always_2d=True)
            except sf.LibsndfileError as err:
                raise _read_error(path, err, offset, rate) from None
            if len(block) == 0:
                break
            samples = _mono(block)
            _check_finite(samples, path, offset, rate)
            offset += len(samples)
            out = resampler.push(samples)
            pending = np.concatenate((pending, out)) if len(pending) else out
            full = len(pending) // block_samples * block_samples
            for start in range(0, full, block_samples):
                yield pending[start : start + block_samples]
            pending = pending[full:]
        declared = handle.frames
    _check_count(path, offset, declared)
    pending = np.concatenate((pending, resampler.flush()))
    for start in range(0, len(pending), block_samples):
        yield pending[start : start + block_samples]


class Resampler:
    """Streaming resampler: ``push`` chunks, then ``flush``; the output equals the whole-signal call.

    Applies torchaudio's windowed-sinc kernel (the one
    ``torchaudio.functional.resample(x, orig_sr, new_sr)`` uses) as a
    polyphase convolution with stride ``orig_sr / g`` (``g`` = gcd of the
    rates), in float64. Each push computes every output whose input window lies
    inside the samples seen so far and keeps the rest (under
    ``2 * width + orig_sr / g`` input samples, ``width`` = the kernel's half
    span); ``flush`` pads the end with zeros, as the offline call does, and cuts
    the output to ``ceil(N * new_sr / orig_sr)`` samples for ``N`` pushed.
    Latency: ``width + orig_sr / g`` input samples. Equal rates pass the
    samples through unchanged, as ``torchaudio.functional.resample`` does.

    Args:
        orig_sr: input rate in Hz, ``>= 1``.
        new_sr: output rate in Hz, ``>= 1``.

    >>> r = Resampler(48000, 16000)
    >>> x = np.sin(np.arange(4800, dtype=np.float32) * 0.01)
    >>> y = np.concatenate([r.push(x[:1000]), r.push(x[1000:]), r.flush()])
    >>> y.dtype, len(y)
    (dtype('float32'), 1600)
    >>> ref = torchaudio.functional.resample(torch.from_numpy(x).double(), 48000, 16000).float().numpy()
    >>> bool(np.abs(y - ref).max() <= np.spacing(np.float32(1)))
    True
    """

    def __init__(self, orig_sr: int, new_sr: int) -> None:
        orig_sr = check_int("orig_sr", orig_sr, minimum=1)
        new_sr = check_int("new_sr", new_sr, minimum=1)
        self._identity = orig_sr == new_sr
        self._pushed = 0
        self._emitted = 0
        self._flushed = False
        if self._identity:
            return
        reference = torchaudio.transforms.Resample(orig_sr, new_sr, dtype=torch.float64)
        self._stride = orig_sr // reference.gcd  # input samples per group of new_sr / g outputs
        self._ratio = (new_sr // reference.gcd, self._stride)
        self._kernel = reference.kernel  # (new_sr / g, 1, 2 * width + stride)
        self._width = reference.width
        self._span = self._kernel.shape[-1]
        self._held = torch.zeros(self._width, dtype=torch.float64)  # the offline call's left zero padding

    def _convolve(self, tail: torch.Tensor) -> np.ndarray:
        """Outputs of every full window of ``self._held + tail``; keep what the next windows need."""
        held = torch.cat((self._held, tail))
        windows = (len(held) - self._span) // self._stride + 1 if len(held) >= self._span else 0
        if windows == 0:
            self._held = held
            return np.empty(0, dtype=np.float32)
        used = held[: (windows - 1) * self._stride + self._span]
        out = torch.nn.functional.conv1d(used[None, None], self._kernel, stride=self._stride)
        self._held = held[windows * self._stride :]
        return out[0].T.reshape(-1).float().numpy()

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Resample the next chunk: ``(n,)`` float -> ``(m,)`` float32 of the outputs now known."""
        if self._flushed:
            raise ValueError("push after flush: this Resampler's stream has ended")
        samples = np.asarray(samples)
        if samples.ndim != 1:
            raise ValueError(f"samples must be 1-D, got shape {samples.shape}")
        if self._identity:
            return samples.astype(np.float32, copy=False)
        self._pushed += len(samples)
        out = self._convolve(torch.from_numpy(samples.astype(np.float64)))
        self._emitted += len(out)
        return out

    def flush(self) -> np.ndarray:
        """End the stream: the remaining ``(m,)`` float32 outputs."""
        if self._flushed:
            raise ValueError("flush called twice: this Resampler's stream has already ended")
        self._flushed = True
        if self._identity:
            return np.empty(0, dtype=np.float32)
        new, orig = self._ratio
        total = -(-self._pushed * new // orig)  # ceil, in exact integers
        out = self._convolve(torch.zeros(self._width + self._stride, dtype=torch.float64))
        return out[: total - self._emitted]
