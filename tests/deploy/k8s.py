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


if __name__ == "__main__":
    main()
