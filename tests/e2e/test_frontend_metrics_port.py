"""The frontend's metrics port, started as its own process with API keys: Prometheus scrapes it
without a key, while the HTTP port's /metrics stays behind the key."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from tests.serving import REPO, free_port


def test_the_metrics_port_serves_metrics_without_a_key_while_the_api_port_needs_one(tmp_path):
    """With API keys, Prometheus (compose's, on the internal network) scrapes the frontend's
    metrics port; the HTTP port's /metrics stays behind the key."""
    port, metrics_port = free_port(), free_port()
    env = dict(os.environ, KVLEDGER_API_KEY="k")
    argv = [
        sys.executable,
        "-m",
        "server",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
    ]
    argv += ["--scheduler", f"127.0.0.1:{free_port()}"]
    with open(tmp_path / "frontend.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, (tmp_path / "frontend.log").read_text()
                time.sleep(0.2)
        assert scraped.status_code == 200 and "kvledger_http_requests_total" in scraped.text
        deadline = time.monotonic() + 60
        while True:
            try:
                keyed = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert keyed.status_code == 401
    finally:
        proc.terminate()
        proc.wait(30)
