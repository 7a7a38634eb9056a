"""The installed package holds the product; the soak, churn, pipe and server load harnesses are repository tools.

They live in the repository's ``bench/`` package (not installed), which imports ``audiomask`` and never the
reverse; their ``scripts/`` run as files from any working directory.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
HARNESSES = ("soak", "churn", "server_churn", "server_process", "pipe")
HARNESS_SCRIPTS = ("soak.py", "soak_streams.py", "soak_server.py", "bench_pipe.py", "bench_server.py")
HELP_TIMEOUT_S = 120


@pytest.mark.parametrize("name", HARNESSES)
def test_each_harness_is_in_the_repository_bench_package_not_in_audiomask(name: str) -> None:
    assert importlib.util.find_spec(f"audiomask.bench.{name}") is None
    spec = importlib.util.find_spec(f"bench.{name}")
    assert spec is not None and Path(spec.origin) == REPOSITORY / "bench" / f"{name}.py"


def _imported_roots(path: Path) -> set[str]:
    """The top-level package names that the module at ``path`` imports (absolute imports only)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_package_never_imports_the_repository_bench() -> None:
    importers = [
        str(path.relative_to(REPOSITORY))
        for path in sorted((REPOSITORY / "audiomask").rglob("*.py"))
        if "bench" in _imported_roots(path)
    ]
    assert importers == []


@pytest.mark.parametrize("script", HARNESS_SCRIPTS)
def test_a_harness_script_runs_as_a_file_from_any_directory(script: str, tmp_path: Path) -> None:
    command = [sys.executable, str(REPOSITORY / "scripts" / script), "--help"]
    finished = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=HELP_TIMEOUT_S, check=False
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith("usage: ")


def test_the_harnesses_locate_the_repository_from_where_they_lie() -> None:
    from bench import server_churn, server_process

    assert server_process.REPOSITORY == REPOSITORY  # the server subprocess's working directory
    assert server_churn.SAMPLES == REPOSITORY / "samples"
    assert server_churn.churn_clips()  # cut from the repository's sample files
