"""Live: `kvledger serve` (real processes), traffic through the HTTP API, a real Prometheus
scraping the targets of deploy/prometheus/prometheus.yml mapped to this stack's loopback ports,
and every dashboard query evaluated through Prometheus's HTTP API."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest

from tests.deploy.live import (
    SHARED_PROMPT,
    abandon_stream,
    complete,
    metric_names,
    scalar,
    wait_for,
)
from tests.deploy.prom import alert_rules, expressions, promql, scrape_targets, start_prometheus
from tests.deploy.prom import metric_names as names_in
from tests.deploy.tools import require, run
from tests.serving import free_port, metric_sum, scrape, start_serve

WINDOW = "1m"  # $__rate_interval as the test evaluates it: covers the whole run


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # speculative decoding on, so that its counters (on the dashboard) are exported too
    spec = '{"method": "ngram", "num_speculative_tokens": 4}'
    served = start_serve(
        tmp_path_factory.mktemp("serve"), "--num-kv-blocks", "64", "--speculative-config", spec
    )
    yield served
    served.stop()


def local_targets(stack) -> dict[tuple[str, int], str]:
    """prometheus.yml target -> this stack's loopback address (`kvledger serve` runs one worker
    of --model: the compose file's `worker`; the embedding and GPU workers are not started)."""
    return {
        # compose's frontend metrics port; `kvledger serve`'s frontend serves them on its
        # HTTP port, open here since this stack has no API key
        ("frontend", 9404): f"127.0.0.1:{stack.port}",
        ("scheduler", 9400): f"127.0.0.1:{stack.metrics_port}",
        ("worker", 9401): f"127.0.0.1:{stack.metrics_port + 1}",
    }


@pytest.fixture(scope="module")
def jobs(stack) -> dict[str, list[str]]:
    mapped = local_targets(stack)
    out: dict[str, list[str]] = {}
    for job, targets in scrape_targets().items():
        local = [mapped[t] for t in targets if t in mapped]
        if local:
            out[job] = local
    assert sum(map(len, out.values())) == len(mapped), "prometheus.yml lost a target"
    return out


@pytest.fixture(scope="module")
def prometheus(stack, jobs, tmp_path_factory):
    server = start_prometheus(tmp_path_factory.mktemp("prometheus"), jobs, free_port())
    try:
        wait_for(
            lambda: (
                len([t for t in server.targets() if t["health"] == "up"])
                == sum(map(len, jobs.values()))
            ),
            "every target up",
        )
        yield server
    finally:
        server.stop()


def _seen_by_prometheus(prometheus, stack) -> None:
    """Waits until Prometheus has scraped the scheduler's current generation-token count."""
    now = metric_sum(scrape(stack.scheduler_metrics_url), "kvledger_generation_tokens_total")
    wait_for(
        lambda: scalar(prometheus, "sum(kvledger_generation_tokens_total)") == now,
        "a scrape after the traffic",
    )


@pytest.fixture(scope="module")
def traffic(stack, prometheus):
    """Two rounds, each after a scrape, so every counter and histogram has a rate."""
    first = complete(stack.url, SHARED_PROMPT)
    again = complete(stack.url, SHARED_PROMPT)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    _seen_by_prometheus(prometheus, stack)
    complete(stack.url, SHARED_PROMPT + " And once more.", max_tokens=8)
    complete(stack.url, "A prompt of its own, sharing nothing with the others.")
    _seen_by_prometheus(prometheus, stack)
    return prometheus


def test_every_dashboard_metric_exists_in_a_live_scrape(stack, jobs, traffic):
    live: set[str] = set()
    for targets in jobs.values():
        for target in targets:
            live |= metric_names(f"http://{target}/metrics")
    used = set().union(*(names_in(expr) for _, expr in expressions())) - {"up"}
    assert used <= live, f"used by the dashboard, absent from every scrape: {used - live}"
    in_prometheus = traffic.query('group by (__name__) ({__name__=~"kvledger_.+"})')
    stored = {s["metric"]["__name__"] for s in in_prometheus["data"]["result"]}
    assert used <= stored, used - stored


