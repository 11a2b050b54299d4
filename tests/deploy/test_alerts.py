"""deploy/prometheus/alerts.yml: promtool accepts it, its unit tests (alerts_test.yml) pass, and
prometheus.yml and the compose file load it. tests/deploy/test_live_metrics.py checks that a
real Prometheus loads the rules and that every metric they read is exported."""

from __future__ import annotations

from tests.deploy.compose import resolved
from tests.deploy.prom import ALERTS_YML, alert_rules, metric_names, prometheus_config
from tests.deploy.tools import require, run

# What operators are paged on, each by the alert that does it.
EXPECTED = {
    "KvledgerLedgerOrphans",
    "KvledgerWorkerStaleBlockRefusals",
    "KvledgerWorkerStepTimeouts",
    "KvledgerModelWithoutWorker",
    "KvledgerQueueNearlyFull",
    "KvledgerKvCacheThrashing",
    "KvledgerSlowTimeToFirstToken",
}


def test_promtool_accepts_the_rules():
    proc = run([require("promtool"), "check", "rules", str(ALERTS_YML)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alert_unit_tests_pass():
    """Each alert fires on the series that should page, and stays silent on those that
    should not (a flat bug counter, a full cache without preemptions, a model with a worker)."""
    proc = run([require("promtool"), "test", "rules", "alerts_test.yml"], cwd=ALERTS_YML.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = (ALERTS_YML.parent / "alerts_test.yml").read_text()
    for name in EXPECTED:
        assert f"alertname: {name}" in tested, f"{name} has no unit test"


def test_every_expected_alert_exists_with_severity_and_summary():
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert set(rules) == EXPECTED
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
        assert metric_names(rule["expr"]), name


def test_prometheus_and_compose_load_the_rules():
    assert prometheus_config()["rule_files"] == ["alerts.yml"]
    volumes = resolved()["services"]["prometheus"]["volumes"]
    targets = [v["target"] if isinstance(v, dict) else v.split(":")[1] for v in volumes]
    assert "/etc/prometheus/alerts.yml" in targets
