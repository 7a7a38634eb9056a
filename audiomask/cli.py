"""The ``audiomask`` command line.

``audiomask demo`` builds the masks of a small Phi-4MM and Qwen3-ASR batch in
numpy, writes them straight into a pinned ring slot, moves them to the best
available device without stalling the host, and checks the copies.

User errors (bad arguments, no CUDA when ``--device cuda`` is asked for) print
one line ``audiomask: error: ...`` on stderr and exit with status 2; never a
traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

import audiomask
from audiomask.masks import phi4mm, qwen3_asr

__all__ = ["main"]

SAMPLE_RATE = 16_000  # Hz
FEATURE_HOP_SAMPLES = 160  # one feature frame per 10 ms
FRAMES_PER_SECOND = SAMPLE_RATE // FEATURE_HOP_SAMPLES  # 100 feature frames per second
DEMO_UTTERANCES_S = (30.0, 12.3, 5.0, 0.8)  # seconds of audio per utterance in the demo batch
DEMO_CHUNK_TOKENS = 16  # 16 tokens x 80 ms = 1.28 s chunks
DEMO_LEFT_CHUNKS = 2  # chunks of left context


def _pick_device(name: str) -> str:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without CUDA is a user error."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (use --device cpu or auto)")
    return name


def _as_rows(mask: np.ndarray) -> str:
    return "\n".join("    " + "".join("1" if v else "0" for v in row) for row in mask)


def _demo(args: argparse.Namespace) -> int:
    import torch

    from audiomask.transfer import PinnedRing, to_device

    device = _pick_device(args.device)
    where = torch.cuda.get_device_name(device) if device.startswith("cuda") else "host memory, no GPU"
    print(f"audiomask {audiomask.__version__} demo on {device} ({where})")

    frames = np.array([round(s * FRAMES_PER_SECOND) for s in DEMO_UTTERANCES_S], dtype=np.int64)
    max_frames = int(frames.max())
    tokens = int(phi4mm.subsampled_lengths([max_frames])[0])
    print(
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
    print(
        f"  built in place in a {'pinned' if ring.stats().pinned else 'host'} ring slot in"
        f" {(built - start) * 1e3:.3f} ms, submitted to {device} in {(submitted - built) * 1e3:.3f} ms of host time"
    )

    windows = qwen3_asr.cu_seqlens(frames)
    device_windows = to_device(windows, device, ring=ring)
    print(
        f"\nQwen3-ASR attention windows of the same batch ({qwen3_asr.WINDOW_TOKENS} tokens each):"
        f"\n  tokens per utterance {qwen3_asr.output_lengths(frames).tolist()}"
        f"\n  cu_seqlens {windows.tolist()}"
    )

    expected = phi4mm.hs_mask(frames, max_frames, DEMO_CHUNK_TOKENS, DEMO_LEFT_CHUNKS)
    same = np.array_equal(device_mask.cpu().numpy(), expected) and np.array_equal(
        device_windows.cpu().numpy(), windows
    )
    print(f"\ncopies on {device} equal their host source: {'yes' if same else 'NO'}")
    stats = ring.stats()
    print(
        f"ring: {stats.copies} copies, {stats.bytes_copied} bytes, {stats.slot_waits} slot waits,"
        f" {stats.pinned_bytes} {'pinned ' if stats.pinned else ''}bytes held"
    )
    example = phi4mm.hs_mask([40, 17], 40, chunk_size=2, left_chunk=1)[1]
    print("\nA small one: hs_mask([40, 17], max_frames=40, chunk_size=2, left_chunk=1)[1], rows = queries:")
    print(_as_rows(example))
    return 0 if same else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audiomask", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"audiomask {audiomask.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="build masks in numpy and move them to the best device")
    demo.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 success, 1 a failed check, 2 a user error)."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except ValueError as error:
        print(f"audiomask: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`audiomask demo | head`): not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return 0


if __name__ == "__main__":
    sys.exit(main())
