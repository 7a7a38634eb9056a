"""Shared test settings and fixtures.

- The ``gpu`` marker skips cleanly where CUDA is absent.
- Every test module runs with one torch thread: tiny models gain nothing
  from intra-op threads, and on a 2-core machine their spin-waiting made a
  streaming test 25x slower.
- Session fixtures that return factories (``cut``, ``noise``,
  ``tiny_phi4mm``, ``tiny_qwen3_asr``, ``tiny_asr_model``) are the one place
  each test input is defined; tests take them as arguments and never import
  one another.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

from audiomask.asr.decoding import CharTokenizer
from audiomask.asr.model import ASRModel
from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder, Qwen3ASRConfig, Qwen3ASREncoder
from audiomask.models.ctc import CTCHead

# CI and developer machines have 2 cores: keep property tests bounded but real.
settings.register_profile("default", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")

# The tiny encoders: every code path live, CPU-cheap. bias_max_distance 20 < the longest
# test sequences, so the relative bias clips.
PHI4MM_TINY = {
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_blocks": 2,
    "num_attention_heads": 2,
    "ext_pw_out_channel": 16,
    "depthwise_separable_out_channel": 16,
    "nemo_conv_channels": 4,
    "bias_max_distance": 20,
}
QWEN3_ASR_TINY = {
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "d_model": 16,
    "downsample_hidden_size": 4,
}
TINY_ALPHABET = "abcdefghijklmnopqrstuvwxyz '"


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    return torch.cuda.is_available()


# The second tier (`python -m pytest -m system`, run by .ci/run after the first): tests that start real
# servers, a browser, Ray, speech synthesis, soaks or whole benchmark runs, by the fixtures they take or
# their module. The first tier (`python -m pytest`, addopts `-m "not system"`) is everything else.
SYSTEM_FIXTURES = frozenset({"start_server", "server_url", "served", "quick_report"})
SYSTEM_MODULES = frozenset(
    {
        "tests/asr/test_soak.py",
        "tests/bench/test_churn.py",
        "tests/bench/test_pipe.py",
        "tests/bench/test_server_script.py",
        "tests/recipes/test_card.py",
        "tests/recipes/test_corpus.py",
        "tests/recipes/test_evaluate.py",
        "tests/recipes/test_train.py",
        "tests/serve/test_browser.py",
        "tests/serve/test_churn.py",
        "tests/serve/test_lifecycle.py",
        "tests/serve/test_ray.py",
        "tests/serve/test_replicas.py",
        "tests/serve/test_workers.py",
    }
)


def _second_tier(item: pytest.Item, root: str) -> bool:
    module = str(item.path.relative_to(root)) if item.path.is_relative_to(root) else ""
    return module in SYSTEM_MODULES or not SYSTEM_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    system = pytest.mark.system
    for item in items:
        if _second_tier(item, str(config.rootpath)):
            item.add_marker(system)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True, scope="module")
def torch_one_thread():
    """One torch thread while a module's tests run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cut(samples: np.ndarray, sizes) -> list[np.ndarray]:
    """``samples`` cut into consecutive chunks of ``sizes`` (cycled until the samples run out)."""
    sizes = list(sizes)
    if not any(sizes):
        raise ValueError(f"sizes must hold a positive size, got {sizes}")
    chunks, start, i = [], 0, 0
    while start < len(samples):
        size = sizes[i % len(sizes)]
        chunks.append(samples[start : start + size])
        start += size
        i += 1
    return chunks


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter and buffer ~ N(0, 0.3^2) (``global_invstd`` around 1), so zero-initialised ones take part."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if tensor.is_floating_point() and "positional_embedding" not in name:
                noise = torch.randn(tensor.shape, generator=generator) * 0.3
                tensor.copy_(noise + (1.0 if name.endswith("global_invstd") else 0.0))
    return module.eval()


def make_tiny_phi4mm(seed: int = 0, **overrides: object) -> Phi4MMEncoder:
    """A random-weight Phi-4MM encoder of :data:`PHI4MM_TINY` (``overrides`` replace config fields)."""
    return randomize(Phi4MMEncoder(Phi4MMAudioConfig(**{**PHI4MM_TINY, **overrides})), seed)


