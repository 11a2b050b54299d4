"""Helpers of the live tests: traffic through the HTTP API, scrapes, waiting on Prometheus."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.deploy.prom import PrometheusServer

# Long enough to fill several 16-token blocks, so a repeat is answered mostly from the cache.
SHARED_PROMPT = (
    "The scheduler keeps an exact ledger of every key-value block: which prefix it "
    "holds, which requests pin it, and when it was evicted. "
) * 4


def post(url: str, path: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def complete(url: str, prompt: str, max_tokens: int = 4, model: str = "tiny-llama") -> dict:
    return post(
        url,
        "/v1/completions",
        {
            "model": model,
            "prompt": prompt,
            "temperature": 0,
            "max_tokens": max_tokens,
            "ignore_eos": True,
        },
    )


def abandon_stream(host: str, port: int, prompt: str, model: str = "tiny-llama") -> None:
    """Start a long streamed completion, read its first chunk, and hang up (a client abort)."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": 500,
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
        }
    )
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    assert reply.status == 200, reply.read()
    assert reply.readline().startswith(b"data:")
    conn.close()


def metric_names(url: str) -> set[str]:
    """Names of the samples (not just the # HELP lines) in one scrape."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def scalar(prom: PrometheusServer, expr: str) -> float | None:
    reply = prom.query(expr)
    assert reply["status"] == "success", reply
    result = reply["data"]["result"]
    return float(result[0]["value"][1]) if result else None
