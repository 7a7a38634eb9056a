"""The key/value cache of a :class:`~audiomask.llm.lm.CausalLM`: one fixed-size slot per stream.

Each of ``slots`` sequences has room for ``capacity`` positions in every
layer; ``lengths[s]`` (host ``int64``) says how many hold keys. Slots are
independent: a stream joins at length 0 (:meth:`KVCache.reset`), rolls back
by cropping its length (:meth:`KVCache.crop`: the keys beyond are dead and
are overwritten by the next inputs), and leaves by being reset. Memory is
fixed when the cache is made: ``2 * layers * slots * kv_heads * capacity *
head_dim`` elements (:attr:`KVCache.nbytes`), so a stream's context is
bounded by ``capacity``.

>>> cache = KVCache(layers=1, slots=2, kv_heads=1, capacity=8, head_dim=4)
>>> cache.lengths[1] = 5
>>> cache.crop(1, 3); cache.lengths.tolist()
[0, 3]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from audiomask.checks import check_int

__all__ = ["CacheIndex", "KVCache"]


class KVCache:
    """Keys and values ``(slots, kv_heads, capacity, head_dim)`` per layer, with each slot's length on the host."""

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (
            check_int("slots", slots, minimum=1),
            check_int("kv_heads", kv_heads, minimum=1),
            check_int("capacity", capacity, minimum=1),
            check_int("head_dim", head_dim, minimum=1),
        )
        layers = check_int("layers", layers, minimum=1)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.lengths = np.zeros(slots, np.int64)

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds on its device."""
        return sum(tensor.numel() * tensor.element_size() for tensor in (*self.keys, *self.values))

    def reset(self, slots: object) -> None:
        """Empty the slots ``slots`` (an index or indices): their next input is at position 0."""
        self.lengths[np.asarray(slots, np.int64)] = 0

    def crop(self, slot: int, length: int) -> None:
        """Keep the first ``length`` positions of slot ``slot`` (at most its length): a roll-back."""
        slot = check_int("slot", slot, minimum=0, maximum=self.slots - 1)
        length = check_int("length", length, minimum=0, maximum=int(self.lengths[slot]))
        self.lengths[slot] = length

    def store(self, layer: int, where: CacheIndex, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store the packed real inputs ``keys``/``values`` ``(N, kv_heads, head_dim)`` of layer ``layer``.

        Input ``j``'s heads go to the rows ``where.cache_rows[j * kv_heads : (j + 1) * kv_heads]``
        (:meth:`rows` of its slot and position). Nothing waits for the device.
        """
        # One row copy per (input, head) into the layer seen as (slots * kv_heads * capacity, head_dim) rows: a
        # plain copy kernel, where indexing the 4-D tensor by slot and position takes a general scatter.
        head_dim = keys.shape[-1]
        self.keys[layer].view(-1, head_dim).index_copy_(0, where.cache_rows, keys.reshape(-1, head_dim))
        self.values[layer].view(-1, head_dim).index_copy_(0, where.cache_rows, values.reshape(-1, head_dim))

    def rows(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``(N * kv_heads,)`` int64: the rows of a layer seen as ``(slots * kv_heads * capacity, head_dim)`` that
        input ``j`` at slot ``slots[j]``, position ``positions[j]`` fills, head after head (``(N,)`` each, on the
        cache's device; no host sync).

        >>> cache = KVCache(layers=1, slots=2, kv_heads=2, capacity=8, head_dim=4)
        >>> cache.rows(torch.tensor([1]), torch.tensor([3])).tolist()  # slot 1's heads start at rows 16 and 24
        [19, 27]
        """
        kv_heads = self.keys[0].shape[1]
        heads = torch.arange(kv_heads, device=slots.device)
        return ((slots[:, None] * kv_heads + heads) * self.capacity + positions[:, None]).reshape(-1)

    def read(self, layer: int, where: CacheIndex) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values ``(B, kv_heads, where.span, head_dim)`` of layer ``layer`` in the rows' slots: a
        view when ``where.leading``, else a gathered copy."""
        span = where.span
        if where.leading:
            batch = where.read_slots.shape[0]
            return self.keys[layer][:batch, :, :span], self.values[layer][:batch, :, :span]
        return self.keys[layer][where.read_slots, :, :span], self.values[layer][where.read_slots, :, :span]


@dataclass(frozen=True)
class CacheIndex:
    """Where one forward's inputs go in a :class:`KVCache`, and which slots it reads; long tensors on its device.

    ``rows``, ``inputs`` ``(N,)``: the real inputs (row, index in the row); ``cache_rows`` ``(N * kv_heads,)``:
    where they go (:meth:`KVCache.rows` of their slots and positions); ``read_slots``, ``first``, ``count``,
    ``starts`` ``(B,)``: each row's slot, first input's position, real inputs and where they start among the
    packed inputs; ``span``: positions read (``0 .. span - 1``); ``leading``: the rows are slots ``0 .. B - 1`` in
    order (read without a copy).
    """

    rows: torch.Tensor
    inputs: torch.Tensor
    cache_rows: torch.Tensor
    read_slots: torch.Tensor
    first: torch.Tensor
    count: torch.Tensor
    starts: torch.Tensor
    span: int
    leading: bool
