"""The shape of the code and of the test suite. A test module is only tests: what several
modules share lives in a helpers module, a fixture or a conftest, so running, moving or deleting
one test file never changes another. And a Python file stays short enough to read (one idea per
file, ~300 lines): a longer one says at its top why it is one file."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from tests.conftest import MARKERS_BY_DIRECTORY
from tests.import_graph import imports_of

TESTS = Path(__file__).parent
REPO = TESTS.parent

MAX_LINES = 320  # ~300 lines, with some slack so that a small edit does not force a split
# A longer file's module docstring has a line (a paragraph) starting with this, giving the reason.
REASON = "Why this file is longer"


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


def tracked_python_files(root: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "*.py"], cwd=root, capture_output=True, check=True, text=True
    )
    return sorted(name for name in listed.stdout.split("\0") if name)


def long_files_without_a_reason(root: Path, names: list[str]) -> list[str]:
    """The files of `names` (relative to root) over MAX_LINES whose module docstring has no line
    starting with REASON."""
    found = []
    for name in names:
        text = (root / name).read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not any(line.startswith(REASON) for line in doc.splitlines()):
            found.append(f"{name}: {lines} lines, no '{REASON}...' in its docstring")
    return found


def test_every_long_file_states_why_it_is_one_file():
    assert long_files_without_a_reason(REPO, tracked_python_files(REPO)) == []


def test_the_length_guard_catches_a_long_file_without_a_reason(tmp_path):
    body = "x = 1\n" * MAX_LINES
    files = {
        "short.py": '"""Short."""\n' + "x = 1\n" * (MAX_LINES - 1),
        "long.py": '"""Long, and silent about it."""\n' + body,
        "comment.py": f"# {REASON} than 300 lines: a comment is not the docstring\n" + body,
        "later.py": f'"""Long."""\n\n"""{REASON}: not the module docstring."""\n' + body,
        "reasoned.py": f'"""Long.\n\n{REASON} than ~300 lines: one state machine.\n"""\n' + body,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = long_files_without_a_reason(tmp_path, sorted(files))
    assert [line.split(":")[0] for line in found] == ["comment.py", "later.py", "long.py"]


def test_the_length_guard_reads_every_tracked_python_file(tmp_path):
    for name in ("a.py", "pkg/b.py", "untracked.py", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "a.py", "pkg/b.py", "notes.txt"], cwd=tmp_path, check=True)
    assert tracked_python_files(tmp_path) == ["a.py", "pkg/b.py"]
