"""`kvledger serve` stops within its grace period whatever signals arrive (SIGTERM or SIGINT,
once or twice, to serve alone or to its whole process group as Ctrl-C and systemd send them),
with a request in flight: every child is gone, the stream ends cleanly (an error event or a
finished response, never a cut connection), and the log holds no traceback."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from tests.serving import alive, descendants, start_serve

SHUTDOWN_TIMEOUT = 5.0
# serve waits each child's --shutdown-timeout plus a margin, then kills; allow for a busy CI.
EXIT_DEADLINE = SHUTDOWN_TIMEOUT + 3 + 10


class Stream(threading.Thread):
    """A long streaming completion; records how it ended."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.first_token = threading.Event()
        self.events: list[str] = []
        self.error: Exception | None = None

    def run(self) -> None:
        body = {
            "model": "tiny-llama",
            "prompt": "The ledger says",
            "max_tokens": 1500,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.first_token.set()
        except Exception as err:  # a cut connection lands here
            self.error = err
        finally:
            self.first_token.set()

    @property
    def ended_cleanly(self) -> bool:
        if self.error is not None or not self.events or self.events[-1] != "[DONE]":
            return False
        last = json.loads(self.events[-2]) if len(self.events) > 1 else {}
        return "error" in last or any(c.get("finish_reason") for c in last.get("choices", []))


@pytest.mark.parametrize(
    ("sig", "target", "times"),
    [
        (signal.SIGTERM, "group", 1),  # systemd's KillMode=control-group
        (signal.SIGINT, "group", 2),  # Ctrl-C pressed twice in a terminal
        (signal.SIGTERM, "parent", 1),
        (signal.SIGINT, "parent", 2),
    ],
    ids=["term-group", "int-group-twice", "term-parent", "int-parent-twice"],
)
def test_serve_stops_with_a_request_in_flight(tmp_path, sig, target, times):
    served = start_serve(tmp_path, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), new_session=True)
    children = descendants(served.process.pid)
    stream = Stream(served.url)
    try:
        stream.start()
        assert stream.first_token.wait(60) and stream.events, "no token streamed"
        for i in range(times):
            if i:
                time.sleep(0.3)
            if target == "group":
                os.killpg(served.process.pid, sig)
            else:
                served.process.send_signal(sig)
        served.process.wait(timeout=EXIT_DEADLINE)
        stream.join(10)
        left = [pid for pid in children if alive(pid)]
        assert not left, f"children still running after serve exited: {left}\n{served.log()}"
        assert stream.ended_cleanly, (stream.error, stream.events[-3:], served.log())
        assert "Traceback" not in served.log(), served.log()
    finally:
        for pid in [served.process.pid, *children]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _frontend_pid(pids: set[int]) -> int:
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().split(b"\0")[1:3] == [b"-m", b"server"]:
                return pid
    raise AssertionError(f"no frontend among {pids}")


def test_frontend_keeps_streams_open_through_a_second_ctrl_c(tmp_path):
    """uvicorn alone would take the second SIGINT as "force quit" and cut every open stream;
    the frontend only logs it, so the stream still ends with the error event the scheduler
    sends once the worker stops."""
    served = start_serve(tmp_path, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), new_session=True)
    children = descendants(served.process.pid)
    stream = Stream(served.url)
    try:
        stream.start()
        assert stream.first_token.wait(60) and stream.events, "no token streamed"
        frontend = _frontend_pid(children)
        os.kill(frontend, signal.SIGINT)
        # two signals before the handler runs would arrive as one: wait for its log line
        deadline = time.monotonic() + 30
        while "frontend stopping (SIGINT)" not in served.log():
            assert time.monotonic() < deadline, served.log()
            time.sleep(0.05)
        os.kill(frontend, signal.SIGINT)
        time.sleep(0.5)
        assert stream.is_alive(), (stream.error, served.log())
        os.killpg(served.process.pid, signal.SIGTERM)
        served.process.wait(timeout=EXIT_DEADLINE)
        stream.join(10)
        assert stream.ended_cleanly, (stream.error, stream.events[-3:], served.log())
        assert "frontend: SIGINT again; already stopping" in served.log(), served.log()
    finally:
        for pid in [served.process.pid, *children]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
