"""Comments state facts and contracts; the figures that chose a default, and their machine, are in the docs.

The library modules' comments and docstrings name no machine and no measurement's provenance, and every
constant that docs/defaults.md lists holds the value listed there.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "audiomask"
LIBRARY_MODULES = sorted(
    [
        *(PACKAGE / "features").glob("*.py"),
        *(PACKAGE / "masks").glob("*.py"),
        *(PACKAGE / "transfer").glob("*.py"),
        *(p for p in (PACKAGE / "models").glob("*.py") if p.name not in ("config.py", "pretrained.py")),
        *(PACKAGE / "asr" / name for name in ("outputs.py", "stats.py", "decoding.py", "model.py", "transcript.py")),
        *(PACKAGE / name for name in ("audio.py", "samples.py", "constants.py", "checks.py")),
    ]
)
# A machine named, or a figure's provenance told ("measured", "the box"): what belongs in the docs.
PROVENANCE = re.compile(r"\b(H200|H100|A100|EPYC|Xeon|2-core|16-vCPU|measured|profiled|the box)\b", re.IGNORECASE)
SECTION = "# audiomask: defaults and the figures behind them"
# A table row whose first cell is one dotted name under audiomask: `audiomask.x.y.NAME` | value | ...
CONSTANT_ROW = re.compile(r"^\| `(audiomask(?:\.\w+)+)` \| ([^|]+) \|")


def _prose(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and every module, class and function docstring of ``path``."""
    source = path.read_text()
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return found


@pytest.mark.parametrize("path", LIBRARY_MODULES, ids=lambda p: str(p.relative_to(REPOSITORY)))
def test_library_comments_and_docstrings_name_no_machine_nor_measurement(path: Path) -> None:
    offending = [(line, match.group(0)) for line, text in _prose(path) for match in PROVENANCE.finditer(text)]
    assert offending == []


def _section_rows() -> list[tuple[str, str]]:
    text = (REPOSITORY / "docs" / "defaults.md").read_text()
    assert SECTION in text
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [match.groups() for match in map(CONSTANT_ROW.match, section.splitlines()) if match]


def _resolve(dotted: str) -> object:
    """The object a dotted name under ``audiomask`` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise AssertionError(f"{dotted} names nothing")


def test_the_defaults_section_lists_each_constant_with_its_value() -> None:
    rows = _section_rows()
    assert len(rows) >= 10
    for name, cell in rows:
        listed = float(cell.split("(")[0].replace(",", "").strip())
        assert _resolve(name) == listed, name
