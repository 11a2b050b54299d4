"""Admission: the atomic allocation, its failure branches, and what a lookup may be trusted for."""

from scheduler_svc.core import RequestStatus
from tests.core.harness import Harness, request

A = list(range(0, 8))  # two full blocks of 4
B = list(range(50, 58))
C = list(range(200, 208))


def test_passed_over_for_lack_of_blocks_then_prefix_evicted_readmitted_with_fresh_hit(
    kv: bool,
) -> None:
    h = Harness.build(kv, num_blocks=6)
    h.add(request("p", A, max_tokens=1))
    h.step()  # p caches A in blocks 0, 1 and finishes
    holder = request("holder", range(100, 116), max_tokens=2)
    c = request("c", A + [8, 9, 10, 11])
    h.add(holder, c)
    if kv:
        assert h.free_queue() == [2, 3, 4, 5, 1, 0] and h.cached() == [0, 1]
        assert [b.block_id for b in h.sched.tracker.peek_lookup("c").blocks] == [0, 1]

    out = h.step()  # holder takes 2..5; c hits 0, 1 but needs a third block: none is left
    if kv:
        assert [n.request_id for n in out.new] == ["holder"]
        assert h.table("holder") == [2, 3, 4, 5] and h.table("c") == []
        assert h.refs() == [0, 0, 1, 1, 1, 1] and h.free_queue() == [1, 0]
        assert h.sched.tracker.peek_lookup("c") is None
        assert h.sched.stats.entries_released["no_blocks"] == 1
        assert c.status is RequestStatus.WAITING and c.num_computed_tokens == 0

        out = h.step()  # holder's 17th position takes block 1: A's second block is evicted
        assert [x.new_block_ids for x in out.cont] == [[1]] and out.new == []
        assert h.sched.stats.evictions == 1 and h.cached() == [0, 2, 3, 4, 5]
        assert h.sched.stats.entries_released["no_blocks"] == 2
        # holder finished and freed tail first, behind block 0 which stayed free
        assert h.free_queue() == [0, 1, 5, 4, 3, 2]

        out = h.step()  # c is readmitted with the hit recomputed: one block, not two
        (new,) = out.new
        assert new.num_computed_tokens == 4 and [b for b, _ in new.claimed] == [0]
        assert new.block_ids == [0, 1, 5] and c.num_cached_tokens == 4
        assert h.sched.stats.evictions == 2  # block 1 was uncached; holder's block 5 was not
        assert h.refs() == [1, 1, 0, 0, 0, 1] and h.free_queue() == [4, 3, 2]
    else:
        assert [n.request_id for n in out.new] == ["holder", "c"]
        assert c.num_cached_tokens == 0 and h.sched.stats.entries_released["no_blocks"] == 0
    h.run_to_idle()
    stats = h.sched.stats
    assert stats.stale_entries == dict.fromkeys(stats.stale_entries, 0)
    assert stats.entries_released["finished"] == 3 and len(h.sched.tracker) == 0
    assert h.outputs("c") == [1012, 1013, 1014, 1015]


def test_failed_allocation_changes_nothing(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=6)
    h.add(request("p", A, max_tokens=1))
    h.step()
    h.add(request("holder", range(100, 109), max_tokens=20))
    h.step()  # holder takes 2, 3, 4; the queue is 5 then A's blocks 1, 0 (ref 0, cached)
    y = request("y", A + list(range(8, 16)))
    h.add(y)
    if not kv:
        h.step()
        assert y.status is RequestStatus.RUNNING
        return
    pool = h.kv.pool
    before = (
        h.refs(),
        h.free_queue(),
        dict(pool.cached),
        pool.removal_epoch,
        [b.generation for b in pool.blocks],
    )
    assert before[:2] == ([0, 0, 1, 1, 1, 0], [5, 1, 0])
    # y hits 0, 1 and needs 2 more: 3 blocks are free, but two of them are its own hits
    assert h.kv.allocate_for_admission("y", h.sched.tracker.peek_lookup("y").blocks, 16) is None
    out = h.step()
    assert out.new == [] and y.status is RequestStatus.WAITING
    after = (
        h.refs(),
        h.free_queue(),
        dict(pool.cached),
        pool.removal_epoch,
        [b.generation for b in pool.blocks],
    )
    assert after == before
    assert not h.has_table("y") and h.sched.stats.entries_released["no_blocks"] == 1
    assert h.sched.tracker.peek_lookup("y") is None  # nothing learned here is kept


