"""bench.server_process reads a process tree's CPU time from /proc, per process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.server_process import cpu_seconds, tree_cpu_seconds

# A parent that starts a child spinning on the CPU, then sleeps: the child's CPU time is its own.
SPIN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(60)"
PARENT = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {SPIN!r}])\ntime.sleep(60)"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc")
def test_tree_cpu_seconds_gives_each_process_below_its_own_cpu_time():
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seconds = tree_cpu_seconds(parent.pid)
            if len(seconds) == 2 and max(seconds.values()) >= 0.5:
                break
            time.sleep(0.1)
        assert len(seconds) == 2, seconds  # the parent and its child
        child = next(pid for pid in seconds if pid != parent.pid)
        assert seconds[child] >= 0.5 > seconds[parent.pid]  # the spinning child's CPU, not its sleeping parent's
        assert seconds[parent.pid] == pytest.approx(cpu_seconds(parent.pid), abs=0.05)
    finally:
        for pid in tree_cpu_seconds(parent.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        parent.wait(10)


def test_a_process_that_does_not_exist_used_no_cpu():
    assert tree_cpu_seconds(-1) == {-1: 0.0}
