"""Fixtures of the ASR tests: a tiny encoder and CTC head for the driver, the recognizer's tiny model, random
signals, offline references, what a stream alone transcribes, and clocks that stand still."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from audiomask.asr import recognizer as recognizer_module
from audiomask.asr.model import ASRModel
from audiomask.asr.recognizer import StreamingRecognizer
from audiomask.features import Phi4MMFrontend
from audiomask.models.ctc import CTCHead

VOCAB = 7  # the driver tests' CTC vocabulary


@pytest.fixture(scope="module")
def encoder(tiny_phi4mm):
    """The tiny random Phi-4MM encoder of the driver tests (CPU)."""
    return tiny_phi4mm()


@pytest.fixture(scope="module")
def head():
    """A random CTC head of :data:`VOCAB` tokens over the tiny encoder's 16-wide outputs (CPU)."""
    torch.manual_seed(0)
    return CTCHead(16, VOCAB).eval()


@pytest.fixture(scope="module")
def model(tiny_asr_model) -> ASRModel:
    """The recognizer tests' tiny model (one per module: some tests move it or patch its head)."""
    return tiny_asr_model()


@pytest.fixture(params=[(1, 0), (2, 1), (3, 2), (4, 100)], ids=lambda c: f"chunk{c[0]}-left{c[1]}")
def chunking(request) -> tuple[int, int]:
    """``(chunk_size tokens, left_chunk chunks)``; 100: all the past."""
    return request.param


def random_signals(seed: int, count: int, low: int = 400, high: int = 16000) -> list[np.ndarray]:
    """``count`` signals of white noise (RMS 0.1) of random lengths in ``[low, high)`` samples."""
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(int(n))).astype(np.float32) for n in rng.integers(low, high, count)]


def offline_outputs(encoder, samples: np.ndarray, chunk_size: int, left_chunk: int) -> torch.Tensor:
    """The whole-utterance ``hard``-masked forward of the offline features: ``(L, D)`` on the CPU."""
    features = torch.from_numpy(Phi4MMFrontend()(samples))
    with torch.no_grad():
        outputs, lengths = encoder(
            features[None], [len(features)], chunk_size=chunk_size, left_chunk=left_chunk, mask_mode="hard"
        )
    return outputs[0, : int(lengths[0])].cpu()


def joined_outputs(stream) -> torch.Tensor:
    """A driver stream's kept encoder outputs, joined over its chunks: ``(n, 16)``."""
    return torch.cat(stream.outputs) if stream.outputs else torch.zeros(0, 16)


def transcribe_alone(model: ASRModel, samples: np.ndarray, chunk_ms: int, left_chunks: int) -> str:
    """The text of ``samples`` streamed alone through a recognizer of its own."""
    with StreamingRecognizer(model, chunk_ms=chunk_ms, left_chunks=left_chunks) as recognizer:
        return recognizer.transcribe(samples)


@pytest.fixture(scope="session", name="random_signals")
def random_signals_fixture() -> Callable[..., list[np.ndarray]]:
    return random_signals


@pytest.fixture(scope="session", name="offline_outputs")
def offline_outputs_fixture() -> Callable[..., torch.Tensor]:
    return offline_outputs


@pytest.fixture(scope="session", name="joined_outputs")
def joined_outputs_fixture() -> Callable[..., torch.Tensor]:
    return joined_outputs


@pytest.fixture(scope="session", name="transcribe_alone")
def transcribe_alone_fixture() -> Callable[..., str]:
    return transcribe_alone


class FakeClock:
    """Seconds that stand still until a test moves :attr:`now`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recognizer_clock(fake_clock, monkeypatch) -> FakeClock:
    """The recognizers' clock (idle timeouts, how long a ready chunk has waited for the others), standing still."""
    monkeypatch.setattr(recognizer_module, "_clock", fake_clock)
    return fake_clock
