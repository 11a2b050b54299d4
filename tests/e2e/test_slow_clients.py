"""Slow or idle clients cannot lock others out: past --limit-concurrency open connections the
frontend answers new requests 503 at once instead of queueing them behind descriptors it has
run out of, and serves again as soon as they go. (A header block still incomplete past 16 KiB is
refused rather than buffered, by h11's incomplete-event limit; not timed here: whether a fast
client's headers arrive whole or in pieces decides whether the limit applies.)"""

from __future__ import annotations

import socket

import httpx

from tests.serving import start_serve


def _trickling(port: int) -> socket.socket:
    """A connection that sent half a request line and nothing since."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    return sock


def test_trickling_connections_past_the_limit_do_not_lock_out_others(tmp_path):
    served = start_serve(tmp_path, "--limit-concurrency", "4")
    socks: list[socket.socket] = []
    try:
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
        socks = [_trickling(served.port) for _ in range(6)]
        refused = httpx.get(f"{served.url}/health", timeout=10)
        assert refused.status_code == 503
        for sock in socks:
            sock.close()
        socks = []
        reply = httpx.post(
            f"{served.url}/v1/completions",
            json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2},
            timeout=60,
        )
        assert reply.status_code == 200
    finally:
        for sock in socks:
            sock.close()
        served.stop()
