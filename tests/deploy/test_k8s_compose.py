"""deploy/k8s/ against docker-compose.yml and the flags' defaults: each Deployment has the
environment of its compose twin but for the differences named below, restates no default, and
opens the same metrics ports."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from kvledger.flags import DEFAULT_METRICS_PORT, SCHEDULER, WORKER
from tests.deploy.defaults import restated_defaults
from tests.deploy.k8s import (
    FRONTEND_DEPLOYMENT,
    OVERLAYS,
    SCHEDULER_DEPLOYMENT,
    TLS_OVERLAYS,
    container,
    deployments,
    env_entries,
    env_values,
    metrics_port,
    service_of,
)
from tests.deploy.tools import REPO

# Each Deployment's twin in docker-compose.yml, per overlay.
COMPOSE_TWIN = {
    "cpu": {
        SCHEDULER_DEPLOYMENT: "scheduler",
        "kvledger-worker": "worker",
        "kvledger-embedding-worker": "embedding-worker",
        FRONTEND_DEPLOYMENT: "frontend",
    },
    "gpu": {
        SCHEDULER_DEPLOYMENT: "scheduler",
        "kvledger-worker": "worker-gpu",
        "kvledger-embedding-worker": "embedding-worker",
        FRONTEND_DEPLOYMENT: "frontend",
    },
}
COMPOSE_TWIN["cpu-tls"] = COMPOSE_TWIN["cpu"]
# Where Kubernetes differs from compose on purpose: JSON logs for the cluster's log stack
# (added); the API key is required (a Secret; optional in compose); the scheduler's address is
# its Service, a worker's id its pod's name (compose's CPU worker sets none: each replica of
# `--scale` names itself), and every worker pod has its own IP, so the CUDA worker keeps the
# workers' metrics port (compose gives it 9403 beside the others on one host).
K8S_ONLY_ENV = {"KVLEDGER_LOG_FORMAT"}
# compose passes the operator's shell's log level through; a cluster sets it in the manifest.
COMPOSE_ONLY_ENV = {"KVLEDGER_LOG_LEVEL"}
DIFFERENT_VALUE = {
    "KVLEDGER_SCHEDULER",
    "KVLEDGER_WORKER_ID",
    "KVLEDGER_METRICS_PORT",
    "KVLEDGER_API_KEY",
    "KVLEDGER_RESPONSES_STORE",  # compose's one frontend stores; k8s replicas cannot share it
}
# The component grpc-tls adds these (compose stays plaintext); only in its overlays.
TLS_ENV = {"KVLEDGER_GRPC_TLS_CERT", "KVLEDGER_GRPC_TLS_KEY", "KVLEDGER_GRPC_TLS_CA"}
COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


def compose_services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def compose_env(name: str) -> dict[str, str]:
    """A compose service's environment with `${VAR:-default}` read as its default; a required
    `${VAR:?...}` (the secrets) as None."""
    out = {}
    for key, raw in compose_services()[name]["environment"].items():
        match = COMPOSE_VAR.fullmatch(str(raw))
        if match is not None and match.group(2) == "?":
            out[key] = None
        else:
            out[key] = COMPOSE_VAR.sub(lambda m: m.group(3) or "", str(raw))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_same_shape_as_docker_compose(overlay):
    for name, twin in COMPOSE_TWIN[overlay].items():
        dep = deployments(overlay)[name]
        ours = {k for k in env_entries(dep) if k.startswith("KVLEDGER_")}
        theirs = compose_env(twin)
        k8s_only = K8S_ONLY_ENV | (TLS_ENV if overlay in TLS_OVERLAYS else set())
        k8s_only |= {"KVLEDGER_WORKER_ID"} - set(theirs)
        assert compose_services()[twin]["command"] == container(dep)["command"], name
        assert set(theirs) - COMPOSE_ONLY_ENV == ours - k8s_only, f"{name} vs {twin}"
        values = env_values(dep)
        for key, value in theirs.items():
            if value is None:  # required in compose: a secret
                assert key not in values, f"{name}: {key} comes from the Secret"
            elif key not in DIFFERENT_VALUE and key in values:
                assert values[key] == value, f"{name}: {key} differs from compose {twin}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_variable_restates_its_flags_default(overlay):
    """Set only what differs from the default (tests/deploy/defaults.py says why)."""
    for name, dep in deployments(overlay).items():
        restated = restated_defaults(service_of(dep), env_values(dep))
        assert restated == [], f"{name} restates the default of {restated}"


def test_metrics_ports_match_compose_and_the_defaults():
    deps = deployments("cpu")
    assert metrics_port(deps[SCHEDULER_DEPLOYMENT]) == DEFAULT_METRICS_PORT[SCHEDULER]
    assert metrics_port(deps["kvledger-worker"]) == DEFAULT_METRICS_PORT[WORKER]
    for name, twin in COMPOSE_TWIN["cpu"].items():
        assert str(metrics_port(deps[name])) == compose_env(twin)["KVLEDGER_METRICS_PORT"]
