#!/usr/bin/env python3
"""The soak of the streaming driver: see :mod:`bench.soak` (what it runs, what it checks, its report).

Usage: python3 scripts/soak.py --device cpu --chunks 100000 --out bench/results/soak_cpu.json
       python3 scripts/soak.py --device cuda --chunks 100000 --out bench/results/soak_h200.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench/ is not installed

from bench.soak import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
