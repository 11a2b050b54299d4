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
