"""Prometheus metrics of one worker process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from kvledger.buckets import STEP_BUCKETS
from protos import worker_pb2


class WorkerMetrics:
    def __init__(self, model: str, worker_id: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model", "worker"]
        self._lv = (model, worker_id)
        self.step_seconds = Histogram(
            "kvledger_worker_step_seconds",
            "One forward step",
            labels,
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.kv_events = Counter(
            "kvledger_worker_kv_events_total",
            "KV events reported to the scheduler",
            labels + ["type"],
            registry=self.registry,
        )
        self.stale_hits = Counter(
            "kvledger_worker_stale_block_hits_total",
            "Claimed cache blocks refused by the provenance check",
            labels,
            registry=self.registry,
        )
        self.waiting = Counter(
            "kvledger_worker_waiting_seconds_total",
            "Time between finishing a step and receiving the next plan while a plan was "
            "expected (the worker idle on the scheduler round trip; async scheduling hides it)",
            labels,
            registry=self.registry,
        )
        self.waiting.labels(*self._lv)
        for kind in ("stored", "removed", "all_cleared"):
            self.kv_events.labels(*self._lv, kind)
        self.stale_hits.labels(*self._lv)

    def waited(self, seconds: float) -> None:
        self.waiting.labels(*self._lv).inc(seconds)

    def observe(self, result: worker_pb2.StepResult, stale_block_hits: int) -> None:
        self.step_seconds.labels(*self._lv).observe(result.step_seconds)
        events = self.kv_events
        events.labels(*self._lv, "stored").inc(len(result.stored))
        events.labels(*self._lv, "removed").inc(len(result.removed_block_ids))
        if result.all_cleared:
            events.labels(*self._lv, "all_cleared").inc()
        if stale_block_hits:
            self.stale_hits.labels(*self._lv).inc(stale_block_hits)
