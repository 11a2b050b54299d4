"""Preemption by recompute: who is chosen, what is released, and that it always ends."""

from scheduler_svc.core import RequestStatus
from tests.core.harness import Harness, request


def test_self_preemption_requeues_at_the_front_and_never_livelocks(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=4)  # 16 token slots, two requests of two blocks each
    a = request("a", range(6), max_tokens=6)
    b = request("b", range(10, 18), max_tokens=6)
    h.add(a, b)
    h.step()
    out = h.step()  # b's 9th position needs a third block: b is the latest, so b goes
    if kv:
        # the plan that preempts b already tells the worker to forget it
        assert [c.request_id for c in out.cont] == ["a"] and out.dropped_request_ids == ["b"]
        assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
        assert b.num_preemptions == 1 and h.sched.stats.preemptions == 1
        assert [r.request_id for r in h.sched.waiting] == ["b"]
        assert h.table("a") == [0, 1] and h.refs() == [1, 1, 0, 0]
        assert h.free_queue() == [3, 2]  # b freed tail first; both its blocks stay cached
        assert h.sched.stats.entries_released["preempted"] == 1
    h.run_to_idle(max_steps=60)
    assert h.outputs("a") == [1006 + i for i in range(6)]
    assert h.outputs("b") == [1008 + i for i in range(6)]  # recompute yields the same tokens
    assert h.finish_of("a").finish_reason == h.finish_of("b").finish_reason == "length"


def test_fcfs_preempts_the_latest_arrival(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=6)
    reqs = [
        request(rid, range(i * 20, i * 20 + 8), max_tokens=3)
        for i, rid in enumerate(["x", "y", "z"])
    ]
    h.add(*reqs)
    h.step()
    out = h.step()  # x needs a block first: z (latest) goes, then x and y fit
    if kv:
        assert [c.request_id for c in out.cont] == ["x", "y"]
        assert reqs[2].status is RequestStatus.PREEMPTED
        assert h.table("x") == [0, 1, 5] and h.table("y") == [2, 3, 4]
    h.run_to_idle()
    for r in reqs:
        assert h.outputs(r.request_id) == [1008, 1009, 1010]


def test_priority_preempts_the_lowest_priority_even_if_it_arrived_first(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=6, scheduling_policy="priority")
    low = request("low", range(0, 8), max_tokens=3, priority=9)
    mid = request("mid", range(20, 28), max_tokens=3, priority=1)
    high = request("high", range(40, 48), max_tokens=3, priority=0)
    h.add(low, mid, high)
    out = h.step()
    assert [n.request_id for n in out.new] == ["high", "mid", "low"]
    out = h.step()
    if kv:
        assert [c.request_id for c in out.cont] == ["high", "mid"]
        assert low.status is RequestStatus.PREEMPTED
    h.run_to_idle()
    assert h.outputs("low") == [1008, 1009, 1010]


def test_a_request_that_outgrows_the_whole_pool_finishes_with_length(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=3)  # 12 token slots
    r = request("r", range(10), max_tokens=50)
    h.add(r)
    h.run_to_idle(max_steps=60)
    end = h.finish_of("r")
    if kv:
        assert end.finish_reason == "length" and len(h.outputs("r")) == 2  # 12 tokens in all
        assert h.sched.stats.preemptions == 0
    else:
        assert end.finish_reason == "length" and len(h.outputs("r")) == 50
