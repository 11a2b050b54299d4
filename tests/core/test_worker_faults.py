"""Worker faults: errors, missing tokens, refused claims, stale lookups and a restart in place
finish or recompute exactly the requests they touch, and uncache what was not written."""

import pytest

from scheduler_svc.core import ModelResult, RequestStatus, SchedulerOutput
from tests.core.harness import Harness, request


def test_worker_errors_finish_the_request_and_uncache_what_it_did_not_write(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("bad", range(9), max_tokens=3), request("ok", range(20, 29), max_tokens=3))
    h.plan()
    if kv:
        assert h.cached() == [0, 1, 3, 4]
    updates = h.finish_step(errored={"bad": "CUDA fell over"})
    assert [(u.request_id, u.finish_reason, u.finish_message) for u in updates][0] == (
        "bad",
        "error",
        "CUDA fell over",
    )
    if kv:
        # bad's blocks were declared written but never were: their hashes must go
        assert h.cached() == [3, 4]
        assert h.removal_sources([0, 1]) == ["worker_report"] * 2
    assert [u.request_id for u in h.updates if u.finish_reason == "error"] == ["bad"]
    assert h.sched.stats.entries_released["error"] == 1
    assert "bad" in h.plan().dropped_request_ids
    h.finish_step()
    h.run_to_idle()
    assert h.outputs("ok") == [1009, 1010, 1011]


def test_a_worker_that_omits_a_token_fails_that_request_instead_of_hanging(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("r", range(5), max_tokens=3), request("s", range(10, 15), max_tokens=1))
    h.plan()
    h.finish_step(withhold=["r"])
    assert h.finish_of("r").finish_reason == "error"
    assert "no token" in h.finish_of("r").finish_message
    h.run_to_idle()


def test_a_claim_the_worker_refuses_is_recomputed_and_counted(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("p", range(8), max_tokens=1))
    h.step()
    if kv:
        h.worker.declared[1] = b"x" * 32  # the worker's record of block 1 disagrees
    r = request("r", list(range(8)) + [9], max_tokens=2)
    h.add(r)
    out = h.step()
    if kv:
        assert [b for b, _ in out.new[0].claimed] == [0, 1]
        assert r.status is RequestStatus.PREEMPTED and r.num_computed_tokens == 0
        assert h.sched.stats.stale_entries["worker_report"] == 1
        assert h.cached() == [0]  # the refused block was reported removed
        out = h.step()  # the worker drops its copy of r, then gets r afresh
        assert out.dropped_request_ids == ["r"] and [n.request_id for n in out.new] == ["r"]
        (new,) = out.new
        assert [b for b, _ in new.claimed] == [0] and new.num_computed_tokens == 4
    h.run_to_idle()
    assert h.outputs("r") == [1009, 1010]


@pytest.mark.parametrize("source", ["worker_report", "cache_reset", "eviction"])
def test_a_lookup_from_arrival_found_stale_is_recomputed_and_counted_by_source(
    kv: bool, source: str
) -> None:
    h = Harness.build(kv, num_blocks=6)
    h.add(request("p", range(8), max_tokens=1))
    h.step()  # blocks 0 and 1 cache p's prompt; the queue is 2, 3, 4, 5, 1, 0
    late = request("late", list(range(8)) + [50], max_tokens=1)
    if source == "eviction":
        # an earlier arrival is admitted first, in the same step; its fifth block evicts 1
        h.add(request("big", range(100, 120), max_tokens=1))
    h.add(late)
    if kv:
        assert [b.block_id for b in h.sched.tracker.peek_lookup("late").blocks] == [0, 1]
    if source == "worker_report":
        # the worker drops block 1 between steps (a result with no plan in flight)
        h.worker.truth.pop(1, None)
        nothing = SchedulerOutput(0, [], [], [], [], 0)
        assert h.sched.update_from_output(nothing, ModelResult(removed_block_ids=[1])) == []
    if source == "cache_reset":
        assert h.sched.reset_prefix_cache() is True
    out = h.plan()
    late_new = [n for n in out.new if n.request_id == "late"]
    if kv:
        assert h.sched.stats.stale_entries == {
            s: int(s == source) for s in h.sched.stats.stale_entries
        }
        if source == "eviction":
            assert late_new == [] and h.sched.stats.entries_released["no_blocks"] == 1
        else:
            assert late_new[0].num_computed_tokens == (4 if source == "worker_report" else 0)
    h.finish_step()
    h.run_to_idle()
    assert h.outputs("late") == [1009]


def test_a_worker_that_restarts_in_place_loses_its_running_requests_and_its_cache(
    kv: bool,
) -> None:
    h = Harness.build(kv, max_num_seqs=2)
    a, b = request("a", range(8), max_tokens=3), request("b", range(20, 26), max_tokens=3)
    waiter = request("w", [*range(8), 50], max_tokens=2)
    h.add(a, b)
    h.step()
    out = h.plan()
    h.add(waiter)  # arrives while the step runs; its lookup from arrival covers a's prompt
    if kv:
        assert [blk.block_id for blk in h.sched.tracker.peek_lookup("w").blocks] == [0, 1]
    was_cached = h.cached() if kv else []
    h.worker.restart()  # the worker lost its memory: it runs nothing and says so
    assert h.sched.update_from_output(out, ModelResult(all_cleared=True)) == []
    assert [r.request_id for r in h.sched.waiting] == ["a", "b", "w"]
    assert a.status is b.status is RequestStatus.PREEMPTED
    assert a.num_computed_tokens == b.num_computed_tokens == 0 and a.output_token_ids == [1008]
    assert h.sched.kv.num_tables == 0 and h.sched.snapshot().blocks_in_use == 0
    assert h.sched.stats.entries_released["worker_lost"] == 2
    if kv:
        assert h.cached() == [] and len(was_cached) == 3
        assert h.removal_sources(was_cached) == ["worker_lost"] * 3
    assert h.sched.abort_request("b")  # frees a slot, so w's lookup is read in the next plan
    out = h.plan()
    assert sorted(out.dropped_request_ids) == ["a", "b"]
    assert [n.request_id for n in out.new] == ["a", "w"] and out.new[0].claimed == []
    # w's lookup named blocks that lost their hash with the worker's memory: stale, recounted
    assert h.sched.stats.stale_entries == {
        "eviction": 0,
        "worker_report": 0,
        "worker_lost": 1 if kv else 0,
        "cache_reset": 0,
    }
    h.finish_step()
    h.run_to_idle()
    assert h.outputs("a") == [1008, 1009, 1010] and h.outputs("w") == [1009, 1010]
