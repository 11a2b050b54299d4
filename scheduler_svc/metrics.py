"""Prometheus exposition for the scheduler service (names: docs/design.md, "Contracts")."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvledger.buckets import LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS
from scheduler_svc.core.stats import SchedulerSnapshot

if TYPE_CHECKING:
    from scheduler_svc.live import LiveRequest

# The snapshot's live gauges: they describe a ledger now and die with it. Every other field is
# a monotonic counter, which outlives its ledger (see RetiredLedgers).
GAUGE_FIELDS = frozenset(
    {
        "tracker_entries",
        "blocks_total",
        "blocks_in_use",
        "blocks_cached",
        "usage",
        "num_running",
        "num_waiting",
    }
)
COUNTER_FIELDS = tuple(
    f.name for f in dataclasses.fields(SchedulerSnapshot) if f.name not in GAUGE_FIELDS
)


_NO_GAUGES = {name: 0 for name in GAUGE_FIELDS} | {"usage": 0.0}


def counters_only(snapshot: SchedulerSnapshot) -> SchedulerSnapshot:
    """The snapshot with every gauge at 0."""
    return dataclasses.replace(snapshot, **_NO_GAUGES)


def add_counters(base: SchedulerSnapshot, more: SchedulerSnapshot) -> SchedulerSnapshot:
    """`more` with `base`'s counters added to its own; the gauges stay `more`'s."""
    values = {}
    for name in COUNTER_FIELDS:
        a, b = getattr(base, name), getattr(more, name)
        if isinstance(a, dict):
            merged = dict(a)
            for key, n in b.items():
                merged[key] = merged.get(key, 0) + n
            values[name] = merged
        else:
            values[name] = a + b
    return dataclasses.replace(more, **values)


class LedgerReading(NamedTuple):
    model: str
    worker: str
    snapshot: SchedulerSnapshot
    live: bool  # False: the worker is gone; only its final counters remain


# How long a lost worker's final counters stay exported, and how many lost workers at most.
RETIRED_SERIES_TTL_SECONDS = 3600.0
MAX_RETIRED_LEDGERS = 256


class RetiredLedgers:
    """The counters of ledgers whose worker is gone, per (model, worker).

    A lost worker's ledger is dropped, but what it counted (hits, queries, evictions, its last
    `worker_lost` releases, ...) must stay in the exported sums: a Prometheus counter that goes
    down reads as a reset and makes `rate()` jump. A worker that registers again under the same
    id continues from its old totals. Gauges are not kept: a gone worker holds nothing.

    Workers that come back under new ids (no --worker-id) would grow the exposition without
    bound, so a retired ledger's series go after `ttl` seconds, and beyond `max_kept` the
    oldest go first. Prometheus sees the series end (it goes stale), not a counter reset, and
    has long since scraped its final values.
    """

    def __init__(
        self,
        ttl: float = RETIRED_SERIES_TTL_SECONDS,
        max_kept: int = MAX_RETIRED_LEDGERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._totals: dict[tuple[str, str], SchedulerSnapshot] = {}
        self._retired_at: dict[tuple[str, str], float] = {}
        self.ttl = ttl
        self.max_kept = max_kept
        self._clock = clock

    def retire(self, model: str, worker: str, snapshot: SchedulerSnapshot) -> None:
        key = (model, worker)
        before = self._totals.pop(key, None)
        totals = snapshot if before is None else add_counters(before, snapshot)
        self._totals[key] = counters_only(totals)  # re-inserted: dicts keep retirement order
        self._retired_at[key] = self._clock()

    def _expire(self, live: set[tuple[str, str]]) -> None:
        """Drops expired and surplus retired totals, never those of a worker that is live
        again (they are part of its exported counters)."""
        cutoff = self._clock() - self.ttl
        surplus = len(self._totals) - self.max_kept
        for key in list(self._totals):
            if key in live:
                continue
            if self._retired_at[key] <= cutoff or surplus > 0:
                del self._totals[key], self._retired_at[key]
                surplus -= 1

    def readings(self, live: Iterable[tuple[str, str, SchedulerSnapshot]]) -> list[LedgerReading]:
        """The live ledgers with their retired totals added, then the workers that are gone."""
        live = list(live)
        self._expire({(model, worker) for model, worker, _ in live})
        out, seen = [], set()
        for model, worker, snap in live:
            key = (model, worker)
            seen.add(key)
            retired = self._totals.get(key)
            out.append(
                LedgerReading(
                    model, worker, snap if retired is None else add_counters(retired, snap), True
                )
            )
        for (model, worker), totals in self._totals.items():
            if (model, worker) not in seen:
                out.append(LedgerReading(model, worker, totals, False))
        return out


class RequestMetrics:
    """Per-request latencies and token counts, labelled by model only."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"kvledger_{name}", doc, ["model"], buckets=buckets, registry=registry)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS)
        self.tpot = hist(
            "time_per_output_token_seconds",
            "Time per output token after the first",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to finish", LATENCY_BUCKETS)
        self.queue = hist(
            "request_queue_time_seconds", "Arrival to first scheduled", LATENCY_BUCKETS
        )
        self.finished_total = Counter(
            "kvledger_requests_finished_total",
            "Requests finished, by reason",
            ["model", "reason"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "kvledger_prompt_tokens_total",
            "Prompt tokens of finished requests",
            ["model"],
            registry=registry,
        )
        self.generation_tokens = Counter(
            "kvledger_generation_tokens_total", "Generated tokens", ["model"], registry=registry
        )

    def tokens_generated(self, live: LiveRequest, count: int) -> None:
        if count:
            self.generation_tokens.labels(live.model).inc(count)

    def finished(self, live: LiveRequest, reason: str) -> None:
        now = time.monotonic()
        model = live.model
        self.finished_total.labels(model, reason).inc()
        self.prompt_tokens.labels(model).inc(len(live.core.prompt_token_ids))
        self.e2e.labels(model).observe(now - live.arrival_time)
        if live.first_scheduled_time is not None:
            self.queue.labels(model).observe(live.first_scheduled_time - live.arrival_time)
        if live.first_token_time is not None:
            self.ttft.labels(model).observe(live.first_token_time - live.arrival_time)
            n_out = len(live.core.output_token_ids)
            if n_out > 1:
                self.tpot.labels(model).observe((now - live.first_token_time) / (n_out - 1))


class LinkMetrics:
    """Worker links the scheduler gave up on."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.step_timeouts = Counter(
            "kvledger_worker_step_timeouts_total",
            "Workers dropped because a plan went unanswered past --worker-step-timeout",
            ["model", "worker"],
            registry=registry,
        )
        self.registrations_refused = Counter(
            "kvledger_worker_registrations_refused_total",
            "Worker registrations refused, by reason (unauthenticated: a bad worker token)",
            ["reason"],
            registry=registry,
        )
        self.registrations_refused.labels("unauthenticated")  # exported at 0 from the start
        self.frontend_calls_refused = Counter(
            "kvledger_frontend_calls_refused_total",
            "Calls to the frontend API without a valid --frontend-auth-token",
            registry=registry,
        )


def _by_int(item: tuple[str, int]) -> int:
    return int(item[0])


class LedgerCollector(Collector):
    """Reads every worker's ledger at scrape time, so the numbers are exactly the ledger's.

    A gone worker's counters stay at their final values (its gauges disappear with it)."""

    def __init__(self, readings: Callable[[], Iterable[LedgerReading]]) -> None:
        self._readings = readings  # taken on the engine's loop

    def collect(self):  # noqa: ANN201 - prometheus_client's protocol
        labels = ["model", "worker"]

        def counter(name: str, doc: str, extra: list[str] | None = None) -> CounterMetricFamily:
            return CounterMetricFamily(f"kvledger_{name}", doc, labels=labels + (extra or []))

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"kvledger_{name}", doc, labels=labels)

        fams = {
            "queries": counter("prefix_cache_queries", "Prompt tokens looked up in the cache"),
            "hits": counter("prefix_cache_hits", "Prompt tokens found in the cache"),
            "stale": counter(
                "tracker_stale_entries", "Tracker lookups found stale before use", ["source"]
            ),
            "released": counter("tracker_entries_released", "Tracker lookups released", ["reason"]),
            "orphans": counter(
                "tracker_orphans",
                "Tracker entries without a live request (a bug signal: should stay 0)",
            ),
            "table_orphans": counter(
                "block_table_orphans",
                "Block tables without a live request (a bug signal: should stay 0)",
            ),
            "evictions": counter("kv_block_evictions", "Cached blocks evicted for reuse"),
            "preemptions": counter("num_preemptions", "Requests preempted for recompute"),
            "deferrals": counter(
                "grammar_deferrals",
                "Requests a worker left out of a step because their grammar was still compiling",
            ),
            "drafts": counter(
                "spec_decode_num_drafts", "Speculative decoding: steps a request drafted in"
            ),
            "draft_tokens": counter(
                "spec_decode_num_draft_tokens", "Speculative decoding: tokens drafted"
            ),
            "accepted": counter(
                "spec_decode_num_accepted_tokens",
                "Speculative decoding: drafted tokens the worker kept",
            ),
            "accepted_per_pos": counter(
                "spec_decode_num_accepted_tokens_per_pos",
                "Speculative decoding: drafted tokens kept, by position in the draft",
                ["position"],
            ),
            "entries": gauge("tracker_entries", "Live tracker entries"),
            "total": gauge("kv_blocks_capacity", "KV blocks in the worker's pool (its capacity)"),
            "in_use": gauge("kv_blocks_in_use", "KV blocks referenced by a request"),
            "cached": gauge("kv_blocks_cached", "KV blocks holding a cached hash"),
            "usage": gauge("kv_cache_usage_ratio", "Blocks in use / total"),
            "running": gauge("num_requests_running", "Requests running"),
            "waiting": gauge("num_requests_waiting", "Requests waiting"),
        }
        # Per model, including those whose every worker is gone (0): "a model with no live
        # worker" is an alert, and an absent series cannot fire one.
        workers = GaugeMetricFamily(
            "kvledger_workers_connected", "Workers connected, per model", labels=["model"]
        )
        connected: dict[str, int] = {}
        for model, worker, snap, live in self._readings():
            connected[model] = connected.get(model, 0) + int(live)
            lv = [model, worker]
            fams["queries"].add_metric(lv, snap.prefix_cache_queries)
            fams["hits"].add_metric(lv, snap.prefix_cache_hits)
            for source, n in snap.stale_entries.items():
                fams["stale"].add_metric(lv + [source], n)
            for reason, n in snap.entries_released.items():
                fams["released"].add_metric(lv + [reason], n)
            fams["orphans"].add_metric(lv, snap.orphans)
            fams["table_orphans"].add_metric(lv, snap.table_orphans)
            fams["evictions"].add_metric(lv, snap.evictions)
            fams["preemptions"].add_metric(lv, snap.preemptions)
            fams["deferrals"].add_metric(lv, snap.grammar_deferrals)
            fams["drafts"].add_metric(lv, snap.spec_drafts)
            fams["draft_tokens"].add_metric(lv, snap.spec_draft_tokens)
            fams["accepted"].add_metric(lv, snap.spec_accepted_tokens)
            for position, n in sorted(snap.spec_accepted_per_position.items(), key=_by_int):
                fams["accepted_per_pos"].add_metric(lv + [position], n)
            if not live:
                continue
            fams["entries"].add_metric(lv, snap.tracker_entries)
            fams["total"].add_metric(lv, snap.blocks_total)
            fams["in_use"].add_metric(lv, snap.blocks_in_use)
            fams["cached"].add_metric(lv, snap.blocks_cached)
            fams["usage"].add_metric(lv, snap.usage)
            fams["running"].add_metric(lv, snap.num_running)
            fams["waiting"].add_metric(lv, snap.num_waiting)
        for model, count in sorted(connected.items()):
            workers.add_metric([model], count)
        yield from fams.values()
        yield workers
