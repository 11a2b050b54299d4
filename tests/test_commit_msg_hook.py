"""The commit-msg hook (`.githooks/`, turned on by `make hooks`) refuses a subject over 72
characters and passes one of 72, reading the first line that is not a comment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parent.parent / ".githooks" / "commit-msg"


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C"}  # the hook counts characters under any locale
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ("x" * 72 + "\n\nA body line may be as long as it needs to be. " * 5, False),
        ("x" * 73 + "\n", True),
        ("# a comment git adds, however long it is: " + "#" * 80 + "\n" + "y" * 72 + "\n", False),
        ("\n# comment\n" + "é" * 73 + "\n", True),  # characters, not bytes
        ("é" * 72 + "\n", False),
    ],
)
def test_the_hook_holds_the_subject_to_72_characters(tmp_path, message, refused):  # noqa: ANN001
    done = run_hook(tmp_path, message)
    assert (done.returncode != 0) == refused, done.stderr
    if refused:
        assert "over 72" in done.stderr
