"""Abort in every state a request can be in."""

import pytest

from scheduler_svc.core import FinishReason, RequestStatus
from tests.core.harness import Harness, request

STATES = ["waiting", "mid_prefill", "decoding", "preempted", "finished", "unknown"]


def put_in_state(h: Harness, state: str) -> str:
    if state == "waiting":
        h.add(request("r", range(8)))
        return "r"
    if state == "mid_prefill":
        h.add(request("r", range(24)))  # the budget is 8: three chunks
        h.step()
        assert h.sched.requests["r"].num_computed_tokens == 8
        return "r"
    if state == "decoding":
        h.add(request("r", range(6), max_tokens=10))
        h.step()
        h.step()
        return "r"
    if state == "preempted":
        h.add(request("a", range(6), max_tokens=10), request("r", range(10, 18), max_tokens=10))
        h.step()
        h.step()
        if h.sched.config.kv_cache:
            assert h.sched.requests["r"].status is RequestStatus.PREEMPTED
        return "r"
    if state == "finished":
        h.add(request("r", range(6), max_tokens=1))
        h.step()
        return "r"
    return "nobody"


@pytest.mark.parametrize("state", STATES)
def test_abort_in_every_state(kv: bool, state: str) -> None:
    tight = {"mid_prefill": {"max_num_batched_tokens": 8}, "preempted": {"num_blocks": 4}}
    h = Harness.build(kv, **tight.get(state, {}))
    rid = put_in_state(h, state)
    stats = h.sched.stats
    r = h.worker.requests.get(rid)
    before = (r and r.finish_reason, dict(stats.entries_released))
    was_running = rid in h.sched.requests and h.sched.requests[rid].status is RequestStatus.RUNNING
    aborted = h.sched.abort_request(rid)
    if state in ("finished", "unknown"):
        assert aborted is False
        assert (r and r.finish_reason, dict(stats.entries_released)) == before
    else:
        assert aborted is True
        assert rid not in h.sched.requests and rid not in h.sched.tracker.entries
        assert not h.has_table(rid)
        assert r.status is RequestStatus.FINISHED and r.finish_reason is FinishReason.ABORT
        assert stats.entries_released["aborted"] == 1
        assert h.sched.abort_request(rid) is False  # twice: the second does nothing
        out = h.step()
        # only the worker's copy needs dropping: waiting and preempted ones it never holds
        assert (rid in out.dropped_request_ids) == was_running
    if kv:
        held = {b for r in h.sched.running for b in h.table(r.request_id)}
        assert all(ref == (1 if i in held else 0) for i, ref in enumerate(h.refs()))
    h.run_to_idle()
    assert h.sched.snapshot().blocks_in_use == 0 and len(h.sched.tracker) == 0


def test_abort_between_schedule_and_update_ignores_the_late_token(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("r", range(6), max_tokens=5))
    h.step()
    out = h.plan()
    result = h.worker.run(out)
    assert h.sched.abort_request("r")
    assert h.sched.update_from_output(out, result) == []
    assert h.outputs("r") == [1006]
    h.run_to_idle()


def test_a_request_the_frontend_finished_on_a_stop_string_counts_as_stop(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("r", range(6), max_tokens=10))
    h.step()
    h.step()
    stats = h.sched.stats
    assert h.sched.abort_request("r", FinishReason.STOP)
    assert h.worker.requests["r"].finish_reason is FinishReason.STOP
    assert stats.entries_released["finished"] == 1 and stats.entries_released["aborted"] == 0
    assert "r" not in h.sched.tracker.entries and not h.has_table("r")
    assert "r" in h.step().dropped_request_ids
    h.run_to_idle()
    assert h.sched.snapshot().blocks_in_use == 0 and len(h.sched.tracker) == 0
