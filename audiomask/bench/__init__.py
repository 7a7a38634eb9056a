"""The benchmarks that ship with the package: ``audiomask bench`` and the ``scripts/`` built on its parts.

Entry points (each ``main(argv)``, each writing one JSON report with its command):

- :mod:`audiomask.bench.latency`: the streaming latency benchmark (transfer
  strategies, serial versus overlapped pipeline, single-stream latency per
  chunk size, concurrent real-time streams); ``audiomask bench``,
  ``scripts/bench_latency.py``.
- :mod:`audiomask.bench.transfer`: host->device copy strategies side by side
  (``scripts/bench_transfer.py``), reused by the latency benchmark.

Their parts: :mod:`~audiomask.bench.models` (the encoders measured),
:mod:`~audiomask.bench.overlap` (serial versus overlapped driver),
:mod:`~audiomask.bench.single_stream` (latency per chunk size),
:mod:`~audiomask.bench.throughput` (the most concurrent real-time streams),
:mod:`~audiomask.bench.search` (the search for that count),
:mod:`~audiomask.bench.limits` (how close a row comes to the device's compute
and memory limits), :mod:`~audiomask.bench.tables` (the report on stdout),
:mod:`~audiomask.bench.copy_timing` (how one copy strategy is timed, per GPU
state) and :mod:`~audiomask.bench.transfer_verdicts` (what a transfer run
must show), :mod:`~audiomask.bench.device_masks` (the Phi-4MM hidden-state
mask built on the device, the "skip the copy" alternative),
:mod:`~audiomask.bench.harness` (baseline copy strategies and the busy-GPU
queue filler), :mod:`~audiomask.bench.signals` (synthetic audio),
:mod:`~audiomask.bench.timing` (percentiles, budgets, interleaved timing),
:mod:`~audiomask.bench.plots` (PNGs) and :mod:`~audiomask.bench.environment`
(what every report records about its run).

The soak, churn, pipe and server load harnesses are development tools, not
installed: the repository's ``bench/`` package (``bench.soak``,
``bench.churn``, ``bench.pipe``, ``bench.server_churn``,
``bench.server_process``), run by ``scripts/soak.py``,
``scripts/soak_streams.py``, ``scripts/bench_pipe.py``,
``scripts/soak_server.py`` and ``scripts/bench_server.py``. They import
these modules; nothing here imports them.

The rest of the package never imports these modules, except ``audiomask bench``,
which loads :mod:`audiomask.bench.latency` when it runs.
"""
