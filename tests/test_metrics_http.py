"""Every service's Prometheus endpoint closes a connection that sends nothing (each one is a
thread of the serving process: 300 silent clients held 300 threads), and still serves scrapes."""

from __future__ import annotations

import socket
import time
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from kvledger.metrics_http import start_metrics_server
from tests.serving import free_port


def test_a_silent_connection_is_closed_and_scrapes_still_work(capfd):
    registry = CollectorRegistry()
    Counter("kvledger_probe_total", "a probe", registry=registry).inc()
    port = free_port()
    server = start_metrics_server(port, "127.0.0.1", registry, timeout=0.5)
    try:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        time.sleep(1.5)
        for sock in silent:
            sock.settimeout(2)
            assert sock.recv(1) == b"", "the server kept a silent connection open"
            sock.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert b"kvledger_probe_total 1.0" in reply.read()
        assert "Traceback" not in capfd.readouterr().err
    finally:
        server.shutdown()
