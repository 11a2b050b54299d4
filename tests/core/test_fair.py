"""The fair policy (core/fair.py): tenants take turns, each keeps its own arrival order, a
burst cannot hold another tenant's request behind it, and the ledger rules still hold."""

from __future__ import annotations

from collections import Counter

import pytest

from scheduler_svc.core import Request, RequestStatus
from scheduler_svc.core.fair import FairQueue, fair_order, seat_for
from scheduler_svc.core.waiting_queue import FCFSQueue
from tests.core.harness import Harness, has_unfinished, request


def arrived(rid: str, tenant: str, index: int) -> Request:
    r = request(rid, [1, 2, 3], tenant=tenant)
    r.arrival_index = index
    return r


def ids(requests: list[Request]) -> list[str]:
    return [r.request_id for r in requests]


def admissions(h: Harness) -> list[str]:
    """Every admission, in order, until the ledger is idle."""
    order = []
    while has_unfinished(h.sched):
        order += [n.request_id for n in h.step().new]
    return order


# -- the rule, on its own -----------------------------------------------------------------


def test_running_order_interleaves_tenants_and_ends_with_the_busiest_tenants_latest() -> None:
    a0, a1, a2, b0, c0, b1 = (
        arrived(rid, rid[0], i) for i, rid in enumerate(["a0", "a1", "a2", "b0", "c0", "b1"])
    )
    assert ids(fair_order([b1, a2, c0, a0, b0, a1])) == ["a0", "b0", "c0", "a1", "b1", "a2"]
    load = Counter(a=3, b=2, c=1)
    # the back is where preemption takes from: a's latest, never c's only request
    assert seat_for(arrived("d0", "d", 9), fair_order([a0, a1, a2, b0, b1, c0]), load) is a2
    # a tenant holding one more than the head's gives nothing: that would only swap who is short
    assert seat_for(arrived("c1", "c", 9), [a0, b0, c0, a1, b1], Counter(a=2, b=2, c=1)) is None


def test_the_queue_serves_the_least_loaded_tenant_then_round_robin() -> None:
    load: Counter[str] = Counter(a=2)
    queue = FairQueue(load)
    for i, rid in enumerate(["a2", "a3", "a4", "b0", "b1", "c0"]):
        queue.push(arrived(rid, rid[0], i))
    # iteration is the order of successive admissions, each raising its tenant's load
    expected = ["b0", "c0", "b1", "a2", "a3", "a4"]
    assert ids(list(queue)) == expected
    served = []
    while queue:
        r = queue.pop()
        load[r.tenant] += 1
        served.append(r.request_id)
    assert served == expected and len(queue) == 0


def test_a_preempted_request_goes_back_ahead_of_its_own_tenant_only() -> None:
    queue = FairQueue(Counter())
    a1, b0, a0 = arrived("a1", "a", 1), arrived("b0", "b", 2), arrived("a0", "a", 0)
    queue.push(a1)
    queue.push(b0)
    queue.push_front(a0)
    assert ids(list(queue)) == ["a0", "b0", "a1"]
    queue.remove(b0)
    assert ids(list(queue)) == ["a0", "a1"] and len(queue) == 2


# -- the rule, in the scheduler -----------------------------------------------------------


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_a_burst_does_not_hold_another_tenants_request_beyond_one_round(
    kv: bool, policy: str
) -> None:
    h = Harness.build(kv, scheduling_policy=policy, max_num_seqs=1)
    h.add(
        *[request(f"a{i}", range(10 * i, 10 * i + 4), max_tokens=2, tenant="A") for i in range(5)]
    )
    h.step()  # a0 holds the only seat
    h.add(request("b", [90, 91, 92, 93], max_tokens=2, tenant="B"))
    order = admissions(h)
    if policy == "fair":
        assert order == ["b", "a1", "a2", "a3", "a4"]  # next in, as soon as a0 leaves its seat
        assert h.sched.stats.preemptions == 0  # one seat: taking it would only swap who waits
    else:
        assert order == ["a1", "a2", "a3", "a4", "b"]


def test_tenants_take_turns_and_each_keeps_its_arrival_order(kv: bool) -> None:
    h = Harness.build(kv, scheduling_policy="fair", max_num_seqs=1)
    for rid in ["a0", "a1", "a2", "b0", "b1", "b2", "c0"]:
        h.add(request(rid, [len(h.sched.requests) + 1] * 3, max_tokens=1, tenant=rid[0]))
    assert admissions(h) == ["a0", "b0", "c0", "a1", "b1", "a2", "b2"]


def test_one_tenant_is_served_first_come_first_served(kv: bool) -> None:
    orders = []
    for policy in ("fcfs", "fair"):
        h = Harness.build(kv, scheduling_policy=policy, max_num_seqs=2, num_blocks=6)
        h.add(*[request(f"r{i}", range(10 * i, 10 * i + 6), max_tokens=5) for i in range(5)])
        orders.append(admissions(h))
    assert orders[0] == orders[1]


