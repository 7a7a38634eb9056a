#!/usr/bin/env python3
"""Host->device copy strategies side by side: see :mod:`audiomask.bench.transfer` (flags, output, verdicts).

Usage: python3 scripts/bench_transfer.py --out bench/results/transfer_h200.json [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, installed or not

from audiomask.bench.transfer import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
