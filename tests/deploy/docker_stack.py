"""docker-compose.yml in a real Docker engine: the engine started where none runs, the images
built from Debian's packages and a wheelhouse (no image registry, no package index in a build),
the stack up under a project name of its own, containers inspected, and `down -v`.

Everything here shells out to the same tools an operator uses (docker, docker-compose, the
scripts in deploy/); nothing is simulated.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.compose import compose_argv, compose_env
from tests.deploy.tools import REPO, require
from tests.serving import free_port

BASE_IMAGE = "kvledger-base:bookworm"
IMAGE_TAG = "compose-test"
# Grafana has no image here (no registry, no Debian package): every other service starts.
SERVICES = ["scheduler", "worker", "embedding-worker", "frontend", "prometheus"]
CPU_WORKERS = 2  # a lost worker's streams are recomputed on the other one
BUILD_TIMEOUT = 1500.0  # a cold build on two loaded cores: base, wheelhouse, both images
# What a cold build writes: the wheelhouse (~0.6 GB), the debootstrapped base, the CPU image
# with torch installed, and their build cache. Below this a build fails half way, with errors
# (a stalled download, a full layer) that do not name the cause.
BUILD_FREE_GIB = 6.0


def sh(argv: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    """Runs argv, appends its output to `log`; a failure shows the output's tail."""
    started = time.monotonic()
    proc = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    took = time.monotonic() - started
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}  ({took:.0f} s, rc {proc.returncode})\n")
        out.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise AssertionError(f"{' '.join(argv[:4])} ... failed (rc {proc.returncode}):\n{tail}")
    return proc.stdout


def ensure_engine(log: Path) -> None:
    """A Docker engine that answers: the running one, or Debian's dockerd started as root.
    Skips only where no engine can be had at all (not root and none running)."""
    require("docker-compose")
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0:
        return
    if os.geteuid() != 0:
        pytest.skip("no Docker engine answers, and only root can start one (start-dockerd.sh)")
    sh(["bash", "deploy/start-dockerd.sh"], log, timeout=120)


def require_free_disk(paths: list[str], need_gib: float) -> None:
    """Fails at once, naming the path and the figures, where a build would run out of disk
    (a path not on this host, as a remote engine's data root, is not checked)."""
    for path in filter(os.path.exists, paths):
        free = shutil.disk_usage(path).free / 2**30
        assert free >= need_gib, (
            f"{free:.1f} GiB free on the disk of {path}; building the compose images "
            f"needs about {need_gib:.0f} GiB (free space: docker system prune, old clones)"
        )


def docker(*args: str, timeout: float = 60) -> str:
    proc = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"docker {' '.join(args)}: {proc.stderr}"
    return proc.stdout


# The suite's fast model; the images' default is the real one (smollm2-135m-instruct).
MODEL = "tiny-llama"


@dataclass
class Stack:
    """One compose project of docker-compose.yml, its published ports on this host's loopback."""

    project: str
    log: Path
    http_port: int = field(default_factory=free_port)
    prometheus_port: int = field(default_factory=free_port)
    # Secrets from the environment, as an operator gives them (compose has no defaults).
    api_key: str = field(default_factory=lambda: secrets.token_hex(16))
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.env = compose_env(
            KVLEDGER_WORKER_AUTH_TOKEN=secrets.token_hex(32),
            KVLEDGER_FRONTEND_AUTH_TOKEN=secrets.token_hex(32),
            KVLEDGER_API_KEY=self.api_key,
            KVLEDGER_BASE_IMAGE=BASE_IMAGE,
            KVLEDGER_WHEELHOUSE="1",
            KVLEDGER_IMAGE_TAG=IMAGE_TAG,
            KVLEDGER_HTTP_PUBLISH=f"127.0.0.1:{self.http_port}",
            KVLEDGER_PROMETHEUS_PORT=str(self.prometheus_port),
            KVLEDGER_WORKER_MODEL=MODEL,
            KVLEDGER_WORKER_MODEL_NAME=MODEL,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def compose(self, *args: str, timeout: float = 600) -> str:
        return sh(compose_argv("-p", self.project, *args), self.log, timeout, self.env)

    def build(self) -> None:
        """The Debian-built base, the wheelhouse, then the CPU and Prometheus images (the
        layers of an earlier run are reused); old images of this tag are pruned."""
        root = docker("info", "--format", "{{.DockerRootDir}}").strip()
        require_free_disk([str(REPO), root], BUILD_FREE_GIB)
        wheel_env = dict(os.environ, PYTHON=sys.executable)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # debootstrap and pip at once
            base = pool.submit(sh, ["bash", "deploy/debian-base.sh", BASE_IMAGE], self.log, 900)
            sh(["bash", "deploy/wheelhouse.sh"], self.log, timeout=600, env=wheel_env)
            base.result()
        self.compose("build", "--parallel", "scheduler", "prometheus", timeout=BUILD_TIMEOUT)
        docker("image", "prune", "-f", "--filter", "label=org.opencontainers.image.title=kvledger")

    def up(self) -> None:
        """The stack without Grafana, two CPU workers; returns once compose saw every service
        that others wait on healthy (depends_on: service_healthy)."""
        self.compose("up", "-d", "--no-build", "--scale", f"worker={CPU_WORKERS}", *SERVICES)

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", timeout=300)

    def containers(self, service: str | None = None, every: bool = False) -> list[str]:
        """Container ids of this project (of one service), running or, with `every`, any."""
        label = f"label=com.docker.compose.project={self.project}"
        argv = ["ps", "-q", "--no-trunc", "--filter", label]
        if service:
            argv += ["--filter", f"label=com.docker.compose.service={service}"]
        if every:
            argv.append("-a")
        return docker(*argv).split()

    def inspect(self, container: str) -> dict:
        return json.loads(docker("inspect", container))[0]

    def exec(self, service: str, *argv: str) -> str:
        [container, *_] = self.containers(service)
        return docker("exec", container, *argv)

    def logs(self, service: str) -> str:
        """A service's container output, stdout and stderr (where Python's logging writes)."""
        [container, *_] = self.containers(service)
        proc = subprocess.run(
            ["docker", "logs", container],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
            check=False,
        )
        return proc.stdout

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes still labelled with this project."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "containers": docker("ps", "-aq", "--filter", label).split(),
            "networks": docker("network", "ls", "-q", "--filter", label).split(),
            "volumes": docker("volume", "ls", "-q", "--filter", label).split(),
        }
