"""The shape of the test suite itself: a test module is only tests. What several modules share
lives in a helpers module or a conftest, so running, moving or deleting one test file never
changes another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return names


def test_no_module_imports_from_a_test_module():
    offenders = [
        f"{path.relative_to(TESTS.parent)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in _imports(path)
        if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert offenders == []
