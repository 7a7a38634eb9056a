"""The model bundle a recognizer runs: encoder, CTC head, tokenizer and front end."""

from __future__ import annotations

from dataclasses import dataclass, field

from audiomask.asr.decoding import CharTokenizer
from audiomask.features import Phi4MMFrontend
from audiomask.models.ctc import CTCHead
from audiomask.models.phi4mm import Phi4MMEncoder

__all__ = ["ASRModel"]


@dataclass
class ASRModel:
    """What a recognizer needs: encoder, CTC head over its outputs, tokenizer, and the front end."""

    encoder: Phi4MMEncoder
    head: CTCHead
    tokenizer: CharTokenizer
    frontend: Phi4MMFrontend = field(default_factory=Phi4MMFrontend)

    def __post_init__(self) -> None:
        if self.head.proj.in_features != self.encoder.config.hidden_size:
            raise ValueError(
                f"head input_size ({self.head.proj.in_features}) must equal the encoder's hidden_size "
                f"({self.encoder.config.hidden_size})"
            )
        if self.head.proj.out_features != self.tokenizer.vocab_size:
            raise ValueError(
                f"head vocab_size ({self.head.proj.out_features}) must equal the tokenizer's "
                f"({self.tokenizer.vocab_size})"
            )
