#!/usr/bin/env python3
"""``audiomask transcribe -`` on a long pipe: see :mod:`bench.pipe` (what it runs, what it checks).

Usage: python scripts/bench_pipe.py --minutes 60 --out bench/results/pipe_cpu.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench/ is not installed

from bench.pipe import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
