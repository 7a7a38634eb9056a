"""audiomask.features: the shared framer (offline, streamed, packed) and the banded mel product."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchaudio
from hypothesis import given, settings
from hypothesis import strategies as st

from audiomask.features.framing import Framing, StreamFramer, pack, reflect_index
from audiomask.features.frontend import MelBands, _split
from audiomask.features.phi4mm import kaldi_mel_banks

PHI = Framing(win=400, hop=160, pad=0, drop_last=False)
WHISPER = Framing(win=400, hop=160, pad=200, drop_last=True)
SMALL = Framing(win=5, hop=2, pad=2, drop_last=True)  # the same rules on a scale where edge cases are cheap


def reference_frames(framing: Framing, x: np.ndarray) -> np.ndarray:
    """Frames by the definition: np.pad(mode="reflect"), every full window, the last dropped if asked."""
    padded = np.pad(x, framing.pad, mode="reflect") if framing.pad and len(x) else x
    starts = range(0, len(padded) - framing.win + 1, framing.hop)
    frames = [padded[s : s + framing.win] for s in starts]
    if framing.drop_last and frames:
        frames.pop()
    return np.array(frames, dtype=np.float32).reshape(-1, framing.win)


def segment_frames(framing: Framing, segment: np.ndarray, count: int) -> np.ndarray:
    return np.array([segment[framing.hop * j : framing.hop * j + framing.win] for j in range(count)]).reshape(
        -1, framing.win
    )


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 40])
def test_reflect_index_is_numpy_reflect_padding(n):
    x = np.arange(n)
    for pad in (1, 2, 7, 30):
        np.testing.assert_array_equal(x[reflect_index(np.arange(-pad, n + pad), n)], np.pad(x, pad, mode="reflect"))


@pytest.mark.parametrize("framing", [PHI, WHISPER, SMALL])
def test_count_and_offline_frames_match_the_definition(framing):
    rng = np.random.default_rng(0)
    for n in list(range(0, 30)) + [159, 160, 199, 200, 201, 399, 400, 401, 559, 560, 1000]:
        x = rng.normal(size=n).astype(np.float32)
        expected = reference_frames(framing, x)
        assert framing.count(n) == len(expected), n
        count = framing.count(n)
        np.testing.assert_array_equal(
            segment_frames(framing, framing.segment(framing.pad_signal(x), count), count), expected
        )
    np.testing.assert_array_equal(
        framing.count(np.array([0, 400, 16000])), [framing.count(0), framing.count(400), framing.count(16000)]
    )


def stream_frames(framing: Framing, chunks: list[np.ndarray], min_samples: int = 0) -> np.ndarray:
    framer = StreamFramer(framing)
    pieces = [framer.push(chunk) for chunk in chunks]
    pieces.append(framer.flush(min_samples))
    return np.concatenate([segment_frames(framing, segment, count) for segment, count in pieces])


@pytest.mark.parametrize("framing", [PHI, WHISPER, SMALL])
@settings(max_examples=60)
@given(data=st.data())
def test_streamed_frames_equal_offline_frames_for_any_chunking(framing, data, cut):
    n = data.draw(st.integers(0, 3 * framing.win + 7), label="n")
    sizes = data.draw(st.lists(st.integers(0, 2 * framing.win), min_size=1, max_size=12).filter(any), label="sizes")
    x = np.random.default_rng(n).normal(size=n).astype(np.float32)
    np.testing.assert_array_equal(stream_frames(framing, cut(x, sizes) if len(x) else []), reference_frames(framing, x))


@pytest.mark.parametrize("framing", [WHISPER, SMALL])
def test_flush_zero_extends_to_min_samples(framing, cut):
    x = np.random.default_rng(1).normal(size=37).astype(np.float32)
    extended = np.concatenate([x, np.zeros(900 - len(x), np.float32)])
    np.testing.assert_array_equal(
        stream_frames(framing, cut(x, [5, 11]), min_samples=900), reference_frames(framing, extended)
    )


def test_push_returns_frames_as_soon_as_their_samples_are_in():
    framer = StreamFramer(WHISPER)
    assert framer.push(np.zeros(200, np.float32))[1] == 0  # the left reflection needs sample 200
    assert framer.push(np.zeros(1, np.float32))[1] == 1  # frame 0 spans [-200, 200)
    assert framer.push(np.zeros(159, np.float32))[1] == 1  # frame 1 spans [-40, 360)
    framer = StreamFramer(PHI)
    assert framer.push(np.zeros(399, np.float32))[1] == 0
    assert framer.push(np.zeros(1, np.float32))[1] == 1


def test_pack_lays_segments_at_hop_multiples_and_picks_their_frames():
    rng = np.random.default_rng(2)
    segments = [rng.normal(size=n).astype(np.float32) for n in (400, 0, 720, 401)]
    counts = [PHI.count(len(s)) for s in segments]
    packed = pack(segments, counts, PHI)
    frames = packed.flat.unfold(0, PHI.win, PHI.hop)[packed.rows()]
    expected = np.concatenate([segment_frames(PHI, s, c) for s, c in zip(segments, counts)])
    np.testing.assert_array_equal(frames.numpy(), expected)
    assert (packed.first * PHI.hop % PHI.hop == 0).all()
    assert pack([segments[2]], [counts[2]], PHI).rows() is None


def slaney_banks(bins: int, n_mels: int) -> np.ndarray:
    return (
        torchaudio.functional.melscale_fbanks(bins, 0.0, 8000.0, n_mels, 16000, norm="slaney", mel_scale="slaney")
        .double()
        .numpy()
    )


@pytest.mark.filterwarnings("ignore:At least one mel filterbank has all zero values")
@pytest.mark.parametrize("groups", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("frames", [1, 7, 255, 256, 257, 600])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_mel_bands_power_equals_the_dense_product(groups, frames, dtype):
    spectrum = torch.randn(frames, 201, dtype=dtype)
    # the Phi-4MM and Whisper banks, and one with all-zero filters (too many mels for the bins)
    for weights in (kaldi_mel_banks()[:201], slaney_banks(201, 128), slaney_banks(201, 200)):
        out = torch.empty(frames, weights.shape[1])
        power = torch.empty(frames, 201)
        MelBands(weights, groups).project_power(spectrum.clone(), power, out)
        torch.testing.assert_close(power, (spectrum.abs() ** 2).float(), rtol=1e-5, atol=1e-5)
        dense = (spectrum.abs() ** 2).double() @ torch.from_numpy(weights)
        torch.testing.assert_close(out, dense.float(), rtol=1e-5, atol=1e-5)


# Row ranges of a 600-frame call: 1-12 frames, odd counts, and ranges across the product's row blocks.
SHARES = [slice(0, n) for n in range(1, 13)] + [
    slice(start, start + n) for start in (1, 5, 254, 255, 300, 511) for n in (1, 2, 3, 5, 7, 11, 12, 89)
]
SHARES += [slice(7, 100), slice(40, 300), slice(0, 255), slice(0, 256), slice(1, 258), slice(3, 600)]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("bank", ["kaldi", "slaney"])
def test_a_frames_mel_power_does_not_depend_on_how_many_frames_share_its_call(bank, dtype):
    """Bit for bit: what lets any split of a driver's slots over front-end processes give the same features."""
    weights, groups, bins = (kaldi_mel_banks(), 3, 257) if bank == "kaldi" else (slaney_banks(201, 128), 5, 201)
    spectrum = torch.randn(600, bins, dtype=dtype, generator=torch.manual_seed(2))
    bands = MelBands(weights, groups)

    def mel(rows: slice) -> torch.Tensor:
        part = spectrum[rows].clone()
        out = torch.empty(len(part), weights.shape[1])
        bands.project_power(part, torch.empty(len(part), bins), out)
        return out

    whole = mel(slice(0, 600))
    for rows in SHARES:
        assert torch.equal(mel(rows), whole[rows]), rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_fft", [400, 512])
