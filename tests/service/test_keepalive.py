"""A peer that vanishes without closing its connection (host lost, partition; here SIGSTOP) is
noticed by keepalive within ~15 s, so its requests move on instead of hanging."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.service.helpers import Worker, wait_for
from tests.serving import free_port

ROOT = Path(__file__).resolve().parents[2]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_worker_notices_a_frozen_scheduler_within_20_seconds():
    port = free_port()
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "scheduler_svc", "--grpc-port", str(port)]
        + ["--metrics-port", str(free_port()), "--allow-unauthenticated-workers"]
        + ["--allow-unauthenticated-frontends"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = None
    try:
        wait_for(lambda: listening(port), timeout=30)
        worker = Worker(f"127.0.0.1:{port}", "w0")
        wait_for(lambda: worker.client._call is not None)
        call = worker.client._call
        time.sleep(2)  # registered and idle: only keepalive pings cross the link now
        os.kill(scheduler.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        while worker.client._call is call and time.monotonic() - frozen < 40:
            time.sleep(0.2)
        took = time.monotonic() - frozen
        assert took < 20, f"the worker was still attached to a frozen scheduler after {took:.0f} s"
    finally:
        os.kill(scheduler.pid, signal.SIGCONT)
        scheduler.kill()
        scheduler.wait()
        if worker is not None:
            worker.stop()