def test_requests_admitted_together_whose_allocations_evict_each_others_hits(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=12)
    filler = request("r", range(300, 315), max_tokens=30)
    h.add(
        request("q", B, max_tokens=1),
        request("p", A, max_tokens=1),
        request("s", C, max_tokens=1),
        filler,
    )
    h.step()
    x = request("x", A + list(range(90, 102)))  # hits A (blocks 2, 3), needs 3 more
    y = request("y", B + [60, 61, 62, 63])  # hits B (blocks 0, 1), needs 1 more
    h.add(x, y)
    if kv:
        assert h.free_queue() == [10, 11, 1, 0, 3, 2, 5, 4]
        assert [b.block_id for b in h.sched.tracker.peek_lookup("y").blocks] == [0, 1]
    out = h.step()
    assert [n.request_id for n in out.new] == ["x", "y"]
    new_x, new_y = out.new
    if kv:
        # x pins its hits, then takes 10, 11 and block 1: y's second hit is evicted
        assert new_x.block_ids == [2, 3, 10, 11, 1] and new_x.num_computed_tokens == 8
        # y's lookup from arrival is found stale, counted, and recomputed to one block
        assert new_y.block_ids == [0, 5, 4] and new_y.num_computed_tokens == 4
        assert [b for b, _ in new_y.claimed] == [0]
        assert h.sched.stats.stale_entries["eviction"] == 1
        assert h.sched.stats.evictions == 3 and h.free_queue() == []
        assert h.refs() == [1] * 12
        assert (x.num_cached_tokens, y.num_cached_tokens) == (8, 4)
        assert h.sched.stats.prefix_cache_queries == 8 * 3 + 15 + 20 + 12
        assert h.sched.stats.prefix_cache_hits == 12
    else:
        assert (new_x.num_computed_tokens, new_y.num_computed_tokens) == (0, 0)
        assert h.sched.stats.stale_entries["eviction"] == 0
    assert h.worker.claims_checked == (3 if kv else 0)
    h.run_to_idle()


def test_whole_prompt_cached_still_computes_its_last_token(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("p", A, max_tokens=1))
    h.step()
    same = request("same", A, max_tokens=1)
    longer = request("longer", A + [8], max_tokens=1)
    h.add(same)
    out = h.step()
    (new,) = out.new
    if kv:
        # 8 tokens fully cached, yet only block 0 is claimed: position 7 must be computed
        assert new.num_computed_tokens == 4 and new.num_scheduled_tokens == 4
        assert [b for b, _ in new.claimed] == [0] and new.block_ids == [0, 2]
        assert new.written == [(2, h.kv.pool.blocks[1].block_hash)]
        assert h.cached() == [0, 1]  # the recomputed twin of block 1 stays private
    else:
        assert (new.num_computed_tokens, new.num_scheduled_tokens) == (0, 8)
    assert h.outputs("same") == [1008]
    h.add(longer)
    (new,) = h.step().new
    if kv:
        assert new.num_computed_tokens == 8 and new.num_scheduled_tokens == 1
        assert [b for b, _ in new.claimed] == [0, 1]
    h.run_to_idle()
    assert h.outputs("longer") == [1009]


def test_same_prompt_twice_in_one_step_shares_blocks_written_in_that_step(kv: bool) -> None:
    h = Harness.build(kv)
    first, second = request("a", A + [8, 9], max_tokens=2), request("b", A + [8, 9], max_tokens=2)
    h.add(first, second)
    out = h.step()
    new_a, new_b = out.new
    if kv:
        assert new_a.block_ids == [0, 1, 2] and [b for b, _ in new_a.written] == [0, 1]
        # b claims what a writes in this very step; the worker writes before it reads
        assert new_b.claimed == new_a.written and new_b.block_ids == [0, 1, 3]
        assert (new_b.num_computed_tokens, new_b.num_scheduled_tokens) == (8, 2)
        assert h.refs()[:4] == [2, 2, 1, 1] and h.worker.claims_checked == 2
        assert second.num_cached_tokens == 8
    else:
        assert new_b.claimed == [] and new_b.num_scheduled_tokens == 10
    h.run_to_idle()
    assert h.outputs("a") == h.outputs("b") == [1010, 1011]


