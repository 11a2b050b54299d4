"""Fixtures the whole suite shares, and the markers every test gets from where it lives.

Markers follow the directory, not the file, so a new test module is marked without a line of
its own: `unit` (tests/core, tests/server, tests/worker and the modules at the top of tests/:
one process, no service started), `service` (tests/service: the scheduler service over real
gRPC in this process), `e2e` (tests/e2e: real processes, HTTP and the official client) and
`deploy` (tests/deploy: compose, Kubernetes, Prometheus). `slow` marks e2e and deploy, the
tests that start whole stacks or external tools; `make test-fast` runs the rest.
"""

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.service.helpers import running_scheduler

TESTS = Path(__file__).parent
MARKERS_BY_DIRECTORY = {
    "core": ("unit",),
    "server": ("unit",),
    "worker": ("unit",),
    "service": ("service",),
    "e2e": ("e2e", "slow"),
    "deploy": ("deploy", "slow"),
}


def markers_for(path: Path) -> tuple[str, ...]:
    """The markers of a test file: by its first directory under tests/ (a module at the top
    of tests/ is a unit test). A directory not named above is marked `unit` so that the suite
    still runs; tests/test_layout.py fails until it is named."""
    parts = path.resolve().relative_to(TESTS).parts
    if len(parts) == 1:
        return ("unit",)
    return MARKERS_BY_DIRECTORY.get(parts[0], ("unit",))


def free_disk() -> str:
    """Free disk where the suite writes (temporary files, the repository's build/ and cache):
    a run that fills the disk fails in tests that have nothing to do with the cause."""
    places = {"tmp": tempfile.gettempdir(), "repository": str(TESTS.parent)}
    return ", ".join(f"{k} {shutil.disk_usage(v).free / 2**30:.1f} GiB" for k, v in places.items())


def pytest_report_header() -> str:
    return f"free disk: {free_disk()}"


def pytest_terminal_summary(terminalreporter) -> None:
    """Shown under -q too, at the end, where a failed run is read."""
    terminalreporter.write_line(f"free disk at the end: {free_disk()}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in markers_for(item.path):
            item.add_marker(name)


@pytest.fixture
def scheduler():
    """A scheduler service running in this process (see `running_scheduler`)."""
    with running_scheduler() as handle:
        yield handle
