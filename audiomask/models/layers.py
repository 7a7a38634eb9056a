"""Pieces both encoders share: config loading, activations, lengths on the host or on the device."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from audiomask.checks import check_int, check_lengths
from audiomask.masks import padding_mask
from audiomask.transfer import to_device

__all__ = [
    "activation",
    "batch_lengths",
    "config_from_dict",
    "derived",
    "host_lengths",
    "joined_projections",
    "lengths_on",
    "model_input",
    "positive_fields",
    "valid_positions",
]

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


def derived(owner: nn.Module, sources: tuple[torch.Tensor, ...], build: Callable[[], Any], name: str = "") -> Any:
    """``build()`` (tensors computed from ``sources``), cached on ``owner`` while no source changes.

    Inference only: with autograd on, it is rebuilt on every call (gradients
    reach the parameters). A source is unchanged while its storage and its
    version counter (bumped by every in-place write: ``load_state_dict``,
    ``copy_``) are; ``.to()`` makes new storage. Saves per-step kernels such
    as the concatenated q/k/v weight. One entry per ``owner`` and ``name``
    (what is derived: a module's channels-last weight and a bias folded into
    it are two).
    """
    if torch.is_grad_enabled():
        return build()
    try:
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in sources)
    except RuntimeError:  # inference tensors have no version counter
        return build()
    entries = owner.__dict__.setdefault("_derived_cache", {})
    cached = entries.get(name)
    if cached is None or cached[0] != key:
        # The cache holds the sources' storage too, so that no new storage can reuse their
        # addresses (say after .to(bfloat16).to(float32)) and pass for them while it is kept.
        cached = (key, build(), [t.detach() for t in sources])
        entries[name] = cached
    return cached[1]


def joined_projections(owner: nn.Module, projections: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights and biases of ``projections`` (linear layers of one input) concatenated: ``F.linear`` with them
    is all of them in one GEMM (queries, keys and values), outputs side by side. Cached on ``owner`` (:func:`derived`).
    """
    sources = tuple(t for projection in projections for t in (projection.weight, projection.bias))
    return derived(
        owner,
        sources,
        lambda: (torch.cat([p.weight for p in projections]), torch.cat([p.bias for p in projections])),
    )


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


def batch_lengths(
    name: str, lengths: object, batch: int, maximum: int, maximum_name: str, device: torch.device
) -> np.ndarray | torch.Tensor:
    """The ``(B,)`` lengths of a forward: on the host (checked), or left on ``device`` where they already are.

    A tensor on ``device`` stays there as int64: what the encoder derives from
    it (output lengths, masks) is computed there, and nothing is read back.
    Its values are checked only when ``device`` is the CPU (reading them from a
    GPU would wait for it): on a GPU, lengths outside ``[0, maximum]`` give
    wrong outputs, not an error. Anything else (a list, a numpy array, a CPU
    tensor for a module on a GPU) is read on the host and checked: a host
    ``(B,)`` int64 array. A tensor on another device is a ``ValueError``.

    >>> batch_lengths("lengths", [3, 1], 2, 4, "T", torch.device("cpu"))
    array([3, 1])
    >>> batch_lengths("lengths", torch.tensor([3, 1]), 2, 4, "T", torch.device("cpu"))
    tensor([3, 1])
    """
    if isinstance(lengths, torch.Tensor) and lengths.device == device:
        if lengths.ndim != 1 or lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise ValueError(
                f"{name} must be a 1-D integer tensor, got {lengths.dtype} of shape {tuple(lengths.shape)}"
            )
        if device.type == "cpu":
            check_lengths(name, lengths.numpy(), maximum=maximum, maximum_name=maximum_name)
        on_device = lengths.to(torch.int64)
    elif isinstance(lengths, torch.Tensor) and lengths.device.type != "cpu":
        raise ValueError(f"{name} must be on the host or on the encoder's device ({device}), got {lengths.device}")
    else:
        on_device = host_lengths(name, lengths, maximum, maximum_name)
    if len(on_device) != batch:
        raise ValueError(f"{name} must have {batch} entries (features.shape[0]), got {len(on_device)}")
    return on_device


def lengths_on(lengths: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """``(B,)`` int64 lengths from :func:`batch_lengths` as a tensor on ``device`` (host ones moved with :func:`to_device`)."""
    return lengths if isinstance(lengths, torch.Tensor) else to_device(lengths, device)


def valid_positions(lengths: np.ndarray | torch.Tensor, width: int, device: torch.device) -> torch.Tensor:
    """``(B, width)`` bool on ``device``, ``True`` where ``position < lengths[b]`` (the positions that are real).

    Host lengths: :func:`audiomask.masks.padding_mask` built on the host and
    moved; device lengths: compared there (nothing read back). The same mask either way.

    >>> valid_positions(np.array([2, 0]), 3, torch.device("cpu")).int()
    tensor([[1, 1, 0],
            [0, 0, 0]], dtype=torch.int32)
    """
    if isinstance(lengths, torch.Tensor):
        return torch.arange(width, device=device) < lengths[:, None]
    return to_device(padding_mask(lengths, width), device)
