#!/usr/bin/env python3
"""Benchmark audiomask's Phi-4MM mask builders against transformers' and the memory-fill bound.

For every (L, B) case, side by side in one run, with calls interleaved round
by round so that drift in the machine's speed hits every method alike:

- ``ours``: ``audiomask.masks.phi4mm.streaming_mask`` (fresh array)
- ``ours_out``: the same, written into a preallocated array (``out=``)
- ``upstream``: transformers' ``adaptive_enc_mask`` + ``expand(B, -1, -1)`` +
  ``contiguous()`` on the CPU, as ``Phi4MultimodalAudioModel._streaming_mask``
  builds it (plus the dense copy a host-to-device transfer needs)
- ``naive``: a numpy broadcast comparison ``(j >= start[i]) & (j < end[i])``
- ``fill``: ``ndarray.fill`` of the same preallocated array (the memory-write bound)

Interleaving means each call finds the caches as the other methods left them
(as a mask built into a pinned ring slot would): at L = 1500, B = 8 (18 MB)
every method is bound by DRAM write bandwidth. Also timed: the hidden-state
mask (``hs_mask``, key padding AND streaming mask) for B = 8 ragged
utterances against upstream's ``pad_mask & streaming_mask``.

Config: Phi4MultimodalAudioConfig defaults are ``chunk_size=-1`` (full
attention: the released checkpoint), ``left_chunk=18``, ``time_reduction=8``
(80 ms per token). A streaming configuration needs a chunk size; we use
16 tokens (1.28 s) with the default 18 chunks of left context.

Usage: python scripts/bench_masks.py --out bench/results/masks_<label>.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.timing import NS_PER_S, time_interleaved
from audiomask.masks import phi4mm

CHUNK_SIZE = 16  # tokens per chunk (16 x 80 ms = 1.28 s)
LEFT_CHUNK = phi4mm.DEFAULT_LEFT_CHUNK  # 18 chunks of left context (config default)
TIME_REDUCTION = phi4mm.TIME_REDUCTION  # 8 feature frames (10 ms) per token
SEQ_LENS = (375, 1500)  # tokens: 30 s and 120 s of audio
BATCH_SIZES = (1, 8)
HS_BATCH = 8
NS_PER_US = NS_PER_S // 1_000_000  # the timings are nanoseconds; the report, microseconds


def summarise(times: dict[str, np.ndarray]) -> dict[str, dict]:
    """Median / p99 / mean in microseconds of each method's nanosecond timings."""
    return {
        name: {
            "median_us": float(np.median(ns)) / NS_PER_US,
            "p99_us": float(np.percentile(ns, 99)) / NS_PER_US,
            "mean_us": float(ns.mean()) / NS_PER_US,
        }
        for name, ns in times.items()
    }


def naive_streaming_mask(seq_len: int, batch_size: int, chunk_size: int, left_chunk: int) -> np.ndarray:
    """The obvious vectorisation: per-row bounds, then a comparison over all L x L cells."""
    i = np.arange(seq_len)
    chunk = i // chunk_size
    start = np.maximum((chunk - left_chunk) * chunk_size, 0)
    end = np.minimum((chunk + 1) * chunk_size, seq_len)
    mask = (i[None, :] >= start[:, None]) & (i[None, :] < end[:, None])
    return np.ascontiguousarray(np.broadcast_to(mask, (batch_size, seq_len, seq_len)))


