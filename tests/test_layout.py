"""The shape of the test suite itself: a test module is only tests. What several modules share
lives in a helpers module, a fixture or a conftest, so running, moving or deleting one test file
never changes another."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import MARKERS_BY_DIRECTORY
from tests.import_graph import imports_of

TESTS = Path(__file__).parent
REPO = TESTS.parent


def imports_of_test_modules(root: Path) -> list[str]:
    """Every import of a test module under root/tests, in any spelling: `import a.test_x`,
    `from a import test_x`, `from a.test_x import f`, relative or inside a function."""
    return [
        f"{path.relative_to(root)} imports {imp.target}"
        for path in sorted((root / "tests").rglob("*.py"))
        for imp in imports_of(root, path)
        if imp.target.startswith("tests.") and imp.target.rsplit(".", 1)[-1].startswith("test_")
    ]


def test_no_module_imports_from_a_test_module():
    assert imports_of_test_modules(REPO) == []


def test_the_guard_catches_every_spelling(tmp_path):
    files = {
        "tests/__init__.py": "",
        "tests/a/__init__.py": "",
        "tests/a/test_x.py": "def scenario():\n    pass\n",
        "tests/a/helpers.py": "",
        "tests/b/__init__.py": "",
        "tests/b/test_import.py": "import tests.a.test_x\n",
        "tests/b/test_from_package.py": "from tests.a import test_x as links\n",
        "tests/b/test_from_module.py": "from tests.a.test_x import scenario\n",
        "tests/a/test_relative.py": "def f():\n    from . import test_x\n",
        "tests/b/test_fine.py": "from tests.a import helpers\nfrom tests.a.helpers import *\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert imports_of_test_modules(tmp_path) == [
        "tests/a/test_relative.py imports tests.a.test_x",
        "tests/b/test_from_module.py imports tests.a.test_x",
        "tests/b/test_from_package.py imports tests.a.test_x",
        "tests/b/test_import.py imports tests.a.test_x",
    ]


def test_every_test_directory_has_its_markers():
    """tests/conftest.py marks tests by directory: a new one must say which kind it holds."""
    folders = {p.relative_to(TESTS).parts[0] for p in TESTS.glob("*/**/test_*.py")}
    assert folders - set(MARKERS_BY_DIRECTORY) == set()
