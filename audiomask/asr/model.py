"""The model bundle a recognizer runs: encoder, CTC head, tokenizer and front end."""

from __future__ import annotations

from dataclasses import dataclass

from audiomask.asr.decoding import CharTokenizer
from audiomask.features.frontend import Frontend
from audiomask.models import Phi4MMEncoder, Qwen3ASREncoder
from audiomask.models.ctc import CTCHead
from audiomask.streaming import default_frontend

__all__ = ["ASRModel"]


@dataclass
class ASRModel:
    """What a recognizer needs: encoder, CTC head over its outputs, tokenizer, and the front end.

    ``encoder``: a :class:`~audiomask.models.Phi4MMEncoder` or a
    :class:`~audiomask.models.Qwen3ASREncoder`. ``frontend``: the features the
    encoder takes; ``None`` (default): its family's
    (:func:`~audiomask.streaming.default_frontend`: :class:`~audiomask.features.Phi4MMFrontend`
    for Phi-4MM, ``WhisperFrontend.qwen3_asr()`` for Qwen3-ASR).

    >>> from audiomask.models import Qwen3ASRConfig
    >>> encoder = Qwen3ASREncoder(Qwen3ASRConfig(encoder_layers=1, d_model=8, encoder_attention_heads=2,
    ...     encoder_ffn_dim=8, downsample_hidden_size=2))
    >>> model = ASRModel(encoder, CTCHead(8, 4), CharTokenizer("ab "))
    >>> type(model.frontend).__name__, model.frontend.n_mels
    ('WhisperFrontend', 128)
    """

    encoder: Phi4MMEncoder | Qwen3ASREncoder
    head: CTCHead
    tokenizer: CharTokenizer
    frontend: Frontend | None = None

    def __post_init__(self) -> None:
        if self.frontend is None:
            self.frontend = default_frontend(self.encoder)  # ValueError for an encoder of no known family
        if self.head.proj.in_features != self.encoder.output_size:
            raise ValueError(
                f"head input_size ({self.head.proj.in_features}) must equal the encoder's output size "
                f"({self.encoder.output_size})"
            )
        if self.head.proj.out_features != self.tokenizer.vocab_size:
            raise ValueError(
                f"head vocab_size ({self.head.proj.out_features}) must equal the tokenizer's "
                f"({self.tokenizer.vocab_size})"
            )
