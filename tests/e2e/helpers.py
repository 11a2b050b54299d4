"""What the end-to-end tests share (imported by name; conftest holds only fixtures)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from httpx import ASGITransport, AsyncClient

from kvledger.config.frontend import Settings
from server.app import build_app
from tests.serving import REPO, metric_sum, scrape


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def idle(served, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = scrape(served.scheduler_metrics_url)
        if (
            metric_sum(s, "kvledger_kv_blocks_in_use") == 0
            and metric_sum(s, "kvledger_tracker_entries") == 0
            and metric_sum(s, "kvledger_num_requests_running") == 0
            and metric_sum(s, "kvledger_num_requests_waiting") == 0
        ):
            return True
        time.sleep(0.05)
    return False


async def with_app(settings: Settings, body) -> object:  # noqa: ANN001
    app = build_app(settings)
    async with app.router.lifespan_context(app):
        transport = ASGITransport(app, raise_app_exceptions=False)
        async with AsyncClient(transport=transport, base_url="http://t", timeout=30) as http:
            return await body(app, http)


# Shared by the scheduler and the workers these tests start.
ENV = dict(
    os.environ,
    KVLEDGER_WORKER_AUTH_TOKEN="faults-test-token",
    KVLEDGER_FRONTEND_AUTH_TOKEN="faults-frontend-token",
)


def spawn(module: str, *args: str, log: Path) -> subprocess.Popen:
    if module == "worker" and "--model" not in args:
        args = ("--model", "tiny-llama", *args)  # the suite's fast model, not serve's default
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=ENV,
        )


def wait_status(url: str, status: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == status:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered {status}"
        time.sleep(0.1)


def refused(reply: httpx.Response, param: str | None, says: str = "") -> None:
    """A 400 in OpenAI's shape naming `param`, its message saying `says`."""
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert says in error["message"], error
