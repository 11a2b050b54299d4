"""The snapshot: counters and live gauges as the metrics read them, back to zero at idle."""

from tests.core.harness import Harness, request


def test_snapshot_reports_counters_and_live_gauges(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("a", range(10), max_tokens=3), request("b", range(10), max_tokens=3))
    h.step()
    snap = h.sched.snapshot()
    assert (snap.num_running, snap.num_waiting, snap.tracker_entries) == (2, 0, 2)
    if kv:
        # a holds 0, 1, 2; b shares 0, 1 and has its own partial block 3
        assert (snap.blocks_total, snap.blocks_in_use, snap.blocks_cached) == (8, 4, 2)
        assert snap.usage == 0.5
        assert (snap.prefix_cache_queries, snap.prefix_cache_hits) == (20, 8)
    else:
        assert (snap.blocks_total, snap.blocks_in_use, snap.usage) == (0, 0, 0.0)
    assert h.outputs("a") == h.outputs("b") == [1010]  # one token each: 2 generated
    h.run_to_idle()
    snap = h.sched.snapshot()
    assert (snap.num_running, snap.blocks_in_use, snap.tracker_entries) == (0, 0, 0)
    assert h.finish_of("a").finish_reason == h.finish_of("b").finish_reason == "length"
    assert snap.entries_released["finished"] == 2
