"""What enters the prefix cache, what may hit it, and in which order it is evicted."""

from collections.abc import Sequence

import pytest

from scheduler_svc.core import RequestStatus, Scheduler, sha256_block_hash
from scheduler_svc.core.block_hash import BlockHash, ExtraKeys
from tests.core.fakes import FakeWorker
from tests.core.harness import Harness, config, request

A = list(range(0, 8))


def test_partial_blocks_are_never_cached_and_decode_fills_chain_from_the_right_parent(
    kv: bool,
) -> None:
    h = Harness.build(kv)
    r = request("r", range(6), max_tokens=4)
    h.add(r)
    out = h.step()
    if kv:
        (new,) = out.new
        assert new.block_ids == [0, 1] and [b for b, _ in new.written] == [0]
        assert h.cached() == [0]  # block 1 holds 2 of 4 tokens
    out = h.step()  # position 6
    assert [c.written for c in out.cont] == [[]]
    if kv:
        assert h.cached() == [0]
    out = h.step()  # position 7 fills block 1 with two prompt and two generated tokens
    if kv:
        pool = h.kv.pool
        h0 = sha256_block_hash(None, [0, 1, 2, 3])
        h1 = sha256_block_hash(h0, [4, 5, 1006, 1007])
        assert [c.written for c in out.cont] == [[(1, h1)]]
        assert pool.blocks[1].block_hash == h1 and pool.blocks[1].parent is pool.blocks[0]
        assert pool.blocks[1].token_ids == (4, 5, 1006, 1007)
        assert pool.blocks[0].children == {pool.blocks[1]}
    else:
        assert [c.written for c in out.cont] == [[]]
    h.run_to_idle()
    follower = request("f", [0, 1, 2, 3, 4, 5, 1006, 1007, 9], max_tokens=1)
    h.add(follower)
    (new,) = h.step().new
    assert new.num_computed_tokens == (8 if kv else 0)


def test_salts_isolate_both_ways(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=16)
    prompt = A + [8]
    h.add(request("salted", prompt, max_tokens=1, cache_salt="tenant-1"))
    h.step()
    if kv:
        assert h.sched.cached_prefix_tokens(prompt, "tenant-1") == 8
    assert h.sched.cached_prefix_tokens(prompt, None) == 0
    assert h.sched.cached_prefix_tokens(prompt, "tenant-2") == 0
    h.add(
        request("plain", prompt, max_tokens=1),
        request("other", prompt, max_tokens=1, cache_salt="tenant-2"),
    )
    out = h.step()
    assert [n.num_computed_tokens for n in out.new] == [0, 0]
    h.add(
        request("plain2", prompt, max_tokens=1),
        request("salted2", prompt, max_tokens=1, cache_salt="tenant-1"),
    )
    out = h.step()
    # the unsalted cache is not visible to a salted request, nor the reverse
    assert [n.num_computed_tokens for n in out.new] == ([8, 8] if kv else [0, 0])
    if kv:
        by_rid = {n.request_id: [b for b, _ in n.claimed] for n in out.new}
        assert by_rid["plain2"] != by_rid["salted2"]
        assert h.worker.claims_checked == 4  # the worker saw the salt each block holds


