"""What every benchmark result records (shared by scripts/bench_*.py): now :mod:`audiomask.bench.environment`.

Kept so that the scripts import it as before, from a checkout whether the package is installed or not.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, installed or not

from audiomask.bench.environment import capture_environment, write_result

__all__ = ["capture_environment", "write_result"]
