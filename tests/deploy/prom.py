"""prometheus.yml targets, the dashboard's PromQL, and a real Prometheus server for tests."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import REPO, require

PROMETHEUS_YML = REPO / "deploy" / "prometheus" / "prometheus.yml"
ALERTS_YML = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "kvledger.json"
METRIC = re.compile(r"\b(kvledger_[a-z0-9_]+|up)\b")
# Grafana's macros and the dashboard's variables, as a test evaluates them.
GRAFANA_VARS = {
    "$__rate_interval": "{window}",
    "$__interval": "{window}",
    "$__range": "{window}",
    "$model": ".*",
}


def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load(PROMETHEUS_YML.read_text())


def scrape_targets() -> dict[str, list[tuple[str, int]]]:
    """job -> [(host, port)] from static targets and DNS discovery (names + port)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for job in prometheus_config()["scrape_configs"]:
        found: list[tuple[str, int]] = []
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                found.append((host, int(port)))
        for dns in job.get("dns_sd_configs", []):
            found += [(name, int(dns["port"])) for name in dns["names"]]
        out[job["job_name"]] = found
    return out


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> list[tuple[str, str]]:
    """(panel title / refId, raw PromQL) of every query in the dashboard."""
    return [(f"{p['title']} / {t['refId']}", t["expr"]) for p in panels() for t in p["targets"]]


def promql(expr: str, window: str = "1m") -> str:
    """A dashboard expression with Grafana's variables replaced, as Prometheus receives it."""
    for var in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(var, GRAFANA_VARS[var].format(window=window))
    assert "$" not in expr, f"unknown Grafana variable left in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


@dataclass
class PrometheusServer:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def query(self, expr: str) -> dict[str, Any]:
        """/api/v1/query; returns the whole reply (status, data, warnings) even on 4xx."""
        q = urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as err:
            return json.loads(err.read())

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as reply:
            return json.loads(reply.read())["data"]["activeTargets"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS_YML.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def start_prometheus(
    tmp: Path, jobs: dict[str, list[str]], port: int, interval: str = "1s", timeout: float = 60.0
) -> PrometheusServer:
    """A real Prometheus (Debian's package) on loopback scraping `jobs` {job: [host:port]},
    with the alert rules of deploy/prometheus/alerts.yml loaded."""
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(ALERTS_YML)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": targets}]}
            for job, targets in jobs.items()
        ],
    }
    config_path = tmp / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp / "prometheus.log"
    argv = [
        require("prometheus"),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    server = PrometheusServer(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{log_path.read_text(errors='replace')}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as reply:
                if reply.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"prometheus not ready:\n{log_path.read_text(errors='replace')}")