def run_case(
    mask: str,
    seq_len: int,
    batch_size: int,
    build: Callable[..., np.ndarray],
    upstream: Callable[[], object],
    args: argparse.Namespace,
    naive: Callable[[], object] | None = None,
    **meta: object,
) -> dict:
    """Check ``build()`` equals upstream, then time ours (fresh / ``out=``), upstream, naive, fill."""
    out = np.empty((batch_size, seq_len, seq_len), dtype=np.bool_)
    if not np.array_equal(build(), upstream().numpy()):
        raise SystemExit(f"benchmark aborted: audiomask and upstream {mask} differ at L={seq_len}, B={batch_size}")
    methods = {"ours": build, "ours_out": lambda: build(out=out), "upstream": upstream}
    if naive is not None:
        methods["naive"] = naive
    methods["fill"] = lambda: out.fill(True)  # the same buffer ours_out writes
    timings = summarise(time_interleaved(methods, args.repeats, args.warmup))
    up = timings["upstream"]["median_us"]
    return {
        "mask": mask,
        "seq_len": seq_len,
        "batch_size": batch_size,
        **meta,
        "timings": timings,
        # "fill" is the ceiling: no builder writing this array can beat upstream by more.
        "speedup_vs_upstream": {name: up / timings[name]["median_us"] for name in ("ours", "ours_out", "fill")},
        "ours_out_over_fill": timings["ours_out"]["median_us"] / timings["fill"]["median_us"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``argv`` without the program name; default ``sys.argv[1:]``); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    parser.add_argument("--repeats", type=int, default=500, help="timed calls per method and case")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls per method and case first")
    args = parser.parse_args(argv)

    import torch
    from transformers.models.phi4_multimodal.modeling_phi4_multimodal import adaptive_enc_mask

    def upstream_streaming(seq_len: int, batch_size: int) -> torch.Tensor:
        chunk_start_idx = np.arange(0, seq_len, CHUNK_SIZE)
        mask = adaptive_enc_mask(seq_len, chunk_start_idx, left_window=LEFT_CHUNK)
        return mask.unsqueeze(0).expand([batch_size, -1, -1]).contiguous()

    def upstream_hs(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
        # forward_embeddings: pad_mask (B, 1, L) from ceil(len / r), AND the expanded streaming mask.
        valid = torch.ceil(lengths / TIME_REDUCTION)
        pad = (torch.arange(seq_len).expand(lengths.size(0), -1) < valid.unsqueeze(1)).unsqueeze(1)
        return (pad & upstream_streaming(seq_len, lengths.size(0))).contiguous()

    results = []
    rng = np.random.default_rng(0)
    for seq_len in SEQ_LENS:
        for batch_size in BATCH_SIZES:
            results.append(
                run_case(
                    "streaming_mask",
                    seq_len,
                    batch_size,
                    partial(phi4mm.streaming_mask, seq_len, batch_size, CHUNK_SIZE, LEFT_CHUNK),
                    partial(upstream_streaming, seq_len, batch_size),
                    args,
                    naive=partial(naive_streaming_mask, seq_len, batch_size, CHUNK_SIZE, LEFT_CHUNK),
                )
            )
        # hs_mask: ragged feature lengths, the longest one setting the padded length.
        max_frames = seq_len * TIME_REDUCTION
        lengths = rng.integers(1, max_frames + 1, HS_BATCH)
        lengths[0] = max_frames
        results.append(
            run_case(
                "hs_mask",
                seq_len,
                HS_BATCH,
                partial(phi4mm.hs_mask, lengths, max_frames, CHUNK_SIZE, LEFT_CHUNK),
                partial(upstream_hs, torch.from_numpy(lengths), seq_len),
                args,
                feature_lengths=lengths.tolist(),
            )
        )

    report = {
        **capture_environment(sys.argv),
        "config": {
            "chunk_size": CHUNK_SIZE,
            "left_chunk": LEFT_CHUNK,
            "time_reduction": TIME_REDUCTION,
            "note": "Phi4MultimodalAudioConfig defaults: chunk_size=-1 (full attention), left_chunk=18, "
            "time_reduction=8; chunk_size=16 tokens (1.28 s) chosen for streaming",
        },
        "repeats": args.repeats,
        "warmup": args.warmup,
        "units": "microseconds per call (host wall time, time.perf_counter_ns)",
        "results": results,
    }

    header = (
        f"{'mask':<15}{'L':>6}{'B':>4}"
        + "".join(f"{name + ' med/p99':>22}" for name in ("ours", "ours_out", "upstream", "naive", "fill"))
        + f"{'x up (out)':>12}{'x up (fill)':>12}{'out/fill':>10}"
    )
    print(header)
    for case in results:
        t = case["timings"]
        cells = "".join(
            f"{t[name]['median_us']:>12.1f}/{t[name]['p99_us']:<9.1f}" if name in t else f"{'-':>22}"
            for name in ("ours", "ours_out", "upstream", "naive", "fill")
        )
        print(
            f"{case['mask']:<15}{case['seq_len']:>6}{case['batch_size']:>4}{cells}"
            f"{case['speedup_vs_upstream']['ours_out']:>11.1f}x{case['speedup_vs_upstream']['fill']:>11.1f}x"
            f"{case['ours_out_over_fill']:>10.2f}"
        )
    print(
        "(microseconds; x up (out) = upstream median / ours_out median; x up (fill) = the ceiling, "
        "upstream / memory-fill bound; out/fill = ours_out / fill)"
    )

    if args.out:
        write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
