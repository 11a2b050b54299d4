"""External tools of the deployment tests: on PATH, or the test fails saying how to get them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# tool -> Debian package that ships it (deploy/ci-deps.sh installs them)
PACKAGES = {
    "docker-compose": "docker-compose",
    "promtool": "prometheus",
    "prometheus": "prometheus",
}


def require(tool: str) -> str:
    """Path of `tool`; a loud failure (never a skip) when it is missing."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(
            f"`{tool}` is not installed: it comes with the Debian package "
            f"`{PACKAGES[tool]}`; run `bash deploy/ci-deps.sh` (as root)",
            pytrace=False,
        )
    return path


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, **kw)  # type: ignore[call-overload]
