"""prometheus.yml and the Grafana provisioning, checked offline: promtool on the config and on
every dashboard expression, the panels the operators need, and the metric-name contract."""

from __future__ import annotations

import sys

import pytest
import yaml

from tests.deploy.compose import active_services, resolved
from tests.deploy.prom import (
    DASHBOARD,
    PROMETHEUS_YML,
    dashboard,
    expressions,
    metric_names,
    panels,
    promql,
)
from tests.deploy.tools import REPO, require, run

GRAFANA = REPO / "deploy" / "grafana"

# The metric names of docs/design.md, "Contracts" (CONTRACT), and those it lists as also on the
# dashboard (ALSO_EXPORTED): kv_blocks_cached (the scheduler's "blocks cached" gauge),
# http_requests_total (the frontend's responses), http_request_timeouts_total (slow clients cut
# off), request_resumptions_total (requests that outlived a scheduler restart) and
# worker_step_timeouts_total (workers dropped by --worker-step-timeout), and the speculative
# decoding counters (spec_decode_*).
CONTRACT = {
    f"kvledger_{n}"
    for n in (
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "tracker_entries",
        "tracker_stale_entries_total",
        "tracker_entries_released_total",
        "tracker_orphans_total",
        "kv_blocks_capacity",
        "kv_blocks_in_use",
        "kv_cache_usage_ratio",
        "kv_block_evictions_total",
        "num_requests_running",
        "num_requests_waiting",
        "num_preemptions_total",
        "requests_finished_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "time_to_first_token_seconds",
        "time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "worker_step_seconds",
        "worker_kv_events_total",
        "worker_stale_block_hits_total",
    )
}
ALSO_EXPORTED = {
    "kvledger_kv_blocks_cached",
    "kvledger_http_requests_total",
    "kvledger_http_request_timeouts_total",
    "kvledger_request_resumptions_total",
    "kvledger_worker_step_timeouts_total",
    "kvledger_spec_decode_num_drafts_total",
    "kvledger_spec_decode_num_draft_tokens_total",
    "kvledger_spec_decode_num_accepted_tokens_total",
    "kvledger_spec_decode_num_accepted_tokens_per_pos_total",
}
HISTOGRAMS = {
    "kvledger_time_to_first_token_seconds",
    "kvledger_time_per_output_token_seconds",
    "kvledger_e2e_request_latency_seconds",
    "kvledger_worker_step_seconds",
}


def all_exprs() -> str:
    return "\n".join(expr for _, expr in expressions())


def test_promtool_accepts_prometheus_yml():
    proc = run([require("promtool"), "check", "config", str(PROMETHEUS_YML)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_parses_every_dashboard_expression(tmp_path):
    rules = [
        {"record": f"kvledger_dashboard:expr_{i}", "expr": promql(expr)}
        for i, (_, expr) in enumerate(expressions())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = run([require("promtool"), "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout + proc.stderr


def test_dashboard_json_is_generated_from_dashboard_py():
    proc = run([sys.executable, str(GRAFANA / "dashboard.py"), "--check"])
    assert proc.returncode == 0, proc.stderr


def test_dashboard_uses_only_contract_metric_names():
    used = set()
    for _, expr in expressions():
        used |= {n.removesuffix("_bucket") for n in metric_names(expr)}
    assert used - {"up"} <= CONTRACT | ALSO_EXPORTED, used - CONTRACT - ALSO_EXPORTED - {"up"}
    assert used >= CONTRACT, f"contract metrics with no panel: {CONTRACT - used}"


@pytest.mark.parametrize("metric", sorted(HISTOGRAMS))
def test_latency_panels_show_p50_p90_p99(metric):
    exprs = [e for _, e in expressions() if f"{metric}_bucket" in e]
    for q in ("0.5", "0.9", "0.99"):
        assert any(e.startswith(f"histogram_quantile({q}, ") for e in exprs), (metric, q)


def test_hit_rate_is_hits_over_queries_overall_and_by_worker():
    hits = "rate(kvledger_prefix_cache_hits_total"
    queries = "rate(kvledger_prefix_cache_queries_total"
    ratios = [
        e
        for _, e in expressions()
        if hits in e and queries in e and e.index(hits) < e.index(" / ") < e.index(queries)
    ]
    assert any(e.startswith("sum(") for e in ratios), "overall"
    assert any("by (model, worker)" in e for e in ratios), "per worker"


def test_required_panels_group_by_their_labels():
    text = all_exprs()
    for needle in (
        "by (source) (rate(kvledger_tracker_stale_entries_total",
        "by (reason) (rate(kvledger_tracker_entries_released_total",
        "kvledger_tracker_orphans_total",
        "kvledger_num_requests_running",
        "kvledger_num_requests_waiting",
        "rate(kvledger_prompt_tokens_total",
        "rate(kvledger_generation_tokens_total",
    ):
        assert needle in text, needle


def test_every_panel_is_well_formed():
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and panel["description"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["allValue"] == ".*"


def test_grafana_provisioning_matches_compose():
    services = active_services(None)
    datasource = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    [source] = datasource["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"]
    assert source["url"] == "http://prometheus:9090"
    scrape = yaml.safe_load(PROMETHEUS_YML.read_text())["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/kvledger.yml").read_text())
    [prov] = provider["providers"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in map(str, services["grafana"]["volumes"])}
    assert prov["options"]["path"] in mounts
    assert mounts[prov["options"]["path"]].endswith("deploy/grafana/dashboards")
    assert mounts["/etc/grafana/provisioning"].endswith("deploy/grafana/provisioning")
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{prov['options']['path']}/{DASHBOARD.name}"
    # Grafana reaches Prometheus on a network they share.
    assert set(services["grafana"]["networks"]) & set(services["prometheus"]["networks"])
    prom_mounts = [str(v) for v in services["prometheus"]["volumes"]]
    assert any(v.startswith(str(PROMETHEUS_YML) + ":") for v in prom_mounts), prom_mounts
    assert resolved(None)["services"]["prometheus"]["ports"]
