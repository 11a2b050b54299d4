"""`kvledger serve --log-format json`: every line every service writes is one JSON object
(no progress bars, no plain prints), and a response names its request (`X-Request-Id`; the
completion id, which the scheduler's and workers' lines name, carries it). That a line logged
while handling a request carries its id is tests/test_log.py's."""

from __future__ import annotations

import json

import httpx

from tests.serving import start_serve


def test_every_line_is_json_and_names_its_request(tmp_path):
    served = start_serve(tmp_path, "--log-format", "json")
    try:
        reply = httpx.post(
            f"{served.url}/v1/completions",
            json={"model": "tiny-llama", "prompt": "hello", "max_tokens": 3},
            timeout=60,
        )
        assert reply.status_code == 200
        request_id = reply.headers["x-request-id"]
        assert request_id in reply.json()["id"]
    finally:
        served.stop()
    lines = [line for line in served.log().splitlines() if line.strip()]
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    services = {e["service"] for e in entries}
    assert {"serve", "scheduler", "worker", "frontend"} <= services
    assert any("kvledger is serving" in e["message"] for e in entries)
