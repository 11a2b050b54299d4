from scheduler_svc.core.block_hash import extend_chain
from scheduler_svc.core.block_pool import BlockPool
from scheduler_svc.core.kv_block import KVBlock
from scheduler_svc.core.stats import SchedulerStats


def make_pool(n: int = 6) -> tuple[BlockPool, SchedulerStats]:
    stats = SchedulerStats()
    return BlockPool(n, 4, stats), stats


def queue(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_queue]


def cache_chain(pool: BlockPool, tokens: list[int]) -> list[KVBlock]:
    """Take blocks for `tokens` and register every full one, like a finished prefill."""
    chain = extend_chain([], tokens, 4, len(tokens) // 4, ())
    blocks = pool.take(len(chain))
    for i, block in enumerate(blocks):
        parent = blocks[i - 1] if i else None
        pool.register(block, chain[i], tuple(tokens[i * 4 : i * 4 + 4]), parent)
    return blocks


def test_take_pin_release_keep_counts_and_lru_order() -> None:
    pool, _ = make_pool()
    a = pool.take(2)
    assert [b.block_id for b in a] == [0, 1] and [b.ref_cnt for b in a] == [1, 1]
    pool.pin(a)
    assert [b.ref_cnt for b in a] == [2, 2]
    pool.release(reversed(a))
    assert queue(pool) == [2, 3, 4, 5] and [b.ref_cnt for b in a] == [1, 1]
    pool.release(reversed(a))
    assert queue(pool) == [2, 3, 4, 5, 1, 0]
    pool.pin([a[0]])  # a hit on a free block pulls it out of the middle of the queue
    assert queue(pool) == [2, 3, 4, 5, 1] and a[0].ref_cnt == 1


def test_taking_a_cached_block_evicts_its_hash_and_moves_the_epoch() -> None:
    pool, stats = make_pool(3)
    blocks = cache_chain(pool, list(range(8)))
    pool.release(reversed(blocks))
    assert queue(pool) == [2, 1, 0] and len(pool.cached) == 2
    epoch, generation = pool.removal_epoch, blocks[1].generation
    assert [b.block_id for b in pool.take(1)] == [2]  # uncached: no eviction
    assert pool.removal_epoch == epoch and stats.evictions == 0
    assert [b.block_id for b in pool.take(1)] == [1]  # the tail of the chain goes first
    assert pool.removal_epoch == epoch + 1 and stats.evictions == 1
    assert blocks[1].block_hash is None and blocks[1].generation == generation + 1
    assert blocks[1].removal_source == "eviction"
    assert list(pool.cached.values()) == [blocks[0]] and blocks[0].children == set()


def test_register_keeps_the_first_holder_of_a_hash() -> None:
    pool, _ = make_pool()
    first = cache_chain(pool, list(range(4)))[0]
    twin = pool.take(1)[0]
    assert not pool.register(twin, first.block_hash, first.token_ids, None)
    assert twin.block_hash is None and pool.cached[first.block_hash] is first


def test_losing_a_hash_takes_every_cached_descendant_with_it() -> None:
    pool, _ = make_pool()
    blocks = cache_chain(pool, list(range(12)))
    assert blocks[1].parent is blocks[0] and blocks[2].parent is blocks[1]
    epoch = pool.removal_epoch
    assert pool.remove_blocks([blocks[0].block_id], "worker_report") == 3
    assert pool.cached == {} and pool.removal_epoch == epoch + 1
    assert [b.removal_source for b in blocks] == ["worker_report"] * 3
    assert all(b.parent is None and not b.children and b.token_ids == () for b in blocks)
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]  # the tables holding them keep them


def test_find_prefix_stops_at_missing_foreign_or_mismatching_blocks() -> None:
    pool, _ = make_pool()
    tokens = list(range(12))
    blocks = cache_chain(pool, tokens)
    chain = extend_chain([], tokens, 4, 3, ())
    assert pool.find_prefix(tokens, chain, 3) == blocks
    assert pool.find_prefix(tokens, chain, 2) == blocks[:2]
    assert pool.find_prefix(tokens, chain, 3, start=blocks[:1]) == blocks
    other = tokens[:4] + [99] * 8
    assert pool.find_prefix(other, chain, 3) == blocks[:1]  # same hashes, other tokens
    pool.remove_blocks([blocks[1].block_id], "worker_report")
    assert pool.find_prefix(tokens, chain, 3) == blocks[:1]


def test_clear_drops_every_hash_but_no_block() -> None:
    pool, _ = make_pool()
    blocks = cache_chain(pool, list(range(8)))
    epoch = pool.removal_epoch
    assert pool.clear("cache_reset") == 2
    assert pool.cached == {} and pool.removal_epoch == epoch + 1
    assert [b.ref_cnt for b in blocks] == [1, 1]
    assert [b.removal_source for b in blocks] == ["cache_reset"] * 2
