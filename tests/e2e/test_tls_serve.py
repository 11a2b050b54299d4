"""`kvledger serve` with mutual TLS on every gRPC link (certificates made at test time): it
serves, its children get the files' paths and never their contents, and a scheduler bound
beyond loopback without TLS says so loudly."""

from __future__ import annotations

import time

import httpx

from tests.certs import CA
from tests.e2e.helpers import cmdline, spawn
from tests.serving import descendants, free_port, start_serve


def test_serve_with_mutual_tls_serves_and_keeps_keys_out_of_argv_and_logs(tmp_path):
    ca = CA(tmp_path, "ca")
    both = ca.issue("kvledger", server=True, client=True)  # serve's children share one pair
    tls = ["--grpc-tls-cert", both.cert, "--grpc-tls-key", both.key, "--grpc-tls-ca", ca.pem]
    served = start_serve(tmp_path, *tls, "--num-kv-blocks", "64")
    try:
        body = {"model": "tiny-llama", "prompt": "over TLS", "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{served.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        argv = [cmdline(p) for p in descendants(served.process.pid)]
        assert any("-m scheduler_svc" in a and "--grpc-tls-ca" in a for a in argv), argv
        assert sum("-m worker" in a and both.key in a for a in argv) == 1, argv
        key_lines = open(both.key).read().splitlines()[1:-1]  # noqa: SIM115
        assert not any(line in a for line in key_lines for a in argv)
        log = served.log()
        assert "TLS, clients need a certificate" in log
        assert "PRIVATE KEY" not in log and not any(line in log for line in key_lines)
    finally:
        served.stop()


def test_a_scheduler_reachable_from_other_hosts_without_tls_says_so(tmp_path, processes):
    log = tmp_path / "scheduler.log"
    args = ("--grpc-host", "0.0.0.0", "--grpc-port", str(free_port()))
    args += ("--metrics-port", str(free_port()))
    processes.append(spawn("scheduler_svc", *args, log=log))
    deadline = time.monotonic() + 30
    while "scheduler listening" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    text = log.read_text()
    assert "INSECURE: the scheduler binds 0.0.0.0" in text and "without TLS" in text
    assert "worker token" not in text.split("INSECURE:")[1].splitlines()[0]  # it has one
