"""Pieces both encoders share: config loading, activations, host lengths, the frame buffer of a stream."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from audiomask.checks import check_int, check_lengths
from audiomask.transfer import to_device

__all__ = ["FrameBuffer", "activation", "config_from_dict", "host_lengths", "model_input", "positive_fields"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    # transformers' ACT2FN names: "swish" and "silu" are the same function.
    "swish": nn.SiLU,
    "silu": nn.SiLU,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
}

ConfigT = TypeVar("ConfigT")


def activation(name: str, field: str) -> nn.Module:
    """The activation module named ``name`` (a transformers ``ACT2FN`` name); ``field`` names the config field."""
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"{field} must be one of {sorted(_ACTIVATIONS)}, got {name!r}") from None


def positive_fields(config: object, *names: str) -> None:
    """Check that each named integer field of ``config`` is ``>= 1`` (``ValueError`` naming it)."""
    for name in names:
        check_int(name, getattr(config, name), minimum=1)


def config_from_dict(cls: type[ConfigT], values: Mapping[str, Any]) -> ConfigT:
    """Build the dataclass ``cls`` from a transformers ``config.json`` dict, ignoring fields it does not use.

    The config files also hold fields that play no part at inference
    (dropout rates, ``architectures``, token ids, ...); missing fields take
    the dataclass defaults, which equal transformers' defaults.
    """
    names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{name: value for name, value in values.items() if name in names})


def host_lengths(name: str, lengths: object, maximum: int, maximum_name: str) -> np.ndarray:
    """``lengths`` as a host ``(B,)`` int64 array, each ``<= maximum``; accepts lists, numpy arrays and tensors.

    A tensor must be on the CPU: reading a device tensor would block the host
    until the GPU has caught up (a hidden synchronisation), and lengths are
    known on the host anyway (the masks are built there).
    """
    if isinstance(lengths, torch.Tensor):
        if lengths.device.type != "cpu":
            raise ValueError(
                f"{name} must be on the host (numpy, a list or a CPU tensor), got a tensor on {lengths.device}: "
                "reading it would wait for the GPU"
            )
        lengths = lengths.detach().numpy()
    return check_lengths(name, lengths, maximum=maximum, maximum_name=maximum_name)


def model_input(features: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``features`` on ``module``'s device in its dtype: host tensors through :func:`to_device`, others cast."""
    parameter = next(module.parameters())
    if features.device == parameter.device:
        return features.to(parameter.dtype)
    return to_device(features, parameter.device, dtype=parameter.dtype)


class FrameBuffer:
    """Feature frames pushed to each stream slot, waiting to fill a chunk.

    ``frames`` is a ``(B, P, F)`` tensor on the encoder's device; slot ``b``
    holds ``counts[b]`` frames at its start and zeros after them (the zeros
    are the end-of-utterance padding of a final partial chunk).
    """

    def __init__(self, batch_size: int, feature_size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.frames = torch.zeros(batch_size, 0, feature_size, device=device, dtype=dtype)
        self.counts = np.zeros(batch_size, np.int64)

    def push(self, features: torch.Tensor, lengths: np.ndarray) -> None:
        """Append the first ``lengths[b]`` frames of ``features[b]`` ``(B, t, F)`` to slot ``b``."""
        batch, capacity, feature_size = self.frames.shape
        if batch and (lengths == lengths[0]).all() and (self.counts == self.counts[0]).all():
            # Lock step (every slot holds as many frames and gets as many): append along time,
            # no scatter and no index arrays to move. (The common case: equal pushes, full chunks.)
            count, length = int(self.counts[0]), int(lengths[0])
            moved = to_device(features[:, :length], self.frames.device, dtype=self.frames.dtype)
            if count:
                self.frames = torch.cat([self.frames[:, :count], moved], dim=1)
            else:  # an empty buffer: the moved frames are the buffer (a copy, never the caller's tensor)
                self.frames = moved.clone() if moved.data_ptr() == features.data_ptr() else moved
            self.counts += length
            return
        needed = int((self.counts + lengths).max(initial=0))
        if needed > capacity:
            grown = self.frames.new_zeros(batch, needed - capacity, feature_size)
            self.frames = torch.cat([self.frames, grown], dim=1)
        # One scatter for all slots, whatever their lengths: (slot, source frame) -> (slot, count + frame).
        slots = np.repeat(np.arange(batch), lengths)
        source = np.arange(slots.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        slots, source, target = to_device(np.stack([slots, source, source + self.counts[slots]]), self.frames.device)
        features = to_device(features, self.frames.device, dtype=self.frames.dtype)
        self.frames[slots, target] = features[slots, source]
        self.counts += lengths

    def take(self, frames: int) -> tuple[torch.Tensor, np.ndarray]:
        """Remove the first ``frames`` frames of every slot: ``(chunk (B, frames, F), valid (B,))``.

        Slots with fewer frames give what they hold, zero-padded; ``valid``
        counts the real ones.
        """
        short = frames - self.frames.shape[1]
        if short > 0:
            self.frames = nn.functional.pad(self.frames, (0, 0, 0, short))
        chunk, self.frames = self.frames[:, :frames], self.frames[:, frames:]
        valid = np.minimum(self.counts, frames)
        self.counts -= valid
        return chunk, valid