def test_every_admission_failure_branch_releases_the_lookup_and_leaves_nothing(
    kv: bool,
) -> None:
    # max_num_seqs
    h = Harness.build(kv, max_num_seqs=1)
    h.add(request("a", A, max_tokens=3), request("b", A))
    h.step()
    assert h.sched.stats.entries_released["max_num_seqs"] == 1
    _assert_untouched(h, "b")
    h.step()  # the lookup was already released: nothing more to count
    assert h.sched.stats.entries_released["max_num_seqs"] == 1

    # token budget exhausted
    h = Harness.build(kv, max_num_batched_tokens=8)
    h.add(request("a", A, max_tokens=3), request("b", B))
    h.step()
    assert h.sched.stats.entries_released["token_budget"] == 1
    _assert_untouched(h, "b")

    # token budget too small for an unchunked prompt
    h = Harness.build(kv, enable_chunked_prefill=False, num_blocks=20)
    h.add(request("a", range(60), max_tokens=3), request("b", B))
    h.step()
    assert h.sched.stats.entries_released["token_budget"] == 1
    _assert_untouched(h, "b")

    # a step that preempted admits nothing
    h = Harness.build(kv, num_blocks=4)
    h.add(request("a", range(6), max_tokens=5), request("b", range(10, 18), max_tokens=5))
    h.step()
    h.add(request("c", [7]))
    h.step()  # b needs a third block and preempts itself
    if kv:
        assert h.sched.stats.preemptions == 1
        assert h.sched.stats.entries_released["preempted"] == 1
        # the head of the queue is b, whose lookup went with its preemption
        assert h.sched.stats.entries_released["preempted_step"] == 0
        assert h.last.new == [] and h.sched.num_waiting == 2
        _assert_untouched(h, "c")

    # no blocks
    h = Harness.build(kv, num_blocks=2)
    h.add(request("a", A, max_tokens=3), request("b", B))
    h.plan()
    if kv:
        assert h.sched.stats.entries_released["no_blocks"] == 1
        _assert_untouched(h, "b")
        assert h.refs() == [1, 1] and h.free_queue() == []
    h.finish_step()
    # a fills the whole pool: one token, then it is at the pool's length limit
    if kv:
        assert h.finish_of("a").finish_reason == "length" and h.outputs("a") == [1008]
    h.run_to_idle()


def _assert_untouched(h: Harness, rid: str) -> None:
    r = h.sched.requests[rid]
    assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    assert r.num_computed_tokens == 0 and not h.has_table(rid)
    assert rid in h.sched.tracker.entries
    assert all(n.request_id != rid for n in h.last.new)


def test_a_step_that_preempted_releases_the_head_lookup_as_preempted_step(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=4, scheduling_policy="priority")
    h.add(request("a", range(6), max_tokens=5, priority=0))
    h.add(request("b", range(10, 18), max_tokens=5, priority=5))
    h.step()
    urgent = request("urgent", [7, 7, 7], priority=-1)
    h.add(urgent)  # ahead of the preempted b in priority order
    h.plan()
    if kv:
        assert h.sched.stats.preemptions == 1 and h.last.dropped_request_ids == ["b"]
        assert h.sched.stats.entries_released["preempted_step"] == 1
        assert h.last.new == [] and urgent.status is RequestStatus.WAITING
        assert h.sched.tracker.peek_lookup("urgent") is None
    else:
        assert [n.request_id for n in h.last.new] == ["urgent"]
    h.finish_step()
    h.run_to_idle()
    assert h.outputs("b") == [1008, 1009, 1010, 1011, 1012]


def test_prompt_logprob_requests_skip_the_cache_but_still_fill_it(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("lp", A + [8], max_tokens=1, skip_prefix_cache=True))
    (new,) = h.step().new
    if kv:
        assert [b for b, _ in new.written] == [0, 1] and h.cached() == [0, 1]
    assert h.sched.stats.prefix_cache_queries == 0  # a request that may not read is no query
    h.add(request("lp2", A + [8], max_tokens=1, skip_prefix_cache=True))
    (new,) = h.step().new
    assert new.num_computed_tokens == 0 and new.claimed == []
    h.add(request("reader", A + [8], max_tokens=1))
    (new,) = h.step().new
    assert new.num_computed_tokens == (8 if kv else 0)
    assert h.sched.stats.prefix_cache_queries == (9 if kv else 0)
    h.run_to_idle()
