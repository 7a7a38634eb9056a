"""Benchmarks that ship with the package: ``audiomask bench`` and ``scripts/bench_*.py``.

- :mod:`audiomask.bench.latency`: the streaming latency benchmark (transfer
  strategies, serial versus overlapped pipeline, single-stream latency per
  chunk size, concurrent real-time streams), ``main(argv)``.
- :mod:`audiomask.bench.transfer`: host->device copy strategies side by side
  (``scripts/bench_transfer.py``), reused by the latency benchmark.
- :mod:`audiomask.bench.device_masks`: the Phi-4MM hidden-state mask built on
  the device with torch (the "skip the copy" alternative the benchmark measures).
- :mod:`audiomask.bench.environment`: what every result file records about its run.

Nothing here is imported by the rest of the package.
"""
