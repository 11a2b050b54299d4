"""Start `kvledger serve` (real processes, loopback, free ports) for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(length: int) -> int:
    """First of `length` consecutive free ports (worker i's metrics sit at base+1+i)."""
    for _ in range(100):
        base = free_port()
        ok = True
        for p in range(base, base + length):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no run of free ports")


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    stack = [pid]
    while stack:
        current = stack.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for kid in map(int, kids):
                if kid not in found:
                    found.add(kid)
                    stack.append(kid)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class Served:
    process: subprocess.Popen
    port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    children: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def scheduler_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        self.children = descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            for pid in self.children:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            raise


def start_serve(
    tmp: Path,
    *extra: str,
    timeout: float = 240.0,
    embedding: bool = False,
    debug_invariants: bool = True,
    new_session: bool = False,
) -> Served:
    """`embedding=False` skips the default embedding worker (faster, for generation tests);
    benchmarks turn the per-step invariant check (O(pool) each step) off; `new_session` puts
    serve and its children in a process group of their own (to signal the whole group)."""
    port, grpc_port = free_port(), free_port()
    metrics_port = free_port_run(4)
    if "--model" not in extra:
        # the suite's fast model; serve's own default (the real SmolLM2) is tested on its own
        extra = ("--model", "tiny-llama", *extra)
    log_path = tmp / "serve.log"
    cmd = [
        sys.executable,
        "-m",
        "kvledger.cli",
        "serve",
        "--port",
        str(port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
        *extra,
    ]
    if debug_invariants:
        cmd.append("--debug-invariants")
    if not embedding:
        cmd += ["--embedding-model", "none"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=new_session,
        )
    served = Served(process, port, grpc_port, metrics_port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"kvledger serve exited early:\n{served.log()}")
        if "kvledger is serving" in served.log():
            with urllib.request.urlopen(f"{served.url}/health", timeout=5) as reply:
                assert reply.status == 200
            return served
        time.sleep(0.2)
    served.stop()
    raise RuntimeError(f"kvledger serve not ready after {timeout}s:\n{served.log()}")


def scrape(url: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value}."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def wait_metric(url: str, name: str, value: float, timeout: float = 60, **labels: str) -> None:
    """Until the sum of `name`'s samples with these labels at `url` reaches `value` (at least):
    tests gate on what the services report, never on a sleep."""
    deadline = time.monotonic() + timeout
    while metric_sum(scrape(url), name, **labels) < value:
        assert time.monotonic() < deadline, f"{name}{labels} never reached {value} at {url}"
        time.sleep(0.02)


def metric_sum(samples: dict[str, float], name: str, **labels: str) -> float:
    total = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total
