"""Repository tools, not installed: the soak, churn, pipe and server load harnesses and their results.

Each harness has a ``main(argv)`` that writes one JSON report with its command, run from the repository
root as ``python scripts/X.py`` (the script puts the root on ``sys.path``):

- :mod:`bench.soak`: the streaming driver under streams that come and go for
  >= 100,000 chunks, every transfer checksummed (``scripts/soak.py``).
- :mod:`bench.churn`: the recognizer under thousands of streams opened in
  random order across threads, some never fed, dropped or slow, every
  finished text checked (``scripts/soak_streams.py``).
- :mod:`bench.pipe`: ``audiomask transcribe -`` on a long pipe, its peak
  memory and first partial (``scripts/bench_pipe.py``).
- :mod:`bench.server_churn`: ``audiomask serve`` under thousands of short
  connections of five kinds, its memory, threads and sockets before and after
  (``scripts/soak_server.py``); the server subprocess that it and
  ``scripts/bench_server.py`` start is :mod:`bench.server_process`.

They import :mod:`audiomask` (its benchmark parts: :mod:`audiomask.bench.environment`,
:mod:`audiomask.bench.signals`, :mod:`audiomask.bench.timing`, :mod:`audiomask.bench.models`);
:mod:`audiomask` never imports them. ``bench/results/`` holds every benchmark's current report
(docs/benchmarks.md lists each with its command).
"""