def make_tiny_qwen3_asr(seed: int = 0, **overrides: object) -> Qwen3ASREncoder:
    """A random-weight Qwen3-ASR encoder of :data:`QWEN3_ASR_TINY` (``overrides`` replace config fields)."""
    return randomize(Qwen3ASREncoder(Qwen3ASRConfig(**{**QWEN3_ASR_TINY, **overrides})), seed)


def noise(seed: int, n: int) -> np.ndarray:
    """``n`` samples of noise whose loudness jumps every 0.1 s (varied features, so texts are not one character)."""
    rng = np.random.default_rng(seed)
    envelope = np.repeat(10.0 ** rng.uniform(-4, 0, n // 1600 + 1), 1600)[:n]
    return (envelope * rng.standard_normal(n)).astype(np.float32)


def make_tiny_asr_model(
    seed: int = 0,
    alphabet: str = TINY_ALPHABET,
    *,
    family: str = "phi4mm",
    varied_text: bool = True,
    **overrides: object,
) -> ASRModel:
    """A tiny random encoder, a CTC head and a character tokenizer.

    ``family``: ``"phi4mm"`` (:func:`make_tiny_phi4mm`) or ``"qwen3_asr"``
    (:func:`make_tiny_qwen3_asr`); ``overrides`` replace encoder config fields
    (say ``time_reduction=4, chunk_size=8, left_chunk=4``: the shipped model's
    streaming layout, which a model file saved with ``save_model`` carries as
    its defaults). ``varied_text``: the tiny random encoders' outputs barely
    move over time, so the head centres and amplifies them (measured on
    :func:`noise`): its argmax changes from token to token, and texts are not
    a single character. The amplification magnifies rounding too (float16
    weights move the log-probabilities by ~0.6); ``False`` keeps the head as
    initialised.
    """
    tokenizer = CharTokenizer(alphabet)
    phi4mm = {"phi4mm": True, "qwen3_asr": False}[family]
    encoder = (make_tiny_phi4mm if phi4mm else make_tiny_qwen3_asr)(seed, **overrides)
    torch.manual_seed(seed)
    head = CTCHead(encoder.output_size, tokenizer.vocab_size).eval()
    model = ASRModel(encoder, head, tokenizer)
    if varied_text:
        samples = noise(100, 32000)
        features = torch.from_numpy(model.frontend(samples))[None]
        with torch.no_grad():
            outputs, lengths = encoder(
                features, [model.frontend.num_frames(len(samples))], **({"mask_mode": "hard"} if phi4mm else {})
            )
            outputs = outputs[0, : int(lengths[0])]
            mean, spread = outputs.mean(0), outputs.std(0) + 1e-6
            head.proj.weight.copy_(head.proj.weight / spread * 3.0)
            head.proj.bias.copy_(-head.proj.weight @ mean)
    return model


def max_valid_diff(outputs: torch.Tensor, reference: torch.Tensor, lengths: object) -> float:
    """Largest |outputs - reference| over each row's first ``lengths[b]`` positions (0 when none)."""
    diffs = [(outputs[b, :n] - reference[b, :n]).abs().max().item() for b, n in enumerate(lengths) if n]
    return max(diffs, default=0.0)


@pytest.fixture(scope="session", name="cut")
def cut_fixture() -> Callable[..., list[np.ndarray]]:
    return cut


@pytest.fixture(scope="session", name="noise")
def noise_fixture() -> Callable[[int, int], np.ndarray]:
    return noise


@pytest.fixture(scope="session")
def tiny_phi4mm() -> Callable[..., Phi4MMEncoder]:
    return make_tiny_phi4mm


@pytest.fixture(scope="session")
def tiny_qwen3_asr() -> Callable[..., Qwen3ASREncoder]:
    return make_tiny_qwen3_asr


@pytest.fixture(scope="session")
def tiny_asr_model() -> Callable[..., ASRModel]:
    return make_tiny_asr_model


@pytest.fixture(scope="session", name="randomize")
def randomize_fixture() -> Callable[..., torch.nn.Module]:
    return randomize


@pytest.fixture(scope="session", name="max_valid_diff")
def max_valid_diff_fixture() -> Callable[..., float]:
    return max_valid_diff


# torch.cuda.set_sync_debug_mode("error") raises on the calls that synchronise (.item(), D2H copies,
# nonzero, ...), but not on everything (a pageable non_blocking copy, a full launch queue): so the call also
# runs behind ~100 ms of GPU work queued first (torch.cuda._sleep) and must return while that still runs.
GATE_MS = 100.0


@functools.cache
def _queue_filler() -> object:
    from audiomask.bench.harness import QueueFiller

    return QueueFiller("cuda")  # calibrated once


def _never_waits(call: Callable[[], object]) -> object:
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    _queue_filler().fill(GATE_MS)
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = call()  # a synchronising call raises here
        still_running = not torch.cuda.current_stream().query()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize()
    assert still_running, "the call waited for the GPU: the work queued before it had completed when it returned"
    return result


@pytest.fixture(scope="session")
def never_waits() -> Callable[[Callable[[], object]], object]:
    """``never_waits(call)``: ``call()``'s result, run behind :data:`GATE_MS` of GPU work queued first; the test
    fails when the call synchronised with the device or returned after that work was done (CUDA only)."""
    return _never_waits


@contextlib.contextmanager
def _bounded_address_space(headroom: int) -> Iterator[None]:
    """Let the process map at most ``headroom`` more bytes (RLIMIT_AS) while the block runs (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS bounds allocations on Linux only")
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + headroom if hard == resource.RLIM_INFINITY else min(mapped + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="session")
def bounded_address_space() -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """``with bounded_address_space(headroom):`` an allocation of more than ``headroom`` bytes raises MemoryError."""
    return _bounded_address_space


class _CpuOnlyTorchDevice(type):
    """The metaclass of a stand-in for ``torch.device`` as a torch build without CUDA has it: an index names no device."""

    real = torch.device

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, _CpuOnlyTorchDevice.real)

    def __call__(cls, *args: object) -> torch.device:
        if len(args) == 1 and isinstance(args[0], (int, np.integer)):
            raise RuntimeError("no accelerator is available to take a device index")
        return _CpuOnlyTorchDevice.real(*args)


@pytest.fixture
def cpu_only_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[type]:
    """torch as a build without CUDA has it, for this test: no CUDA device, and ``torch.device(int)`` raises.

    Returns the real ``torch.device``.
    """
    from audiomask.transfer import _resolve

    monkeypatch.setattr(torch, "device", _CpuOnlyTorchDevice("device", (), {}))
    monkeypatch.setattr(_resolve, "_cuda_device_count", lambda: 0)
    _resolve._resolve_cached.cache_clear()  # resolved with CUDA (on a GPU machine) by earlier tests
    yield _CpuOnlyTorchDevice.real
    _resolve._resolve_cached.cache_clear()  # and resolved without it here


@pytest.fixture
def in_triton_interpreter() -> Callable[[str], None]:
    """``run(code)``: ``code`` in a fresh interpreter under Triton's CPU interpreter (``TRITON_INTERPRET=1``, read
    when Triton is imported), from the repository root; fails with its stderr."""
    pytest.importorskip("triton")

    def run(code: str) -> None:
        env = dict(os.environ, TRITON_INTERPRET="1")
        result = subprocess.run(
            [sys.executable, "-c", code],
            check=False,
            cwd=Path(__file__).resolve().parents[1],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]

    return run


def assert_within_ulps(got: torch.Tensor, want: torch.Tensor, ulps: float, what: object) -> None:
    """``got`` (any device) has ``want``'s dtype and shape, and is within ``ulps`` units of that dtype's last place
    of it (relative to ``max(|want|, 1)``)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    error = ((got.cpu().double() - want.double()).abs() / want.double().abs().clamp(min=1.0)).max().item()
    assert error <= ulps * torch.finfo(want.dtype).eps, (what, error)
