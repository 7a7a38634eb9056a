"""The encoders the latency benchmark measures, by name, built once per run.

- ``shipped``: :func:`audiomask.asr.checkpoint.load_model` (the model inside the
  package) where it is there; until it is, a random model of the shipped
  architecture (:data:`~audiomask.asr.checkpoint.SHIPPED_ENCODER_CONFIG`), said so in the report. Float32, as shipped.
- ``phi4mm_full``: the full-size Phi-4MM encoder (``Phi4MMAudioConfig()``,
  441M parameters), random weights, bf16 on CUDA (float32 on the CPU).
- ``qwen3_asr_0.6b``: the Qwen3-ASR-0.6B audio encoder (:data:`QWEN3_ASR_06B`),
  random weights, bf16 on CUDA (float32 on the CPU).

Every model is an :class:`~audiomask.asr.model.ASRModel`: the random ones get a
CTC head of random weights over :data:`RANDOM_ALPHABET`, so that each runs
through the whole :class:`~audiomask.asr.driver.StreamingDriver`.

With ``quick`` the two full-size encoders are replaced by tiny stand-ins of the
same architecture (a smoke test of the code paths, not a measurement), which
the report says.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from audiomask.asr.checkpoint import SHIPPED_ENCODER_CONFIG
from audiomask.asr.decoding import CharTokenizer
from audiomask.asr.driver import StreamingDriver
from audiomask.asr.model import ASRModel
from audiomask.constants import FRAME_MS
from audiomask.features.process import lane_bounds
from audiomask.models import (
    Phi4MMAudioConfig,
    Phi4MMEncoder,
    Qwen3ASRConfig,
    Qwen3ASREncoder,
)
from audiomask.models.ctc import CTCHead
from audiomask.streaming import open_slots

__all__ = [
    "MODEL_NAMES",
    "QWEN3_ASR_06B",
    "TINY_PHI4MM",
    "TINY_QWEN3_ASR",
    "TINY_SHIPPED",
    "BenchModel",
    "build_model",
    "tiny_shipped_model",
]

MODEL_NAMES = ("shipped", "phi4mm_full", "qwen3_asr_0.6b")
# Qwen3-ASR-0.6B's audio encoder (Qwen/Qwen3-ASR-0.6B config.json, audio_config); the defaults are 1.7B's.
QWEN3_ASR_06B = Qwen3ASRConfig(encoder_layers=18, encoder_attention_heads=14, encoder_ffn_dim=3584, d_model=896)
RANDOM_ALPHABET = "abcdefghijklmnopqrstuvwxyz' "  # the CTC vocabulary of random models
# Tiny stand-ins of both architectures (every code path, CPU-cheap): ``--quick``, the soak, smoke tests.
TINY_PHI4MM = Phi4MMAudioConfig(
    hidden_size=32,
    intermediate_size=48,
    num_blocks=2,
    num_attention_heads=2,
    ext_pw_out_channel=32,
    depthwise_separable_out_channel=32,
    nemo_conv_channels=8,
)
TINY_QWEN3_ASR = Qwen3ASRConfig(
    encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=48, d_model=32, downsample_hidden_size=4
)
# TINY_PHI4MM with the shipped model's streaming settings (320 ms chunks, 8 left chunks): a server whose
# steps cost next to nothing, so that a load run measures the server's own work per connection.
TINY_SHIPPED = dataclasses.replace(
    TINY_PHI4MM,
    **{
        field: getattr(SHIPPED_ENCODER_CONFIG, field)
        for field in ("chunk_size", "left_chunk", "kernel_size", "time_reduction", "bias_max_distance")
    },
)
_SEED = 0  # random weights: the same every run


@dataclass
class BenchModel:
    """A model to measure: ``asr`` (encoder of either family, CTC head, tokenizer, front end) and its facts."""

    name: str
    device: torch.device
    dtype: torch.dtype
    source: str  # where the weights come from, in words
    asr: ASRModel
    quick: bool = False  # a tiny stand-in of the architecture (build_model's ``quick``)

    @property
    def encoder(self) -> Phi4MMEncoder | Qwen3ASREncoder:
        """The encoder of :attr:`asr`."""
        return self.asr.encoder

    @property
    def is_phi4mm(self) -> bool:
        """Whether the encoder is a Phi-4MM one (chunks of any whole number of tokens; else Qwen3-ASR's 1 s chunks)."""
        return isinstance(self.asr.encoder, Phi4MMEncoder)

    def driver(
        self,
        batch_size: int,
        chunk_size: int | None = None,
        left_chunk: int | None = None,
        *,
        cuda_graph: bool | None = None,
        lanes: int = 1,
        **options: object,
    ) -> StreamingDriver:
        """A :class:`~audiomask.asr.driver.StreamingDriver` of ``batch_size`` slots over this model.

        Phi-4MM: ``chunk_size`` tokens per chunk, ``left_chunk`` chunks of left context (both required).
        Qwen3-ASR: both ``None`` (its 1 s chunks in 8 s windows). ``cuda_graph``: replay the Phi-4MM chunk
        step as CUDA graphs (``None``: on CUDA); ``lanes``: the slots split into that many batches
        (:func:`~audiomask.features.process.lane_bounds`), a cycle a lane; ``options`` go to the driver
        (``overlap``, ...).
        """
        encoder = self.asr.encoder
        if self.is_phi4mm:
            if chunk_size is None or left_chunk is None:
                raise ValueError(f"chunk_size and left_chunk must be given for {self.name!r} (Phi-4MM)")
            chunk_ms = chunk_size * encoder.config.time_reduction * FRAME_MS
            chunking = {"chunk_ms": chunk_ms, "left_chunks": left_chunk}
        else:
            if chunk_size is not None or left_chunk is not None:
                raise ValueError(
                    f"chunk_size and left_chunk must be None for {self.name!r} (Qwen3-ASR streams fixed 1 s chunks), "
                    f"got {chunk_size!r} and {left_chunk!r}"
                )
            chunking = {}
        slots = [
            open_slots(encoder, hi - lo, **chunking, cuda_graph=cuda_graph) for lo, hi in lane_bounds(batch_size, lanes)
        ]
        return StreamingDriver(slots, self.asr.head, self.asr.frontend, **options)

    def info(self) -> dict:
        """JSON-ready: name, source, dtype, parameter count and the encoder config."""
        return {
            "name": self.name,
            "source": self.source,
            "dtype": str(self.dtype).removeprefix("torch."),
            "parameters": sum(p.numel() for p in self.encoder.parameters()),
            "config": dataclasses.asdict(self.encoder.config),
        }


def _random_asr(encoder: Phi4MMEncoder | Qwen3ASREncoder) -> ASRModel:
    """``encoder`` (eval mode) with a CTC head of random weights over :data:`RANDOM_ALPHABET`."""
    tokenizer = CharTokenizer(RANDOM_ALPHABET)
    return ASRModel(encoder.eval(), CTCHead(encoder.output_size, tokenizer.vocab_size).eval(), tokenizer)


def tiny_shipped_model() -> ASRModel:
    """The shipped model's architecture and streaming settings at tiny widths (:data:`TINY_SHIPPED`), random
    weights (the same every call) and a CTC head over :data:`RANDOM_ALPHABET`; float32, on the CPU."""
    torch.manual_seed(_SEED)
    return _random_asr(Phi4MMEncoder(TINY_SHIPPED))


def _shipped() -> tuple[ASRModel, str]:
    """The packaged model where it is there, else a random one of its architecture."""
    from audiomask.asr.checkpoint import DEFAULT_MODEL_PATH, load_model

    if DEFAULT_MODEL_PATH.is_file():
        return load_model(), f"audiomask.asr.checkpoint.load_model() ({DEFAULT_MODEL_PATH.name})"
    return _random_asr(Phi4MMEncoder(SHIPPED_ENCODER_CONFIG)), (
        "random weights of the shipped architecture (no packaged model yet)"
    )


def build_model(name: str, device: torch.device, *, quick: bool = False) -> BenchModel:
    """The model ``name`` (one of :data:`MODEL_NAMES`) on ``device``, eval mode.

    Full-size encoders are bf16 on CUDA and float32 on the CPU; with ``quick``
    they are tiny stand-ins (see the module docstring).
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"model must be one of {MODEL_NAMES}, got {name!r}")
    torch.manual_seed(_SEED)
    low_precision = torch.bfloat16 if device.type == "cuda" else torch.float32
    stand_in = "tiny stand-in of the architecture (--quick: not a measurement)"
    if name == "shipped":
        asr, source = _shipped()
        model = BenchModel(name, device, torch.float32, source, asr)
    else:
        if name == "phi4mm_full":
            encoder = Phi4MMEncoder(TINY_PHI4MM if quick else Phi4MMAudioConfig())
        else:
            encoder = Qwen3ASREncoder(TINY_QWEN3_ASR if quick else QWEN3_ASR_06B)
        source = stand_in if quick else "random weights"
        model = BenchModel(name, device, low_precision, source, _random_asr(encoder), quick)
    # Weights are moved once, at load time, as StreamingRecognizer does with a model it is given.
    for module in (model.asr.encoder, model.asr.head):
        module.to(device, model.dtype)
    return model