def test_a_forged_hash_collision_with_other_tokens_is_rejected(kv: bool) -> None:
    forged_block = (9, 9, 9, 9)

    def forging(parent: BlockHash | None, tokens: Sequence[int], extra: ExtraKeys) -> BlockHash:
        if tuple(tokens) == forged_block:  # collide with the block [0, 1, 2, 3]
            return sha256_block_hash(parent, [0, 1, 2, 3], extra)
        return sha256_block_hash(parent, tokens, extra)

    cfg = config(kv=kv, num_blocks=16)
    h = Harness(Scheduler(cfg, block_hasher=forging), FakeWorker(4, kv=kv))
    genuine, forged = A + [8], [9, 9, 9, 9, 4, 5, 6, 7, 8]  # same hash chain, other tokens
    h.add(request("genuine", genuine, max_tokens=1))
    h.step()
    h.add(request("forged", forged, max_tokens=1))
    (new,) = h.step().new
    assert new.num_computed_tokens == 0 and new.claimed == []
    if kv:
        # forged's blocks declare the same hashes, but none may enter the cache
        assert [hash_ for _, hash_ in new.written] == [
            h.kv.pool.blocks[0].block_hash,
            h.kv.pool.blocks[1].block_hash,
        ]
        assert h.cached() == [0, 1]
        assert h.sched.cached_prefix_tokens(forged, None) == 0
        assert h.sched.cached_prefix_tokens(genuine, None) == 8

    # and the other way round: the forged content cached first is not served to the genuine
    h = Harness(Scheduler(cfg, block_hasher=forging), FakeWorker(4, kv=kv))
    h.add(request("forged", forged, max_tokens=1))
    h.step()
    h.add(request("genuine", genuine, max_tokens=1))
    (new,) = h.step().new
    assert new.num_computed_tokens == 0
    if kv:
        assert h.sched.cached_prefix_tokens(forged, None) == 8
    h.run_to_idle()


def test_eviction_order_is_lru_across_requests_and_tail_first_within_one(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=8)
    first = request("first", range(10), max_tokens=1)
    second = request("second", range(20, 30), max_tokens=2)
    h.add(first, second)
    h.step()  # first finishes and frees 2, 1, 0 (tail first)
    h.step()  # second finishes and frees 5, 4, 3
    if kv:
        assert h.free_queue() == [6, 7, 2, 1, 0, 5, 4, 3]
        assert h.cached() == [0, 1, 3, 4]
    # a hit on first's head block makes it (and only it) recently used again
    h.add(request("touch", [0, 1, 2, 3, 77], max_tokens=1))
    (new,) = h.step().new
    if kv:
        assert [b for b, _ in new.claimed] == [0] and new.block_ids == [0, 6]
        assert h.free_queue() == [7, 2, 1, 5, 4, 3, 6, 0]
    h.add(request("big", range(100, 120), max_tokens=1))
    (new,) = h.step().new
    if kv:
        # untouched 7, then first's partial 2 and its tail 1, second's partial 5 and tail 4
        assert new.block_ids == [7, 2, 1, 5, 4]
        assert h.sched.stats.evictions == 2
        assert [b.removal_source for b in h.kv.pool.blocks if b.block_id in (1, 4)] == [
            "eviction",
            "eviction",
        ]
        # the heads of both chains survive; the taken blocks now cache big's prompt
        pool = h.kv.pool
        assert pool.blocks[0].token_ids == (0, 1, 2, 3)
        assert pool.blocks[3].token_ids == (20, 21, 22, 23)
        assert h.cached() == [0, 1, 2, 3, 4, 5, 7] and h.free_queue()[:3] == [3, 6, 0]
    h.run_to_idle()


def test_chained_hashes_are_computed_once_per_block_even_across_preemption(kv: bool) -> None:
    calls: list[tuple[int, ...]] = []

    def counting(parent: BlockHash | None, tokens: Sequence[int], extra: ExtraKeys) -> BlockHash:
        calls.append(tuple(tokens))
        return sha256_block_hash(parent, tokens, extra)

    cfg = config(kv=kv, num_blocks=4)
    h = Harness(Scheduler(cfg, block_hasher=counting), FakeWorker(4, kv=kv))
    h.add(request("a", range(6), max_tokens=6), request("b", range(10, 18), max_tokens=6))
    h.run_to_idle()
    if kv:
        assert h.sched.stats.preemptions == 1 and h.sched.stats.entries_released["preempted"] == 1
        # every block that was ever full or looked up, hashed exactly once: b's chain
        # survived its preemption and was not recomputed on its way back
        assert calls == [
            (0, 1, 2, 3),
            (10, 11, 12, 13),
            (14, 15, 16, 17),
            (4, 5, 1006, 1007),
            (1008, 1009, 1010, 1011),
        ]
    else:
        assert calls == []  # no cache, no hashing
    assert h.outputs("a") == [1006 + i for i in range(6)]
    assert h.outputs("b") == [1008 + i for i in range(6)]


