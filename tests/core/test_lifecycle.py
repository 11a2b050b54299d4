"""Finishing, ignoring, failing, draining: every way a request leaves, and what it leaves."""

from collections.abc import Callable, Sequence

import pytest

from scheduler_svc.core import (
    FinishReason,
    ModelResult,
    Request,
    RequestStatus,
    Scheduler,
    SchedulerOutput,
)
from scheduler_svc.core.block_hash import ExtraKeys, sha256_block_hash
from tests.core.fakes import FakeWorker
from tests.core.harness import Harness, config, has_unfinished, request


def scripted(tokens: list[int]) -> Callable[[str, list[int]], int]:
    def next_token(rid: str, seen: list[int]) -> int:
        return tokens[len(seen) - 4] if len(seen) - 4 < len(tokens) else 1

    return next_token


@pytest.mark.parametrize(
    ("kw", "script", "outputs", "reason"),
    [
        ({"eos_token_ids": frozenset({7})}, [5, 7, 5], [5, 7], "stop"),
        ({"eos_token_ids": frozenset({7}), "ignore_eos": True}, [5, 7, 5], [5, 7, 5], "length"),
        ({"eos_token_ids": frozenset({7}), "min_tokens": 3}, [7, 7, 7, 7], [7, 7, 7], "stop"),
        ({"stop_token_ids": frozenset({6})}, [5, 6, 5], [5, 6], "stop"),
        ({"stop_token_ids": frozenset({6}), "min_tokens": 2}, [6, 5, 6], [6, 5, 6], "stop"),
        ({"stop_token_ids": frozenset({6}), "min_tokens": 2}, [6, 6, 5], [6, 6], "stop"),
        ({}, [5, 5, 5, 5, 5], [5, 5, 5], "length"),
    ],
)
def test_token_level_stops(
    kv: bool, kw: dict, script: list[int], outputs: list[int], reason: str
) -> None:
    cfg = config(kv=kv)
    h = Harness(Scheduler(cfg), FakeWorker(4, kv=kv, next_token=scripted(script)))
    r = request("r", [1, 2, 3, 4], max_tokens=3, **kw)
    h.add(r)
    h.run_to_idle()
    assert h.outputs("r") == outputs and h.finish_of("r").finish_reason == reason
    assert r.finish_reason == reason and r.output_token_ids == outputs


def test_max_model_len_caps_generation(kv: bool) -> None:
    h = Harness.build(kv, max_model_len=10)
    h.add(request("r", range(8), max_tokens=100))
    h.run_to_idle()
    assert h.outputs("r") == [1008, 1009] and h.finish_of("r").finish_reason == "length"


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "message"),
    [
        ([], 4, "the prompt is empty"),
        (list(range(65)), 4, "more than the maximum context length of 64"),
        (
            list(range(33)),
            4,
            "33 tokens, more than a worker of this model can hold in its KV cache",
        ),
        (list(range(4)), 0, "max_tokens must be at least 1"),
    ],
)
def test_prompts_that_can_never_run_finish_as_ignored_with_a_reason(
    kv: bool, prompt: list[int], max_tokens: int, message: str
) -> None:
    h = Harness.build(kv)
    r = request("bad", prompt, max_tokens=max_tokens)
    h.add(r, request("fine", [1, 2, 3], max_tokens=1))
    if not kv and "KV cache" in message:
        assert r.status is RequestStatus.WAITING  # no pool, no such limit
        h.run_to_idle()
        return
    assert r.status is RequestStatus.FINISHED and r.finish_reason is FinishReason.IGNORED
    assert has_unfinished(h.sched) and h.sched.abort_request("bad") is False
    out = h.plan()
    (update,) = out.finished
    assert update.request_id == "bad" and update.finish_reason == "ignored"
    assert message in update.finish_message and update.new_token_ids == []
    assert [n.request_id for n in out.new] == ["fine"]  # it never blocked the queue
    h.finish_step()
    h.run_to_idle()
    assert [u.request_id for u in h.updates if u.finish_reason == "ignored"] == ["bad"]
    assert "bad" not in h.sched.tracker.entries  # it never got an entry to release


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


def test_reset_prefix_cache_only_when_every_block_is_free(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("r", range(8), max_tokens=2))
    h.step()
    if kv:
        assert h.sched.reset_prefix_cache() is False and h.cached() == [0, 1]
    h.run_to_idle()
    epoch = h.kv.pool.removal_epoch if kv else 0
    assert h.sched.reset_prefix_cache() is True
    if kv:
        assert h.cached() == [] and h.kv.pool.removal_epoch == epoch + 1
        assert h.removal_sources([0, 1]) == ["cache_reset"] * 2


def test_embedding_requests_finish_when_their_prompt_is_computed(kv: bool) -> None:
    h = Harness.build(kv, max_num_batched_tokens=8)
    e = request("e", range(8), max_tokens=0, is_embedding=True)
    h.add(e)
    out = h.step()
    assert out.new[0].num_scheduled_tokens == 8
    end = h.finish_of("e")
    assert end.finish_reason == "stop" and end.new_token_ids == [] and e.output_token_ids == []
    h.add(request("lost", range(4), max_tokens=0, is_embedding=True))
    h.plan()
    h.finish_step(withhold=["lost"])
    assert h.finish_of("lost").finish_reason == "error"
    h.run_to_idle()


