"""deploy/k8s/'s Prometheus Operator objects: the ServiceMonitor scrapes every service's metrics
port, and the PrometheusRule is generated from, and carries exactly, deploy/prometheus/'s alert
rules."""

from __future__ import annotations

import re

import pytest

from tests.deploy.k8s import (
    OVERLAYS,
    PROMETHEUS_RULE,
    alert_groups,
    deployments,
    metrics_port,
    objects,
    prometheus_rule,
    prometheus_rule_text,
    selects,
    service_target,
    services_of,
)
from tests.deploy.tools import REPO

# ---- the Prometheus Operator's objects (custom resources: no schema to validate against)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_every_services_metrics_port(overlay):
    [sm] = objects(overlay, "ServiceMonitor").values()
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    selector = sm["spec"]["selector"]["matchLabels"]
    [endpoint] = sm["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"])
    selected = {
        n: s
        for n, s in objects(overlay, "Service").items()
        if selects(selector, s["metadata"]["labels"])
    }
    for name, dep in deployments(overlay).items():
        [svc] = services_of(overlay, dep)
        assert svc["metadata"]["name"] in selected, f"{name} is not scraped"
        assert service_target(dep, svc, endpoint["port"]) == metrics_port(dep), name


def test_prometheus_rule_is_generated_from_the_alert_rules():
    assert PROMETHEUS_RULE.read_text() == prometheus_rule_text(), (
        f"{PROMETHEUS_RULE.relative_to(REPO)} is stale: run `python -m tests.deploy.k8s`"
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_rule_carries_exactly_the_alert_rules(overlay):
    [rule] = objects(overlay, "PrometheusRule").values()
    expected = prometheus_rule()
    assert (rule["apiVersion"], rule["kind"]) == (expected["apiVersion"], expected["kind"])
    assert set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"] == alert_groups()
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        for r in group["rules"]:
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
            assert r["alert"] and r["expr"] and r["labels"]["severity"], r
