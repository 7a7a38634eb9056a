#!/usr/bin/env python3
"""The churn soak of the recognizer: see :mod:`bench.churn` (what it runs, what it checks, its report).

Usage: python scripts/soak_streams.py --streams 10000 --threads 8 --out bench/results/churn_cpu.json
       python scripts/soak_streams.py --streams 10000 --threads 8 --device cuda --out bench/results/churn_h200.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench/ is not installed

from bench.churn import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
