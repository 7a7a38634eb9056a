#!/usr/bin/env python3
"""The streaming latency benchmark: see :mod:`audiomask.bench.latency` (also ``audiomask bench``).

Usage (the H200): python3 scripts/bench_latency.py --out bench/results/latency_h200.json
CPU smoke test:   python3 scripts/bench_latency.py --quick --out /tmp/latency.json
PNGs of a report: python3 scripts/bench_latency.py --plot bench/results/latency_h200.json
"""

from __future__ import annotations

import sys

from audiomask.bench.latency import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
