"""Tiny encoder configs with random weights, shared by the encoder tests (CPU-cheap, every code path live)."""

from __future__ import annotations

import pytest
import torch

from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder, Qwen3ASRConfig, Qwen3ASREncoder

# bias_max_distance 20 < the longest test sequences, so the relative bias clips.
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


@pytest.fixture(autouse=True, scope="module")
def torch_one_thread():
    """One torch thread while a module's tiny models run (import this fixture into the module).

    Tiny models gain nothing from intra-op threads, and on a 2-core machine
    shared with other jobs the threads' spin-waiting made a streaming test
    25x slower (4.6 s vs 114 s).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter and buffer ~ N(0, 0.3^2) (``global_invstd`` around 1), so zero-initialised ones take part."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if tensor.is_floating_point() and "positional_embedding" not in name:
                noise = torch.randn(tensor.shape, generator=generator) * 0.3
                tensor.copy_(noise + (1.0 if name.endswith("global_invstd") else 0.0))
    return module.eval()


def tiny_phi4mm(seed: int = 0, **overrides: object) -> Phi4MMEncoder:
    return randomize(Phi4MMEncoder(Phi4MMAudioConfig(**{**PHI4MM_TINY, **overrides})), seed)


def tiny_qwen3_asr(seed: int = 0, **overrides: object) -> Qwen3ASREncoder:
    return randomize(Qwen3ASREncoder(Qwen3ASRConfig(**{**QWEN3_ASR_TINY, **overrides})), seed)


def max_valid_diff(outputs: torch.Tensor, reference: torch.Tensor, lengths: object) -> float:
    """Largest |outputs - reference| over each row's first ``lengths[b]`` positions (0 when none)."""
    diffs = [(outputs[b, :n] - reference[b, :n]).abs().max().item() for b, n in enumerate(lengths) if n]
    return max(diffs, default=0.0)
