"""Queue order: waiting requests, and requests sent back to the queue, are served in the
policy's order (arrival for fcfs, priority then arrival for priority)."""

import pytest

from scheduler_svc.core import ModelResult, Scheduler
from tests.core.harness import Harness, config, has_unfinished, request


def test_waiting_requests_are_served_in_policy_order(kv: bool) -> None:
    for policy, expected in (("fcfs", ["a", "b", "c"]), ("priority", ["c", "a", "b"])):
        h = Harness.build(kv, scheduling_policy=policy, max_num_seqs=1)
        h.add(
            request("a", [1, 2], max_tokens=1, priority=1),
            request("b", [3, 4], max_tokens=1, priority=2),
            request("c", [5, 6], max_tokens=1, priority=0),
        )
        order = []
        while has_unfinished(h.sched):
            order += [n.request_id for n in h.step().new]
        assert order == expected


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("reported", [["r0", "r1", "r2"], ["r2", "r0", "r1"], ["r2", "r1", "r0"]])
def test_requests_the_worker_refuses_return_to_the_queue_in_policy_order(
    policy: str, reported: list[str]
) -> None:
    sched = Scheduler(config(scheduling_policy=policy))
    sched.add_request(request("p", range(8), max_tokens=1))
    sched.update_from_output(sched.schedule(), ModelResult(sampled={"p": 1}))
    for i in range(3):
        sched.add_request(request(f"r{i}", [*range(8), 20 + i], max_tokens=1))
    out = sched.schedule()
    assert all(len(new.claimed) == 2 for new in out.new)
    sched.update_from_output(out, ModelResult(stale_request_ids=reported, removed_block_ids=[1]))
    assert [r.request_id for r in sched.waiting] == ["r0", "r1", "r2"]
    assert sched.stats.stale_entries["worker_report"] == 3
    out = sched.schedule()
    assert sorted(out.dropped_request_ids) == ["r0", "r1", "r2"]
    assert [new.request_id for new in out.new] == ["r0", "r1", "r2"]


def test_a_request_deferred_for_its_grammar_is_requeued_freed_and_run_next(kv: bool) -> None:
    """A worker leaves out of a step a request whose grammar still compiles (it would make the
    others wait): the scheduler frees its blocks (nothing was written), puts it back at the
    front of the queue without calling it a preemption or a stale entry, and plans it again
    next step, where it runs to the end; the ledger is idle afterwards."""
    h = Harness.build(kv)
    h.add(request("other", range(8), max_tokens=3), request("json", range(40, 48), max_tokens=2))
    out = h.step(deferred=["json"])
    assert {n.request_id for n in out.new} == {"other", "json"}
    sched = h.sched
    assert [r.request_id for r in sched.waiting] == ["json"]
    assert [r.request_id for r in sched.running] == ["other"]
    assert sched.stats.grammar_deferrals == 1
    assert sched.stats.preemptions == 0 and sum(sched.stats.stale_entries.values()) == 0
    assert sched.requests["json"].num_preemptions == 0
    if kv:
        held = {b for t in h.worker.tables.values() for b in t}
        assert sched.kv.num_blocks_total - sched.kv.num_free_blocks == len(held)
    out = h.step()
    assert "json" in out.dropped_request_ids and [n.request_id for n in out.new] == ["json"]
    h.run_to_idle()
    assert sched.snapshot().tracker_entries == 0
    assert sched.kv.num_free_blocks == sched.kv.num_blocks_total
    finished = {u.request_id for u in h.updates if u.finish_reason is not None}
    assert finished == {"other", "json"}