def test_a_frames_spectrum_does_not_depend_on_how_many_frames_share_its_rfft(n_fft, dtype):
    """The other batched product of the front ends: the FFT of a batch of frames, row by row the same."""
    frames = torch.randn(600, n_fft, dtype=dtype, generator=torch.manual_seed(3))
    whole = torch.fft.rfft(frames)
    for rows in SHARES:
        assert torch.equal(torch.fft.rfft(frames[rows].clone()), whole[rows]), rows


def brute_force_split_cost(first, end, groups):
    """Cheapest cost over every way of cutting the filters into <= groups consecutive runs."""
    from itertools import combinations

    n, best = len(first), np.inf
    for k in range(min(groups, n)):
        for cuts in combinations(range(1, n), k):
            bounds = [0, *cuts, n]
            best = min(
                best, sum((end[a:b].max() - first[a:b].min()) * (b - a) for a, b in zip(bounds[:-1], bounds[1:]))
            )
    return best


@settings(max_examples=80)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8)), min_size=1, max_size=8), st.integers(1, 4))
def test_split_is_optimal_and_covers_every_filter_once(filters, groups):
    first = np.array([f for f, _ in filters])
    end = first + np.array([w for _, w in filters])  # every filter spans at least one bin
    runs = _split(first, end, groups)
    assert runs[0][0] == 0 and runs[-1][1] == len(first) and len(runs) <= groups
    assert all(a[1] == b[0] for a, b in zip(runs[:-1], runs[1:]))
    cost = sum((hi_bin - lo_bin) * (hi - lo) for lo, hi, lo_bin, hi_bin in runs)
    assert cost == brute_force_split_cost(first, end, groups)
