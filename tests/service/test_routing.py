"""The routing rule (scheduler_svc/routing.py) on plain data: no gRPC, no asyncio, no clock."""

from __future__ import annotations

import pytest

from scheduler_svc.routing import (
    CACHED_TOKENS_PER_QUEUED_REQUEST,
    Demand,
    WorkerView,
    candidates,
    choose,
    holds,
    is_overdue,
    placement_score,
)


def worker(wid: str, max_len: int = 256, load: int = 0, plan_out_s: float = 0.0) -> WorkerView:
    return WorkerView(wid, max_len=max_len, max_model_len=256, load=load, plan_out_s=plan_out_s)


def ids(workers: list[WorkerView]) -> list[str]:
    return [w.worker_id for w in workers]


def no_cache(_: WorkerView) -> int:
    return 0


def test_holds_counts_up_to_the_context_length_only():
    small = worker("s", max_len=128)
    assert holds(small, 128) and not holds(small, 129)
    full = worker("f", max_len=256)
    assert holds(full, 10_000), "past the context length the ledger cuts the request itself"


def test_overdue_past_half_the_step_timeout_and_never_without_one():
    assert not is_overdue(worker("w", plan_out_s=2.0), 4.0)
    assert is_overdue(worker("w", plan_out_s=2.01), 4.0)
    assert not is_overdue(worker("w", plan_out_s=1e9), 0.0), "0 means no step deadline"


def test_the_whole_request_tier_comes_before_the_prompt_tier():
    workers = [worker("small", max_len=128), worker("big", max_len=256)]
    assert ids(candidates(workers, Demand(100, 100), 300.0)) == ["big"]
    assert ids(candidates(workers, Demand(100, 20), 300.0)) == ["small", "big"]
    # no pool holds prompt + max_tokens: those that hold the prompt
    mid = [worker("small", max_len=64), worker("medium", max_len=128)]
    assert ids(candidates(mid, Demand(100, 100), 300.0)) == ["medium"]


def test_with_no_pool_holding_the_prompt_every_worker_is_a_candidate():
    workers = [worker("a", max_len=32), worker("b", max_len=64)]
    assert ids(candidates(workers, Demand(200, 3), 300.0)) == ["a", "b"]


def test_a_responsive_worker_beats_an_overdue_one_whatever_its_pool():
    workers = [worker("hung", max_len=256, plan_out_s=2.5), worker("small", max_len=128)]
    # prompt + max_tokens only fits "hung"; its plan is out past half of the 4 s deadline
    assert ids(candidates(workers, Demand(40, 100), 4.0)) == ["small"]
    # every worker overdue: the pool tiers apply among them
    late = [worker("a", max_len=256, plan_out_s=3), worker("b", max_len=128, plan_out_s=3)]
    assert ids(candidates(late, Demand(40, 100), 4.0)) == ["a"]


def test_a_negative_max_tokens_counts_as_none():
    assert Demand(10, -1).whole == 10


def test_the_score_weighs_cached_tokens_against_load():
    assert placement_score(CACHED_TOKENS_PER_QUEUED_REQUEST, 1) == 0
    assert placement_score(0, 3) == -3
    assert placement_score(2 * CACHED_TOKENS_PER_QUEUED_REQUEST, 0) == 2


def test_the_least_loaded_worker_wins_without_a_cache_hit():
    workers = [worker("busy", load=2), worker("idle", load=0)]
    assert choose(workers, Demand(10, 5), 300.0, no_cache).worker_id == "idle"


def test_a_long_cached_prefix_outweighs_a_little_load():
    workers = [worker("cold", load=0), worker("warm", load=1)]
    cached = {"cold": 0, "warm": 2 * CACHED_TOKENS_PER_QUEUED_REQUEST}
    chosen = choose(workers, Demand(200, 5), 300.0, lambda w: cached[w.worker_id])
    assert chosen.worker_id == "warm"


def test_a_tie_goes_to_the_worker_whose_plan_is_out_the_shortest_then_to_the_first():
    workers = [worker("slow", plan_out_s=1.0), worker("quick", plan_out_s=0.1)]
    assert choose(workers, Demand(10, 5), 300.0, no_cache).worker_id == "quick"
    same = [worker("first"), worker("second")]
    assert choose(same, Demand(10, 5), 300.0, no_cache).worker_id == "first"


def test_only_candidates_are_probed_once_each():
    workers = [worker("small", max_len=64), worker("big1"), worker("big2")]
    probed: list[str] = []

    def probe(w: WorkerView) -> int:
        probed.append(w.worker_id)
        return 0

    choose(workers, Demand(100, 100), 300.0, probe)
    assert sorted(probed) == ["big1", "big2"]


def test_choosing_among_no_workers_is_refused():
    with pytest.raises(ValueError):
        choose([], Demand(1, 1), 300.0, no_cache)
