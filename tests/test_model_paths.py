"""What --model resolves to (kvledger/models.py), and serve refusing a bad one in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvledger.gguf_file import GGUFError
from kvledger.models import SMOLLM2, SMOLLM2_FILE, resolve_model

REPO = Path(__file__).resolve().parents[1]


def test_the_default_model_is_the_packaged_gguf_file():
    path = resolve_model(SMOLLM2)
    assert path.name == SMOLLM2_FILE and path.is_file()


def test_a_gguf_file_or_a_directory_holding_one(tmp_path):
    file = tmp_path / "m.gguf"
    file.write_bytes(b"GGUF")
    assert resolve_model(str(file)) == file.resolve()
    assert resolve_model(str(tmp_path)) == file.resolve()
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(GGUFError, match="several GGUF files"):
        resolve_model(str(tmp_path))


def test_a_directory_with_neither_config_nor_gguf_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json and no \.gguf"):
        resolve_model(str(tmp_path))


def test_serve_refuses_a_missing_model_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "kvledger.cli", "serve", "--model", str(tmp_path / "nope")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope" in lines[0] and "Traceback" not in result.stderr
