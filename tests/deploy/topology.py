"""The compose topology as local processes: each kvledger service of docker-compose.yml runs with
its compose command and environment, compose hostnames mapped to loopback and every port it
binds mapped to a free one; services start in depends_on order, each once its healthcheck URL
answers (compose's `service_healthy`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvledger.flags import FLAGS, FRONTEND, SCHEDULER
from tests.deploy.compose import KvService, kv_services, parse_service
from tests.serving import REPO, free_port

# The flags through which each service binds a port.
PORT_FLAGS = {FRONTEND: ("port", "metrics_port"), SCHEDULER: ("grpc_port", "metrics_port")}
PORT_ENV = {"KVLEDGER_PORT", "KVLEDGER_GRPC_PORT", "KVLEDGER_METRICS_PORT"}
BIND_ENV = ("KVLEDGER_HOST", "KVLEDGER_GRPC_HOST")


@dataclass
class LocalTopology:
    services: dict[str, KvService]
    ports: dict[tuple[str, int], int]  # (compose host, compose port) -> loopback port
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def address(self, host: str, port: int) -> str:
        return f"127.0.0.1:{self.ports[(host, port)]}"

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in reversed(list(self.processes.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _start_order(services: dict[str, KvService]) -> list[str]:
    order: list[str] = []
    while len(order) < len(services):
        ready = [
            n
            for n, s in services.items()
            if n not in order and all(d in order for d in s.spec.get("depends_on") or {})
        ]
        assert ready, "depends_on has a cycle or names a service that is not started"
        order += sorted(ready)
    return order


def _local_env(svc: KvService, ports: dict[tuple[str, int], int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {f.env_var for f in FLAGS}}
    for key, value in svc.env.items():
        host, _, port = value.rpartition(":")
        if key in BIND_ENV and value == "0.0.0.0":
            value = "127.0.0.1"
        elif port.isdigit() and (host, int(port)) in ports:
            value = f"127.0.0.1:{ports[(host, int(port))]}"
        elif key in PORT_ENV and (svc.name, int(value)) in ports:
            value = str(ports[(svc.name, int(value))])
        env[key] = value
    return env | {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def start_topology(logs: Path, profile: str | None = None, timeout: float = 240.0) -> LocalTopology:
    services = kv_services(profile)
    ports: dict[tuple[str, int], int] = {}
    for name, svc in services.items():
        args = parse_service(svc)
        for dest in PORT_FLAGS.get(svc.service, ("metrics_port",)):
            ports[(name, getattr(args, dest))] = free_port()
    topo = LocalTopology(services, ports, logs)
    try:
        for name in _start_order(services):
            svc = services[name]
            with open(logs / f"{name}.log", "wb") as log:
                topo.processes[name] = subprocess.Popen(
                    [sys.executable, "-m", svc.module, *svc.argv],
                    cwd=REPO,
                    env=_local_env(svc, ports),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            port, path = svc.health_url()
            url = f"http://{topo.address(name, port)}{path}"
            deadline = time.monotonic() + timeout
            while not _healthy(url):
                if topo.processes[name].poll() is not None:
                    raise RuntimeError(f"{name} exited:\n{topo.log(name)[-4000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not healthy at {url}:\n{topo.log(name)[-4000:]}")
                time.sleep(0.25)
    except BaseException:
        topo.stop()
        raise
    return topo
