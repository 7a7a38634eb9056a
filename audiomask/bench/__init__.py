"""Benchmarks that ship with the package: ``audiomask bench`` and ``scripts/``.

Entry points (each ``main(argv)``, each writing one JSON report with its command):

- :mod:`audiomask.bench.latency`: the streaming latency benchmark (transfer
  strategies, serial versus overlapped pipeline, single-stream latency per
  chunk size, concurrent real-time streams); ``audiomask bench``,
  ``scripts/bench_latency.py``.
- :mod:`audiomask.bench.transfer`: host->device copy strategies side by side
  (``scripts/bench_transfer.py``), reused by the latency benchmark.
- :mod:`audiomask.bench.soak`: the streaming driver under streams that come
  and go for >= 100,000 chunks, every transfer checksummed (``scripts/soak.py``).
- :mod:`audiomask.bench.churn`: the recognizer under thousands of streams
  opened in random order across threads, some never fed, dropped or slow,
  every finished text checked (``scripts/soak_streams.py``).
- :mod:`audiomask.bench.pipe`: ``audiomask transcribe -`` on a long pipe, its
  peak memory and first partial (``scripts/bench_pipe.py``).
- :mod:`audiomask.bench.server_churn`: ``audiomask serve`` under thousands of
  short connections of five kinds, its memory, threads and sockets before and
  after (``scripts/soak_server.py``); the server subprocess that it and
  ``scripts/bench_server.py`` start is :mod:`~audiomask.bench.server_process`.

Their parts: :mod:`~audiomask.bench.models` (the encoders measured),
:mod:`~audiomask.bench.overlap` (serial versus overlapped driver),
:mod:`~audiomask.bench.single_stream` (latency per chunk size),
:mod:`~audiomask.bench.throughput` (the most concurrent real-time streams),
:mod:`~audiomask.bench.copy_timing` (how one copy strategy is timed, per GPU
state) and :mod:`~audiomask.bench.transfer_verdicts` (what a transfer run
must show), :mod:`~audiomask.bench.device_masks` (the Phi-4MM hidden-state
mask built on the device, the "skip the copy" alternative),
:mod:`~audiomask.bench.harness` (baseline copy strategies and the busy-GPU
queue filler), :mod:`~audiomask.bench.signals` (synthetic audio),
:mod:`~audiomask.bench.timing` (percentiles, budgets, interleaved timing),
:mod:`~audiomask.bench.plots` (PNGs) and :mod:`~audiomask.bench.environment`
(what every report records about its run).

The rest of the package never imports these modules, except ``audiomask bench``,
which loads :mod:`audiomask.bench.latency` when it runs.
"""
