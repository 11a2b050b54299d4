"""Every histogram's bounds come from kvledger/buckets.py, and they are the bounds dashboards
and recorded data already use: a changed bound is a deliberate change, made here too."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from scheduler_svc.metrics import RequestMetrics
from worker.metrics import WorkerMetrics

DOUBLING = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
EXPECTED = {
    "kvledger_time_to_first_token_seconds": (*DOUBLING, 10.24, 20.48, 40.96, 81.92, 163.84),
    "kvledger_e2e_request_latency_seconds": (*DOUBLING, 10.24, 20.48, 40.96, 81.92, 163.84),
    "kvledger_request_queue_time_seconds": (*DOUBLING, 10.24, 20.48, 40.96, 81.92, 163.84),
    "kvledger_time_per_output_token_seconds": (0.001, 0.0025, *DOUBLING),
    "kvledger_worker_step_seconds": (0.001, 0.0025, *DOUBLING, 10.24),
}


def bounds(registry: CollectorRegistry) -> dict[str, tuple[float, ...]]:
    found: dict[str, tuple[float, ...]] = {}
    for family in registry.collect():
        if family.type != "histogram":
            continue
        les = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
        found[family.name] = tuple(float(le) for le in les if le != "+Inf")
    return found


def test_histogram_bounds_of_both_services() -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry)
    for histogram in (metrics.ttft, metrics.tpot, metrics.e2e, metrics.queue):
        histogram.labels("m")  # a labelled histogram shows its buckets once it has a child
    worker = WorkerMetrics("m", "w0")
    worker.step_seconds.labels("m", "w0")
    assert bounds(registry) | bounds(worker.registry) == EXPECTED
