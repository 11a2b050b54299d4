"""Prometheus metrics of one worker process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from protos import worker_pb2

STEP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
)


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
