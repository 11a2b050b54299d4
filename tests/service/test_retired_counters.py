"""A lost worker's ledger is dropped, but its counters stay in /metrics: Prometheus counters
never go down, and the releases a lost worker's drain counts (`worker_lost`) are seen."""

from __future__ import annotations

from scheduler_svc.core.stats import SchedulerSnapshot
from scheduler_svc.metrics import RetiredLedgers
from tests.service.helpers import (
    GatedRunner,
    Worker,
    expected_tokens,
    generate,
    ledger_idle,
    running_scheduler,
    wait_for,
)
from tests.serving import scrape

LEDGER_COUNTERS = (
    "kvledger_prefix_cache_queries_total",
    "kvledger_prefix_cache_hits_total",
    "kvledger_tracker_stale_entries_total",
    "kvledger_tracker_entries_released_total",
    "kvledger_tracker_orphans_total",
    "kvledger_block_table_orphans_total",
    "kvledger_kv_block_evictions_total",
    "kvledger_num_preemptions_total",
)
LEDGER_GAUGES = ("kvledger_kv_blocks_capacity", "kvledger_tracker_entries")


def of_worker(samples: dict[str, float], worker: str, names: tuple[str, ...]) -> dict[str, float]:
    return {
        key: value
        for key, value in samples.items()
        if key.partition("{")[0] in names and f'worker="{worker}"' in key
    }


def assert_not_lower(before: dict[str, float], after: dict[str, float]) -> None:
    for key, value in before.items():
        assert after.get(key, 0.0) >= value, f"{key} went down: {value} -> {after.get(key)}"


def test_a_lost_workers_counters_stay_exported_and_never_go_down():
    with running_scheduler(metrics=True) as s:
        gate = GatedRunner("r1", at=30)  # holds r1 on w0 until w0 is gone
        w0 = Worker(s.target, "w0", runner=gate)
        wait_for(lambda: len(s.engine.links) == 1)
        shared = list(range(1, 13))
        for rid in ("a", "b"):  # the second one hits the first one's blocks
            assert [t for r in generate(s.target, rid, shared, 2) for t in r.token_ids] == (
                expected_tokens(12, 2)
            )
        stream = generate(s.target, "r1", list(range(100, 119)), 40)
        got = list(next(stream).token_ids)
        assert gate.reached.wait(10)
        before = of_worker(scrape(s.url), "w0", LEDGER_COUNTERS)
        assert before[next(k for k in before if "prefix_cache_hits" in k)] > 0

        w1 = Worker(s.target, "w1")
        try:
            wait_for(lambda: len(s.engine.links) == 2)
            w0.client.stop()  # r1 moves to w1; w0's ledger is drained and dropped
            gate.release.set()
            w0.thread.join(5)
            for response in stream:
                got += response.token_ids
            assert got == expected_tokens(19, 40)
            wait_for(lambda: ledger_idle(s))

            samples = scrape(s.url)
            after = of_worker(samples, "w0", LEDGER_COUNTERS)
            assert_not_lower(before, after)
            lost = (
                "kvledger_tracker_entries_released_total"
                '{model="m",reason="worker_lost",worker="w0"}'
            )
            assert after[lost] == 1, "the drain's release of r1 is exported"
            assert not of_worker(samples, "w0", LEDGER_GAUGES), "a gone worker has no gauges"

            # The same worker id registers again: its counters go on from their totals.
            w0 = Worker(s.target, "w0")
            wait_for(lambda: len(s.engine.links) == 2)
            again = of_worker(scrape(s.url), "w0", LEDGER_COUNTERS)
            assert_not_lower(after, again)
            assert of_worker(scrape(s.url), "w0", LEDGER_GAUGES), "live again: gauges are back"
        finally:
            gate.release.set()
            w0.stop()
            w1.stop()


def _snapshot(queries: int) -> SchedulerSnapshot:
    return SchedulerSnapshot(
        prefix_cache_queries=queries,
        prefix_cache_hits=0,
        stale_entries={},
        entries_released={},
        orphans=0,
        table_orphans=0,
        evictions=0,
        preemptions=0,
        tracker_entries=0,
        blocks_total=8,
        blocks_in_use=0,
        blocks_cached=0,
        usage=0.0,
        num_running=0,
        num_waiting=0,
    )


def test_retired_series_do_not_grow_without_bound():
    """300 workers that came and went under new ids leave at most max_kept series, and a
    retired series goes after its ttl; one that comes back in time keeps its totals."""
    now = [0.0]
    retired = RetiredLedgers(ttl=600, max_kept=50, clock=lambda: now[0])
    for i in range(300):
        now[0] += 1
        retired.retire("m", f"w{i}", _snapshot(1))
    readings = retired.readings([])
    assert len(readings) == 50
    assert {r.worker for r in readings} == {f"w{i}" for i in range(250, 300)}
    retired.retire("m", "back", _snapshot(5))
    now[0] += 599
    back_live = [("m", "back", _snapshot(2))]
    for _ in range(2):  # live again: its old totals stay, however long it lives
        [back] = [r for r in retired.readings(back_live) if r.worker == "back"]
        assert back.snapshot.prefix_cache_queries == 7 and back.live
        now[0] += 700
    retired.retire("m", "back", _snapshot(2))
    now[0] += 599
    assert [(r.worker, r.snapshot.prefix_cache_queries) for r in retired.readings([])] == [
        ("back", 7)
    ]
    now[0] += 2
    assert retired.readings([]) == []
