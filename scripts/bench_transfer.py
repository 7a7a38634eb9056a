#!/usr/bin/env python3
"""Host->device copy strategies side by side: see :mod:`audiomask.bench.transfer` (flags, output, verdicts).

Usage (the H200): python3 scripts/bench_transfer.py --out bench/results/transfer_h200.json
CPU smoke test:   python3 scripts/bench_transfer.py --quick --out /tmp/transfer.json
"""

from __future__ import annotations

import sys

from audiomask.bench.transfer import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
