"""Decode steps replayed from CUDA graphs: :class:`GraphedDecode`.

An eager decode step of a 28-layer model launches some 700 kernels from
Python: ~35 ms of host time on the H200 whatever the batch, where the GPU
needs 5 ms for 64 streams. A step of one token per row
has the same shapes from step to step, so it is captured once per bucket and
replayed: rows padded to a power of two, or a multiple of :data:`ROW_BUCKET`
above it (the pad rows repeat the last row:
the same key and value written to the same place, their logits dropped). On a
GPU the attention reads each row's slot up to its own length
(:func:`~audiomask.llm.attention.slot_attention`), so one graph per batch
bucket serves every length; through SDPA, keys are read up to a multiple of
:data:`SPAN_BUCKET` positions (the rest masked), a graph per span too. The
inputs go into static device buffers; the cache's slots are fixed-size, so a
replay allocates nothing. The first step of a bucket runs eagerly through the
same static path and is captured after; on the CPU every step runs eagerly.
"""

from __future__ import annotations

import numpy as np
import torch

from audiomask.llm.attention import reads_in_place
from audiomask.llm.cache import KVCache
from audiomask.llm.lm import CausalLM, pack_indices
from audiomask.transfer import to_device

__all__ = ["SPAN_BUCKET", "GraphedDecode"]

SPAN_BUCKET = 128  # keys read by a captured step: the longest row's, rounded up to this many positions
ROW_BUCKET = 64  # rows of a captured step beyond this: a multiple of it (below: a power of two)


def _bucket(count: int) -> int:
    """Rows of the step that runs ``count``: the power of two at or above it, or the multiple of ROW_BUCKET.

    >>> [_bucket(count) for count in (1, 3, 64, 65, 500)]
    [1, 4, 64, 128, 512]
    """
    if count > ROW_BUCKET:
        return -(-count // ROW_BUCKET) * ROW_BUCKET
    return 1 << max(0, count - 1).bit_length()


class _Capture:
    """One bucket's static buffers and, on a GPU, its graph."""

    def __init__(self, lm: CausalLM, batch: int) -> None:
        self.tokens = torch.zeros(batch, dtype=torch.long, device=lm.device)
        self.packed = torch.zeros(7 * batch, dtype=torch.long, device=lm.device)
        self.logits: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None


class GraphedDecode:
    """``step(tokens, slots)``: one token for each of the slots ``slots``, as ``lm(...)`` with counts of 1.

    ``tokens`` ``(b,)`` long on the model's device (the previous step's choices); ``slots`` ``(b,)`` host
    ints, distinct. Returns float32 logits ``(b, vocab_size)`` (on a GPU a view of the buffer every graph
    writes: read it before the next step) and grows each slot by one, as :meth:`CausalLM.forward` does.
    """

    def __init__(self, lm: CausalLM, cache: KVCache) -> None:
        self.lm, self.cache = lm, cache
        self.capture = lm.device.type == "cuda"
        self._captures: dict[tuple[int, int], _Capture] = {}
        # One memory pool for every bucket's graph: steps replay one at a time, each one's logits read first.
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        # Every graph writes its logits here, so that no graph keeps an output of its own in the pool (each
        # would hold rows x vocab_size float32: 5 GiB over the 22 buckets of 1,000 slots and 151,936 ids).
        rows = _bucket(cache.slots) if self.capture else 0
        self._logits = torch.empty((rows, lm.config.vocab_size), dtype=torch.float32, device=lm.device)

    def step(self, tokens: torch.Tensor, slots: np.ndarray) -> torch.Tensor:
        slots = np.asarray(slots, np.int64)
        count = len(slots)
        batch = _bucket(count)
        padded = np.concatenate((slots, np.full(batch - count, slots[-1], np.int64)))
        starts = self.cache.lengths[padded]
        span = self.cache.capacity
        if not reads_in_place(self.lm.device):
            span = min(span, -(-int(starts.max() + 1) // SPAN_BUCKET) * SPAN_BUCKET)
        if starts.max() + 1 > self.cache.capacity:
            raise ValueError(f"a slot would grow past the cache's {self.cache.capacity} positions")
        key = (batch, span)
        capture = self._captures.get(key)
        fresh = capture is None
        if fresh:
            capture = self._captures[key] = _Capture(self.lm, batch)
        capture.tokens[:count] = tokens
        capture.tokens[count:] = tokens[-1]
        capture.packed.copy_(to_device(pack_indices(padded, starts, np.ones(batch, np.int64)), self.lm.device))
        if capture.graph is not None:
            capture.graph.replay()
        else:
            capture.logits = self._run(capture, batch, span)
            if fresh and self.capture:
                capture.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(capture.graph, pool=self._pool):
                    self._logits[:batch].copy_(self._run(capture, batch, span))
                capture.logits = self._logits[:batch]
                capture.graph.replay()  # capturing records without running: this step's logits come from here
        self.cache.lengths[slots] += 1
        return capture.logits[:count]

    @torch.inference_mode()  # as the steps run: a capture outside it would keep every layer's activations
    def warm(self) -> int:
        """Capture every row bucket's graph the cache's slots can need now (at start-up), rather than at each
        bucket's first step under load, where a capture stalls every stream's update. Needs an empty cache:
        each bucket's step runs over the first slots, which are emptied again after. Returns the graphs
        captured (0 off CUDA: nothing is captured there)."""
        if not self.capture:
            return 0
        if self.cache.lengths.any():
            raise RuntimeError("GraphedDecode.warm needs an empty cache: it writes into the first slots")
        slots = len(self.cache.lengths)
        before = len(self._captures)
        for batch in sorted({_bucket(count) for count in range(1, slots + 1)}):
            count = min(batch, slots)
            self.step(torch.zeros(count, dtype=torch.long, device=self.lm.device), np.arange(count))
        self.cache.lengths[:] = 0
        return len(self._captures) - before

    def _run(self, capture: _Capture, batch: int, span: int) -> torch.Tensor:
        embeds = self.lm.embed_tokens(capture.tokens)[:, None]
        return self.lm.run(embeds, capture.packed, self.cache, batch, span, leading=False)
