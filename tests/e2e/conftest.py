"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture
def processes():
    """Processes a test starts (tests.e2e.helpers.spawn); killed when it ends."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()
