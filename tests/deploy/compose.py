"""docker-compose.yml as docker-compose resolves it, and its kvledger services' parsed flags."""

from __future__ import annotations

import argparse
import functools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import yaml

from kvledger.flags import FLAGS, FRONTEND, SCHEDULER, WORKER, parse
from tests.deploy.tools import REPO, require, run

COMPOSE_FILE = REPO / "docker-compose.yml"
MODULE_SERVICE = {"server": FRONTEND, "scheduler_svc": SCHEDULER, "worker": WORKER}
# KVLEDGER_* variables that are not flags: the model cache directory (kvledger/models.py).
NON_FLAG_ENV = {"KVLEDGER_CACHE_DIR"}
HEALTH_URL = re.compile(r"http://(?:127\.0\.0\.1|localhost):(\d+)(/[\w/.-]*)")


# The tokens compose requires (they have no default, on purpose), as an operator sets them.
TEST_WORKER_TOKEN = "compose-test-worker-token"
TEST_FRONTEND_TOKEN = "compose-test-frontend-token"


def compose_env(**overrides: str) -> dict[str, str]:
    """The caller's environment without anything that compose would interpolate into the file,
    plus the variables an operator must set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KVLEDGER_", "GRAFANA_", "COMPOSE_"))
    }
    env["KVLEDGER_WORKER_AUTH_TOKEN"] = TEST_WORKER_TOKEN
    env["KVLEDGER_FRONTEND_AUTH_TOKEN"] = TEST_FRONTEND_TOKEN
    return env | overrides


def compose_argv(*args: str, profile: str | None = None) -> list[str]:
    argv = [require("docker-compose"), "--project-directory", str(REPO), "-f", str(COMPOSE_FILE)]
    if profile:
        argv += ["--profile", profile]
    return argv + list(args)


@functools.cache
def resolved(profile: str | None = None) -> dict[str, Any]:
    """`docker-compose config` output: anchors merged, variables interpolated with defaults."""
    proc = run(compose_argv("config", profile=profile), env=compose_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def active_services(profile: str | None = None) -> dict[str, dict[str, Any]]:
    """Services compose starts with that profile (docker-compose 1.29's `config` lists all)."""
    services = resolved(profile)["services"]
    return {
        name: svc
        for name, svc in services.items()
        if not svc.get("profiles") or (profile in svc["profiles"])
    }


@dataclass
class KvService:
    name: str  # compose service name (= its hostname on the compose networks)
    service: str  # FRONTEND, SCHEDULER or WORKER
    module: str
    argv: list[str]
    env: dict[str, str]
    spec: dict[str, Any]

    def health_url(self) -> tuple[int, str]:
        """(port, path) that the healthcheck fetches on the container's loopback."""
        match = HEALTH_URL.search(" ".join(self.spec["healthcheck"]["test"]))
        assert match, f"{self.name}: healthcheck fetches no loopback URL"
        return int(match.group(1)), match.group(2)


def kv_services(profile: str | None = None) -> dict[str, KvService]:
    """The services that run a kvledger module (`python -m server|scheduler_svc|worker`)."""
    out: dict[str, KvService] = {}
    for name, spec in active_services(profile).items():
        command = spec.get("command") or []
        if command[:2] == ["python", "-m"] and command[2] in MODULE_SERVICE:
            env = {k: str(v) for k, v in (spec.get("environment") or {}).items()}
            out[name] = KvService(
                name, MODULE_SERVICE[command[2]], command[2], command[3:], env, spec
            )
    return out


@contextmanager
def service_environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ with exactly these KVLEDGER_* flag variables (flags read them at parse time)."""
    saved = dict(os.environ)
    try:
        for flag in FLAGS:
            os.environ.pop(flag.env_var, None)
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse_service(svc: KvService) -> argparse.Namespace:
    """The service's own flag parser applied to its compose command and environment."""
    with service_environment(svc.env):
        return parse(svc.service, svc.argv, f"compose service {svc.name}")


def container_ports(spec: dict[str, Any]) -> list[int]:
    """Container-side ports of `ports:` (short syntax strings or long syntax mappings)."""
    ports: list[int] = []
    for entry in spec.get("ports") or []:
        if isinstance(entry, dict):
            ports.append(int(entry["target"]))
        else:
            ports.append(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)