def test_embedding_requests_are_never_split_across_steps(kv: bool) -> None:
    h = Harness.build(kv, max_num_batched_tokens=8)
    h.add(request("big", range(12), max_tokens=0, is_embedding=True))
    h.step()
    big = h.finish_of("big")
    assert big.finish_reason == "ignored" and "token budget" in big.finish_message
    h.add(request("g", range(4), max_tokens=3))
    h.step()  # g's prompt
    h.add(request("e", range(8), max_tokens=0, is_embedding=True))  # shares g's first block
    out = h.step()  # g decodes one token: 7 left, too few for e, which waits whole
    assert [n.request_id for n in out.new] == [] and h.finish_of("e") is None
    while h.finish_of("e") is None:
        out = h.step()
        for n in out.new:
            if n.request_id == "e":  # whole, reading no cached block, declaring none written
                assert (n.num_computed_tokens, n.num_scheduled_tokens) == (0, 8)
                assert n.claimed == [] and n.written == []
    h.run_to_idle()


def test_drain_hands_back_every_live_request_in_arrival_order(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=6, max_num_seqs=2)
    h.add(
        request("a", range(6), max_tokens=5),
        request("b", range(10, 16), max_tokens=5),
        request("c", range(20, 26), max_tokens=5),
    )
    h.step()
    h.step()
    drained = h.sched.drain()
    assert [r.request_id for r in drained] == ["a", "b", "c"]
    assert [r.output_token_ids for r in drained] == [[1006, 1007], [1006, 1007], []]
    assert all(r.status is RequestStatus.WAITING and r.num_computed_tokens == 0 for r in drained)
    snap = h.sched.snapshot()
    assert snap.num_running == snap.num_waiting == snap.tracker_entries == 0
    assert snap.blocks_in_use == 0 and snap.blocks_cached == 0
    assert snap.entries_released["worker_lost"] == 3
    assert not has_unfinished(h.sched)
    # another worker's ledger takes them over and finishes them as if nothing happened
    other = Harness.build(kv, num_blocks=6)
    other.add(*drained)
    other.run_to_idle()
    assert [r.output_token_ids for r in drained] == [[1006 + i for i in range(5)]] * 3
    assert [other.finish_of(r).finish_reason for r in "abc"] == ["length"] * 3


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


def test_the_auditor_counts_and_purges_orphans(kv: bool) -> None:
    h = Harness.build(kv, debug_invariants=False)
    h.add(request("r", range(6), max_tokens=3))
    h.step()
    h.sched.tracker.entries["ghost"] = h.sched.tracker.entries["r"]
    if kv:
        h.kv.tables["ghost"] = h.kv.tables["r"]
    h.step()
    assert h.sched.stats.orphans == 1 and "ghost" not in h.sched.tracker.entries
    assert h.sched.stats.table_orphans == (1 if kv else 0)


def test_the_invariant_checker_catches_a_corrupt_ledger() -> None:
    h = Harness.build(True)
    h.add(request("r", range(6), max_tokens=3))
    h.step()
    h.kv.pool.blocks[0].ref_cnt += 1
    with pytest.raises(AssertionError, match="ref count 2 but held by 1"):
        h.sched.check_invariants()
    h.kv.pool.blocks[0].ref_cnt -= 1
    h.kv.pool.blocks[0].token_ids = (9, 9, 9, 9)
    with pytest.raises(AssertionError, match="holds other tokens"):
        h.sched.check_invariants()


def test_cached_prefix_tokens_is_read_only(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("p", range(8), max_tokens=1))
    h.run_to_idle()
    before = h.sched.snapshot()
    assert h.sched.cached_prefix_tokens(list(range(8)) + [1], None) == (8 if kv else 0)
    assert h.sched.cached_prefix_tokens(list(range(8)), None) == (4 if kv else 0)
    assert h.sched.cached_prefix_tokens([], None) == 0
    assert h.sched.snapshot() == before


def test_routing_probe_hashes_only_as_far_as_the_cache_reaches() -> None:
    hashed: list[int] = []

    def counting_hasher(parent: bytes | None, tokens: Sequence[int], extra: ExtraKeys) -> bytes:
        hashed.append(len(tokens))
        return sha256_block_hash(parent, tokens, extra)

    cfg = config(num_blocks=16, max_model_len=64)
    h = Harness(Scheduler(cfg, block_hasher=counting_hasher), FakeWorker(cfg.block_size))
    h.add(request("p", range(24), max_tokens=1))
    h.run_to_idle()
    hashed.clear()
    assert h.sched.cached_prefix_tokens(list(range(24)) + [1, 2, 3, 4, 5], None) == 24
    assert len(hashed) == 7  # six hits and the first miss
    hashed.clear()
    assert h.sched.cached_prefix_tokens([99] + list(range(40)), None) == 0
    assert len(hashed) == 1  # a cold prompt: one hash, not ten


def test_duplicate_live_request_ids_are_refused(kv: bool) -> None:
    sched = Scheduler(config(kv=kv))
    sched.add_request(Request("r", [1, 2], max_tokens=1))
    with pytest.raises(ValueError, match="already live"):
        sched.add_request(Request("r", [1, 2], max_tokens=1))
    (update,) = sched.update_from_output(sched.schedule(), ModelResult(sampled={"r": 3}))
    assert update.finish_reason == "length" and update.new_token_ids == [3]
