"""``audiomask demo`` (masks built in numpy, moved through a pinned ring) and ``audiomask bench`` (forwarded)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

import audiomask
from audiomask.checks import pick_device
from audiomask.cli.common import EXIT_BAD_FILE, EXIT_OK, write_line
from audiomask.constants import FRAMES_PER_SECOND
from audiomask.masks import phi4mm, qwen3_asr

__all__ = ["bench", "demo"]

DEMO_UTTERANCES_S = (30.0, 12.3, 5.0, 0.8)  # seconds of audio per utterance in the demo batch
DEMO_CHUNK_TOKENS = 16  # 16 tokens x 80 ms = 1.28 s chunks
DEMO_LEFT_CHUNKS = 2  # chunks of left context


def say(line: str) -> None:
    """One line on stdout (a failed write raises :class:`~audiomask.cli.common.OutputError`)."""
    write_line(sys.stdout, line)


def bench(argv: Sequence[str]) -> int:
    """Forward ``argv`` to :func:`audiomask.bench.latency.main`."""
    try:
        from audiomask.bench.latency import main as bench_main
    except ModuleNotFoundError as error:
        if error.name not in ("audiomask.bench", "audiomask.bench.latency"):
            raise
        raise ValueError("bench: the latency benchmark (audiomask.bench.latency) is not in this install") from None
    return bench_main(list(argv))


def demo(args: argparse.Namespace) -> int:
    """Build the masks of a small batch in numpy, stage them in a pinned ring slot, move and check them."""
    import torch

    from audiomask.transfer import PinnedRing, to_device

    device = pick_device(args.device, "--device")
    where = torch.cuda.get_device_name(device) if device.startswith("cuda") else "host memory, no GPU"
    say(f"audiomask {audiomask.__version__} demo on {device} ({where})")

    frames = np.array([round(s * FRAMES_PER_SECOND) for s in DEMO_UTTERANCES_S], dtype=np.int64)
    max_frames = int(frames.max())
    tokens = int(phi4mm.subsampled_lengths([max_frames])[0])
    say(
        f"\nPhi-4MM hidden-state mask: {len(frames)} utterances of {', '.join(f'{s} s' for s in DEMO_UTTERANCES_S)}"
        f" -> (B, T_q, T_k) = ({len(frames)}, {tokens}, {tokens}) bool, chunks of {DEMO_CHUNK_TOKENS} tokens"
        f" ({DEMO_CHUNK_TOKENS * phi4mm.TOKEN_MS} ms), {DEMO_LEFT_CHUNKS} chunks of left context"
    )
    ring = PinnedRing()
    shape = (len(frames), tokens, tokens)
    with ring.stage(shape, np.bool_) as staged:
        start = time.perf_counter()
        phi4mm.hs_mask(frames, max_frames, DEMO_CHUNK_TOKENS, DEMO_LEFT_CHUNKS, out=staged.array)
        built = time.perf_counter()
        device_mask = staged.to(device)
        submitted = time.perf_counter()
    say(
        f"  built in place in a {'pinned' if ring.stats().pinned else 'host'} ring slot in"
        f" {(built - start) * 1e3:.3f} ms, submitted to {device} in {(submitted - built) * 1e3:.3f} ms of host time"
    )

    windows = qwen3_asr.cu_seqlens(frames)
    device_windows = to_device(windows, device, ring=ring)
    say(
        f"\nQwen3-ASR attention windows of the same batch ({qwen3_asr.WINDOW_TOKENS} tokens each):"
        f"\n  tokens per utterance {qwen3_asr.output_lengths(frames).tolist()}"
        f"\n  cu_seqlens {windows.tolist()}"
    )

    expected = phi4mm.hs_mask(frames, max_frames, DEMO_CHUNK_TOKENS, DEMO_LEFT_CHUNKS)
    same = np.array_equal(device_mask.cpu().numpy(), expected) and np.array_equal(device_windows.cpu().numpy(), windows)
    say(f"\ncopies on {device} equal their host source: {'yes' if same else 'NO'}")
    stats = ring.stats()
    say(
        f"ring: {stats.copies} copies, {stats.bytes_copied} bytes, {stats.slot_waits} slot waits,"
        f" {stats.pinned_bytes} {'pinned ' if stats.pinned else ''}bytes held"
    )
    example = phi4mm.hs_mask([40, 17], 40, chunk_size=2, left_chunk=1)[1]
    say("\nA small one: hs_mask([40, 17], max_frames=40, chunk_size=2, left_chunk=1)[1], rows = queries:")
    say("\n".join("    " + "".join("1" if v else "0" for v in row) for row in example))
    return EXIT_OK if same else EXIT_BAD_FILE