def test_a_newcomer_takes_a_seat_from_the_tenant_holding_every_one(kv: bool) -> None:
    h = Harness.build(kv, scheduling_policy="fair", max_num_seqs=4, num_blocks=32)
    burst = [
        request(f"a{i}", range(10 * i, 10 * i + 5), max_tokens=20, tenant="A") for i in range(6)
    ]
    h.add(*burst)
    h.step()
    b = request("b", [90, 91, 92], max_tokens=3, tenant="B")
    h.add(b)
    released = h.sched.stats.entries_released["max_num_seqs"]  # a4's, in the first pass
    out = h.step()  # no seat: the pass stops at b, ahead of a4, and keeps nothing it looked up
    assert out.new == [] and h.sched.tracker.peek_lookup("b") is None
    assert h.sched.stats.entries_released["max_num_seqs"] == released + 1
    out = h.step()  # a3, the latest of the tenant holding all four seats, makes room for b
    assert out.dropped_request_ids == ["a3"] and [n.request_id for n in out.new] == ["b"]
    assert burst[3].status is RequestStatus.PREEMPTED and h.sched.stats.preemptions == 1
    assert ids(h.sched.running) == ["a0", "b", "a1", "a2"]
    assert dict(h.sched.running_per_tenant) == {"A": 3, "B": 1}
    h.step()
    h.step()
    assert h.finish_of("b") is not None and all(h.finish_of(r.request_id) is None for r in burst)
    h.run_to_idle()
    for r in burst:  # a3's recompute changes nothing
        assert h.outputs(r.request_id) == [1005 + i for i in range(20)]


def test_a_newcomer_short_of_blocks_takes_them_from_the_busiest_tenant() -> None:
    h = Harness.build(
        True, scheduling_policy="fair", num_blocks=6
    )  # three requests of two blocks fill it
    h.add(
        *[request(f"a{i}", range(10 * i, 10 * i + 5), max_tokens=4, tenant="A") for i in range(3)]
    )
    h.step()
    h.add(request("b", range(50, 55), max_tokens=2, tenant="B"))
    out = h.step()
    assert out.new == [] and h.sched.stats.entries_released["no_blocks"] == 1
    assert h.sched.tracker.peek_lookup("b") is None
    out = h.step()
    assert out.dropped_request_ids == ["a2"] and [n.request_id for n in out.new] == ["b"]
    assert h.sched.stats.entries_released["preempted"] == 1
    h.run_to_idle()
    assert h.outputs("b") == [1005, 1006]
    assert all(h.outputs(f"a{i}") == [1005, 1006, 1007, 1008] for i in range(3))


def test_no_seat_is_taken_when_a_request_ended_meanwhile(kv: bool) -> None:
    h = Harness.build(kv, scheduling_policy="fair", max_num_seqs=3)
    h.add(request("a0", [1, 2, 3], max_tokens=2, tenant="A"))
    h.add(*[request(f"a{i}", [i, i, i], max_tokens=9, tenant="A") for i in (1, 2)])
    h.step()
    h.add(request("b", [7, 7, 7], max_tokens=1, tenant="B"))
    h.step()  # b finds no seat; a0 ends with this step's token, which frees one
    out = h.step()
    assert [n.request_id for n in out.new] == ["b"] and out.dropped_request_ids == ["a0"]
    assert h.sched.stats.preemptions == 0
    h.run_to_idle()


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_growth_preempts_the_busiest_tenants_latest_not_the_latest_arrival(policy: str) -> None:
    h = Harness.build(True, scheduling_policy=policy, num_blocks=8)
    h.add(
        *[request(f"a{i}", range(10 * i, 10 * i + 7), max_tokens=6, tenant="A") for i in range(3)]
    )
    h.step()
    h.add(request("b", range(30, 37), max_tokens=2, tenant="B"))
    h.step()  # all four hold two blocks each: the pool is full
    out = h.step()  # the next token of each needs a third block
    if policy == "fair":
        assert out.dropped_request_ids == ["a2"]
    else:
        assert out.dropped_request_ids == ["b", "a2"]
    h.run_to_idle()
    assert h.outputs("b") == [1007, 1008]


def test_a_drained_ledger_starts_even(kv: bool) -> None:
    h = Harness.build(kv, scheduling_policy="fair", max_num_seqs=2)
    h.add(*[request(f"a{i}", [i + 1] * 3, max_tokens=4, tenant="A") for i in range(3)])
    h.step()
    drained = h.sched.drain()
    assert not h.sched.running_per_tenant and len(h.sched.waiting) == 0
    h.worker.restart()
    h.pending.clear()
    for r in drained:
        h.add(r)
    h.add(request("b", [9, 9, 9], max_tokens=1, tenant="B"))
    assert ids(list(h.sched.waiting)) == ["a0", "b", "a1", "a2"]
    h.run_to_idle()


def test_waiting_requests_are_counted_per_tenant() -> None:
    """What admission shares the waiting cap by (scheduler_svc/admission.TenantShare)."""
    fair = FairQueue(Counter())
    fcfs = FCFSQueue()
    for i, tenant in enumerate("AABAC"):
        for queue in (fair, fcfs):
            queue.push(arrived(f"{tenant}{i}", tenant, i))
    assert fair.per_tenant() == fcfs.per_tenant() == {"A": 3, "B": 1, "C": 1}
    fair.pop()
    fair.remove(next(r for r in fair if r.tenant == "B"))
    assert sum(fair.per_tenant().values()) == len(fair) == 3
    assert "B" not in fair.per_tenant()
