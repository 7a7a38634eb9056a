"""``sync_check``: flag ``non_blocking`` host->device copies that would stall the host.

A ``non_blocking`` copy from pageable memory, or from a non-dense tensor
(torch first makes a pageable dense copy of it), blocks the host until the
stream's queued work has drained once the payload exceeds the driver's staging
buffers (from what size: ``transfer_h200.json``, docs/benchmarks.md).
``torch.cuda.set_sync_debug_mode`` does not report these, so tests run under
``sync_check`` to catch them.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from audiomask.transfer.dense import is_dense

__all__ = ["CopyVerdict", "FlaggedCopy", "UnsafeCopyError", "UnsafeCopyWarning", "classify_copy", "sync_check"]

_MODES = ("error", "warn")
_TO_COPY = torch.ops.aten._to_copy.default
# (destination, source, non_blocking) as positional arguments 0, 1, 2.
_COPY_INTO = (torch.ops.aten.copy_.default, torch.ops.aten.copy.default)


class CopyVerdict(str, enum.Enum):
    """How a copy fares: ``ok``, or the reason it stalls the host behind a busy stream."""

    OK = "ok"
    PAGEABLE = "pageable"
    NOT_DENSE = "not dense"


class UnsafeCopyError(RuntimeError):
    """A ``non_blocking`` host->device copy under ``sync_check("error")`` would stall the host."""


class UnsafeCopyWarning(UserWarning):
    """A ``non_blocking`` host->device copy under ``sync_check("warn")`` would stall the host."""


def classify_copy(
    *,
    source_device: str | torch.device,
    target_device: str | torch.device,
    non_blocking: bool,
    pinned: bool,
    dense: bool,
) -> CopyVerdict:
    """Classify a copy from the facts about it; a pure function.

    Only a ``non_blocking`` copy from the host (``cpu``) to another device type
    can be flagged (``cuda``; also ``meta``, which lets the check be exercised
    on machines without a GPU): blocking copies synchronise by design. A
    pageable source is reported first, as pinning is the first fix.

    >>> classify_copy(source_device="cpu", target_device="cuda:0", non_blocking=True, pinned=False, dense=True)
    <CopyVerdict.PAGEABLE: 'pageable'>
    >>> classify_copy(source_device="cpu", target_device="cuda", non_blocking=True, pinned=True, dense=False)
    <CopyVerdict.NOT_DENSE: 'not dense'>
    >>> classify_copy(source_device="cpu", target_device="cuda", non_blocking=False, pinned=False, dense=False)
    <CopyVerdict.OK: 'ok'>
    """
    host_to_device = torch.device(source_device).type == "cpu" and torch.device(target_device).type != "cpu"
    if not (non_blocking and host_to_device):
        return CopyVerdict.OK
    if not pinned:
        return CopyVerdict.PAGEABLE
    if not dense:
        return CopyVerdict.NOT_DENSE
    return CopyVerdict.OK


@dataclass(frozen=True)
class FlaggedCopy:
    """One copy that ``sync_check`` flagged."""

    verdict: CopyVerdict
    op: str  # the aten operator, e.g. "aten._to_copy.default"
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # bytes of the source
    target: str  # the destination device

    def message(self) -> str:
        """One line: what was copied, why it stalls, what to do instead."""
        reason = {
            CopyVerdict.PAGEABLE: "reads pageable memory",
            CopyVerdict.NOT_DENSE: "reads a non-dense tensor, which torch first copies to pageable memory",
        }[self.verdict]
        return (
            f"non_blocking host->device copy ({self.op}, {self.nbytes} bytes, shape {self.shape}, {self.dtype}, "
            f"to {self.target}) {reason}: the host stalls until the GPU queue drains; "
            "use audiomask.to_device or a PinnedRing slot"
        )


def _host_to_device(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[torch.Tensor, torch.device, bool] | None:
    """(source, destination device, non_blocking) of a copy operator; ``None`` for anything else."""
    if func is _TO_COPY:
        target = kwargs.get("device")
        if target is None:
            return None
        return args[0], torch.device(target), bool(kwargs.get("non_blocking", False))
    if func in _COPY_INTO:
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return args[1], args[0].device, bool(non_blocking)
    return None


class sync_check(TorchDispatchMode):  # noqa: N801 - used like torch.no_grad
    """Context manager that flags ``non_blocking`` host->device copies from pageable or non-dense memory.

    It watches the aten copy operators (``Tensor.to``, ``.cuda``, ``copy_``,
    ``torch.as_tensor``... all end in ``aten._to_copy`` or ``aten.copy_``) in
    the thread that enters it. ``mode="error"`` raises
    :class:`UnsafeCopyError` before the copy runs; ``mode="warn"`` emits
    :class:`UnsafeCopyWarning` and lets it run. Either way :attr:`flagged`
    lists what was found. Copies by :func:`~audiomask.transfer.to_device` and
    ring slots are never flagged.

    >>> import torch
    >>> with sync_check("warn") as check:
    ...     _ = torch.ones(3).to(torch.float64)  # not a host->device copy
    >>> check.flagged
    []
    """

    def __init__(self, mode: str = "error") -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        super().__init__()
        self.mode = mode
        self.flagged: list[FlaggedCopy] = []

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        copy = _host_to_device(func, args, kwargs)
        if copy is not None:
            source, target, non_blocking = copy
            on_host = source.device.type == "cpu"
            verdict = classify_copy(
                source_device=source.device,
                target_device=target,
                non_blocking=non_blocking,
                pinned=on_host and source.is_pinned(),
                dense=is_dense(source),
            )
            if verdict is not CopyVerdict.OK:
                self._flag(
                    FlaggedCopy(verdict, str(func), tuple(source.shape), source.dtype, source.nbytes, str(target))
                )
        return func(*args, **kwargs)

    def _flag(self, flagged: FlaggedCopy) -> None:
        self.flagged.append(flagged)
        if self.mode == "error":
            raise UnsafeCopyError(flagged.message())
        warnings.warn(flagged.message(), UnsafeCopyWarning, stacklevel=2)
