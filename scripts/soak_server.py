#!/usr/bin/env python3
"""Connection churn of ``audiomask serve``: see :mod:`bench.server_churn` (what it runs, checks, reports).

Usage: python scripts/soak_server.py --cycles 10000 --out bench/results/server_churn_cpu.json
       python scripts/soak_server.py --cycles 10000 --device cuda --out bench/results/server_churn_h200.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench/ is not installed

from bench.server_churn import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
