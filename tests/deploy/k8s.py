"""deploy/k8s/ as `kubectl kustomize` renders each overlay, and the PrometheusRule that is
generated from deploy/prometheus/alerts.yml.

    python -m tests.deploy.k8s    # rewrites the PrometheusRule after an edit of alerts.yml
"""

from __future__ import annotations

import functools
import shutil
from typing import Any

import pytest
import yaml

from kvledger.flags import DEFAULT_METRICS_PORT, FRONTEND, SCHEDULER, WORKER
from tests.deploy.tools import REPO, run

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "cpu-tls")
# Overlays with the component grpc-tls: mutual TLS on every gRPC link (test_k8s_tls.py).
TLS_OVERLAYS = ("cpu-tls",)
GRPC_TLS = K8S / "components" / "grpc-tls"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUS_RULE = K8S / "components" / "prometheus-operator" / "prometheusrule.yaml"
# Kinds of the Prometheus Operator: custom resources, which kubernetes-validate has no schema of.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
SECRET = "kvledger-secrets"  # the operator creates it (docs/operations.md); never committed
# The oldest Kubernetes minor still common in managed clusters, the one of the kubectl the tests
# render with, and the newest that kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29.0", "1.32.0", "1.37.0")
MODULE_SERVICE = {"server": FRONTEND, "scheduler_svc": SCHEDULER, "worker": WORKER}
SCHEDULER_DEPLOYMENT = "kvledger-scheduler"
FRONTEND_DEPLOYMENT = "kvledger-frontend"


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "`kubectl` is not installed: tests/deploy/test_k8s.py renders deploy/k8s with "
            "`kubectl kustomize` (kubectl 1.27 or newer, which bundles kustomize v5). "
            "Install kubectl; CI's image has it.",
            pytrace=False,
        )
    return path


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """Every object of `kubectl kustomize deploy/k8s/overlays/<overlay>`."""
    proc = run([kubectl(), "kustomize", str(K8S / "overlays" / overlay)])
    assert proc.returncode == 0, f"kubectl kustomize overlays/{overlay} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def objects(overlay: str, kind: str) -> dict[str, dict[str, Any]]:
    """The rendered objects of one kind, by name."""
    return {o["metadata"]["name"]: o for o in render(overlay) if o["kind"] == kind}


def alert_groups() -> list[dict[str, Any]]:
    return yaml.safe_load(ALERTS.read_text())["groups"]


def prometheus_rule() -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "kvledger",
            "labels": {
                "app.kubernetes.io/name": "kvledger",
                "app.kubernetes.io/component": "monitoring",
            },
        },
        "spec": {"groups": alert_groups()},
    }


def prometheus_rule_text() -> str:
    header = (
        "# GENERATED from deploy/prometheus/alerts.yml by `python -m tests.deploy.k8s`: edit the\n"
        "# alerts there (and their unit tests, alerts_test.yml) and run that command again;\n"
        "# tests/deploy/test_k8s.py fails while this file differs. What each alert means and what\n"
        '# to do: docs/operations.md, "Alerts". Like the ServiceMonitor, your Prometheus may\n'
        "# select rules by a label (kube-prometheus-stack: `release: <its Helm release>`).\n"
    )
    body = yaml.safe_dump(prometheus_rule(), sort_keys=False, width=100, allow_unicode=True)
    return header + body


def main() -> None:
    PROMETHEUS_RULE.write_text(prometheus_rule_text())
    print(f"wrote {PROMETHEUS_RULE.relative_to(REPO)}")


# ---- helpers over a rendered Deployment (test_k8s.py, test_k8s_tls.py)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only


def service_of(deployment: dict[str, Any]) -> str:
    command = container(deployment)["command"]
    assert command[:2] == ["python", "-m"] and command[2] in MODULE_SERVICE, command
    return MODULE_SERVICE[command[2]]


def env_entries(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    entries = container(deployment).get("env", [])
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), f"{deployment['metadata']['name']}: duplicate env"
    return {e["name"]: e for e in entries}


def env_values(deployment: dict[str, Any]) -> dict[str, str]:
    """The literal values (secrets and field references left out)."""
    return {n: e["value"] for n, e in env_entries(deployment).items() if "value" in e}


def named_port(deployment: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    ports = {p["name"]: p["containerPort"] for p in container(deployment).get("ports", [])}
    assert port in ports, f"{deployment['metadata']['name']}: no container port {port!r}"
    return ports[port]


def deployments(overlay: str) -> dict[str, dict[str, Any]]:
    return objects(overlay, "Deployment")


def metrics_port(deployment: dict[str, Any]) -> int:
    value = env_values(deployment).get("KVLEDGER_METRICS_PORT")
    if value is None:
        return DEFAULT_METRICS_PORT[service_of(deployment)]
    return int(value)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def services_of(overlay: str, deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        s
        for s in objects(overlay, "Service").values()
        if selects(s["spec"]["selector"], pod_labels(deployment))
    ]


def service_target(deployment: dict[str, Any], svc: dict[str, Any], port_name: str) -> int:
    [port] = [p for p in svc["spec"]["ports"] if p["name"] == port_name]
    return named_port(deployment, port.get("targetPort", port["port"]))


if __name__ == "__main__":
    main()
