"""Concurrent real-time streams of the full-size Phi-4MM encoder's CUDA-graph chunk step, alone.

The latency benchmark's throughput row for ``phi4mm_full/encoder_step``, without the other
sections: the same model, chunking (1.28 s chunks, 4 chunks of left context), probe plan and
search (:func:`audiomask.bench.throughput.search`), with each probe's peak memory per stream.

Usage (H200): python3 bench/probes/throughput_phi4mm.py --seconds 240 --out OUT.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from audiomask.bench.environment import capture_environment, write_result
from audiomask.bench.latency import FULL, STREAMS_AIM, _streaming_chunking
from audiomask.bench.models import build_model
from audiomask.bench.throughput import make_probe, search
from audiomask.bench.timing import Budget


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    model = build_model("phi4mm_full", device)
    chunk_size, left_chunk = _streaming_chunking(model)
    probe, settings = make_probe(model, "encoder_step", FULL.probe, chunk_size=chunk_size, left_chunk=left_chunk)
    result = search(probe, settings, device, Budget(args.seconds), 4 * STREAMS_AIM)
    for row in result.get("probes", []):
        if "peak_bytes" in row:
            row["peak_mb_per_stream"] = row["peak_bytes"] / row["streams"] / 2**20
        print({k: v for k, v in row.items() if not isinstance(v, list)}, flush=True)
    print({k: v for k, v in result.items() if k != "probes"})
    report = {"environment": capture_environment(sys.argv), "throughput": result}
    write_result(Path(args.out), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