@pytest.mark.parametrize("between", ["eviction", "worker_report"])
def test_chunked_prefill_continues_across_steps_with_an_eviction_in_between(
    kv: bool, between: str
) -> None:
    """x is prefilled in three chunks. Between its second and third, p's cached tail (block 1)
    goes (taken by x's third chunk, or dropped by the worker) while y waits with a lookup from
    arrival that covers it. x continues unharmed; y's lookup is found stale before use and y
    later claims only what is still cached."""
    h = Harness.build(kv, num_blocks=6, max_num_batched_tokens=8)
    p_prompt = list(range(100, 108))
    h.add(request("p", p_prompt, max_tokens=1))
    h.step()  # p caches blocks 0, 1; the queue is 2, 3, 4, 5, 1, 0
    x, y = request("x", range(20), max_tokens=1), request("y", [*p_prompt, 50], max_tokens=1)
    h.add(x)
    chain = [sha256_block_hash(None, range(4))]
    for i in range(1, 5):
        chain.append(sha256_block_hash(chain[-1], range(4 * i, 4 * i + 4)))
    p_head = sha256_block_hash(None, p_prompt[:4])

    (new,) = h.step().new
    assert (new.num_computed_tokens, new.num_scheduled_tokens) == (0, 8)
    if kv:
        assert new.block_ids == [2, 3] and new.written == [(2, chain[0]), (3, chain[1])]

    out = h.plan()  # second chunk; y arrives while it runs
    (cont,) = out.cont
    assert (cont.num_computed_tokens, cont.num_scheduled_tokens) == (8, 8) and out.new == []
    if kv:
        assert cont.new_block_ids == [4, 5] and cont.written == [(4, chain[2]), (5, chain[3])]
    if between == "worker_report":
        h.add(y)
    h.finish_step(drop_blocks=[1] if kv and between == "worker_report" else [])
    if between == "eviction":
        h.add(y)
    if kv:
        assert [b.block_id for b in h.sched.tracker.peek_lookup("y").blocks] == [0, 1]
        assert h.cached() == ([0, 2, 3, 4, 5] if between == "worker_report" else [0, 1, 2, 3, 4, 5])

    out = h.plan()  # x's last chunk takes block 1; y's lookup is checked right after
    (cont,) = out.cont
    assert (cont.num_computed_tokens, cont.num_scheduled_tokens) == (16, 4)
    assert [n.request_id for n in out.new] == ([] if kv else ["y"])  # no-KV: no blocks to lack
    stale = h.sched.stats.stale_entries
    if kv:
        assert cont.new_block_ids == [1] and cont.written == [(1, chain[4])]
        assert h.sched.stats.evictions == (1 if between == "eviction" else 0)
        assert stale == {**dict.fromkeys(stale, 0), between: 1}
        # recomputed: p's head only, and then too few free blocks to admit y this step
        assert h.sched.tracker.peek_lookup("y") is None
        assert h.sched.stats.entries_released["no_blocks"] == 1
    else:
        assert sum(stale.values()) == 0
    h.finish_step()
    assert h.outputs("x") == [1020] and x.status is RequestStatus.FINISHED
    if kv:
        pool = h.kv.pool
        assert pool.blocks[1].parent is pool.blocks[5]  # x's own chain, across all chunks

    if kv:
        (new,) = h.step().new  # y, once x has freed its blocks
        assert new.request_id == "y"
        assert new.claimed == [(0, p_head)] and new.num_computed_tokens == 4
    h.run_to_idle()
    assert h.outputs("y") == [1009]