def test_every_alert_loads_and_reads_exported_metrics(stack, jobs, traffic):
    """The alert rules load into a real Prometheus (every rule healthy once evaluated), none
    fires on a healthy stack, and every metric they read exists in a live scrape."""
    live: set[str] = set()
    for targets in jobs.values():
        for target in targets:
            live |= metric_names(f"http://{target}/metrics")
    for rule in alert_rules():
        wanted = {m.removesuffix("_bucket") for m in names_in(rule["expr"])}
        exported = {m.removesuffix("_bucket") for m in live}
        assert wanted <= exported, (rule["alert"], wanted - exported)

    def rules() -> list[dict]:
        with urllib.request.urlopen(f"{traffic.url}/api/v1/rules", timeout=5) as reply:
            groups = json.load(reply)["data"]["groups"]
        return [r for g in groups for r in g["rules"]]

    wait_for(
        lambda: len(rules()) == len(alert_rules()) and all(r["health"] == "ok" for r in rules()),
        "every alert rule evaluated",
    )
    firing = [r["name"] for r in rules() if r["state"] != "inactive"]
    assert not firing, firing
    assert scalar(traffic, 'sum(kvledger_workers_connected{model="tiny-llama"})') == 1


def test_every_exposition_passes_promtool_check_metrics(jobs, traffic):
    """`promtool check metrics` lints each service's exposition: naming (a gauge must not
    carry a counter's `_total`), base units, help text."""
    promtool = require("promtool")
    problems = []
    for targets in jobs.values():
        for target in targets:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as reply:
                text = reply.read().decode()
            checked = run([promtool, "check", "metrics"], input=text)
            if checked.returncode != 0:
                problems.append(f"{target}: {checked.stdout}{checked.stderr}")
    assert not problems, "\n".join(problems)


def test_every_panel_query_evaluates_through_prometheus(traffic):
    failures = []
    for where, expr in expressions():
        reply = traffic.query(promql(expr, WINDOW))
        if reply.get("status") != "success" or reply.get("warnings"):
            failures.append(f"{where}: {reply}")
        elif not reply["data"]["result"]:
            failures.append(f"{where}: no series for {promql(expr, WINDOW)}")
    assert not failures, "\n".join(failures)


def _panel_expr(title: str, ref: str = "A") -> str:
    [expr] = [e for where, e in expressions() if where == f"{title} / {ref}"]
    return promql(expr, WINDOW)


def test_hit_rate_panels_show_the_shared_prefix(traffic):
    overall = scalar(traffic, _panel_expr("Prefix cache hit rate"))
    assert overall is not None and 0 < overall <= 1
    reply = traffic.query(_panel_expr("Prefix cache hit rate by worker"))
    [series] = reply["data"]["result"]
    assert series["metric"]["model"] == "tiny-llama" and series["metric"]["worker"]
    assert 0 < float(series["value"][1]) <= 1


def test_latency_panels_give_finite_quantiles(traffic):
    for title in ("Time to first token", "End-to-end request latency", "Worker step time"):
        for ref in "ABC":
            reply = traffic.query(_panel_expr(title, ref))
            values = [float(s["value"][1]) for s in reply["data"]["result"]]
            assert values and all(math.isfinite(v) and v > 0 for v in values), (title, ref)


def test_bug_signals_stay_zero(traffic):
    assert scalar(traffic, _panel_expr("Tracker orphans since scheduler start")) == 0
    assert scalar(traffic, _panel_expr("Worker stale-block refusals since start")) == 0


def test_client_abort_is_a_release_with_reason_aborted(stack, traffic):
    def aborted() -> float:
        return metric_sum(
            scrape(stack.scheduler_metrics_url),
            "kvledger_tracker_entries_released_total",
            reason="aborted",
        )

    before = aborted()
    abandon_stream("127.0.0.1", stack.port, SHARED_PROMPT)
    wait_for(lambda: aborted() > before, "an `aborted` release after a client hang-up", 30)
    wait_for(
        lambda: (
            metric_sum(scrape(stack.scheduler_metrics_url), "kvledger_num_requests_running") == 0
        ),
        "idle",
        30,
    )
    samples = scrape(stack.scheduler_metrics_url)
    assert metric_sum(samples, "kvledger_tracker_orphans_total") == 0
    assert metric_sum(samples, "kvledger_tracker_entries") == 0
