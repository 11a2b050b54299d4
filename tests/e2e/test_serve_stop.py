"""`kvledger serve` stopping: a clean stop leaves no child process, and SIGTERM while the
services are still starting stops every one of them."""

from __future__ import annotations

import time

from tests.serving import alive, start_serve


def test_stop_leaves_no_process(tmp_path):
    served = start_serve(tmp_path, "--num-kv-blocks", "32")
    code = served.stop()
    assert code == 0, served.log()
    assert len(served.children) >= 3
    deadline = time.monotonic() + 5
    while any(alive(p) for p in served.children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in served.children if alive(p)]


def test_sigterm_during_startup_stops_everything(tmp_path):
    import signal
    import subprocess
    import sys

    from tests.serving import REPO, descendants, free_port

    cmd = [
        sys.executable,
        "-m",
        "kvledger.cli",
        "serve",
        "--port",
        str(free_port()),
        "--grpc-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
        "--model",
        "tiny-llama",
        "--embedding-model",
        "none",
        "--require-model",
        "never-served",
    ]
    process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(descendants(process.pid)) < 3:
        assert time.monotonic() < deadline, "services never started"
        time.sleep(0.1)
    children = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    time.sleep(0.5)
    assert not [p for p in children if alive(p)]
