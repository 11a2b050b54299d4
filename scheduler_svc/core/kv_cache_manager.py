"""Block tables of running requests over one BlockPool, with atomic allocation."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

from scheduler_svc.core.block_hash import BlockHash
from scheduler_svc.core.block_pool import BlockPool
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.kv_block import KVBlock
from scheduler_svc.core.kv_cache_interface import CacheLookup, KVManager
from scheduler_svc.core.output import BlockHashPair
from scheduler_svc.core.stats import SchedulerStats


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class BlockTable:
    blocks: list[KVBlock]
    num_committed: int  # leading full blocks already offered to the cache


class KVCacheManager(KVManager):
    def __init__(self, config: SchedulerConfig, stats: SchedulerStats) -> None:
        self.block_size = config.block_size
        self.pool = BlockPool(config.num_blocks, config.block_size, stats)
        self.tables: dict[str, BlockTable] = {}
        self._caching = config.enable_prefix_caching

    # -- gauges ---------------------------------------------------------------------------

    @property
    def num_blocks_total(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_cached_blocks(self) -> int:
        return len(self.pool.cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    @property
    def token_capacity(self) -> int | None:
        return self.pool.num_blocks * self.block_size

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    # -- prefix lookups -------------------------------------------------------------------

    def find_cached_prefix(
        self,
        token_ids: Sequence[int],
        chain: Sequence[BlockHash],
        max_blocks: int,
        start: CacheLookup | None = None,
    ) -> CacheLookup:
        pool = self.pool
        if start is not None:
            # only a lookup stale_source() just vouched for may be continued
            assert start.epoch == pool.removal_epoch, "continuing an unverified lookup"
            if start.version == pool.registration_version and start.max_blocks == max_blocks:
                return start  # nothing was added or removed since: the walk would end the same
        known = start.blocks if start is not None else ()
        blocks = pool.find_prefix(token_ids, chain, max_blocks, known)
        return CacheLookup(
            blocks=blocks,
            generations=[block.generation for block in blocks],
            num_tokens=len(blocks) * self.block_size,
            epoch=pool.removal_epoch,
            version=pool.registration_version,
            max_blocks=max_blocks,
        )

    def stale_source(self, lookup: CacheLookup) -> str | None:
        epoch = self.pool.removal_epoch
        if lookup.epoch == epoch:
            return None
        for block, generation in zip(lookup.blocks, lookup.generations, strict=True):
            if block.generation != generation:
                return block.removal_source or "eviction"
        lookup.epoch = epoch  # every block still holds what it held: the lookup stays true
        return None

    # -- allocation -----------------------------------------------------------------------

    def allocate_for_admission(
        self, request_id: str, hits: list[KVBlock], num_tokens: int
    ) -> list[KVBlock] | None:
        assert request_id not in self.tables, f"{request_id} already has a block table"
        num_new = cdiv(num_tokens, self.block_size) - len(hits)
        assert num_new >= 0, "hits cover more than the tokens to hold"
        # a free hit leaves the queue when pinned, so it is consumed capacity too
        free_hits = sum(1 for block in hits if block.ref_cnt == 0)
        if num_new > self.pool.num_free - free_hits:
            return None
        self.pool.pin(hits)  # before taking: new blocks must not evict our own hits
        new_blocks = self.pool.take(num_new)
        self.tables[request_id] = BlockTable(hits + new_blocks, num_committed=len(hits))
        return new_blocks

    def allocate_slots(self, request_id: str, num_tokens: int) -> list[int] | None:
        blocks = self.tables[request_id].blocks
        size = self.block_size
        if num_tokens <= len(blocks) * size:
            return []  # the common decode step: the last block still has room
        num_new = cdiv(num_tokens, size) - len(blocks)
        if num_new > self.pool.num_free:
            return None
        new_blocks = self.pool.take(num_new)
        blocks.extend(new_blocks)
        return [block.block_id for block in new_blocks]

    def trim(self, request_id: str, num_tokens: int) -> int:
        table = self.tables[request_id]
        keep = cdiv(num_tokens, self.block_size)
        assert keep >= table.num_committed, "trimming a committed block"
        spare = table.blocks[keep:]
        if spare:
            del table.blocks[keep:]
            self.pool.give_back(reversed(spare))
        return len(spare)

    def commit_full_blocks(
        self,
        request_id: str,
        token_ids: Sequence[int],
        chain: Sequence[BlockHash],
        num_full_blocks: int,
        cache: bool = True,
    ) -> list[BlockHashPair]:
        table = self.tables[request_id]
        start = table.num_committed
        if num_full_blocks <= start:
            return []
        table.num_committed = num_full_blocks
        if not (self._caching and cache):
            return []
        size, blocks, register = self.block_size, table.blocks, self.pool.register
        written: list[BlockHashPair] = []
        for i in range(start, num_full_blocks):
            block, block_hash = blocks[i], chain[i]
            written.append((block.block_id, block_hash))
            parent = blocks[i - 1] if i > 0 else None
            # Chain only from our own cached block: a twin that merely shares the parent's hash
            # could hold other content (a collision), and a private parent keeps us private.
            if parent is not None and parent.block_hash != chain[i - 1]:
                continue
            register(block, block_hash, tuple(token_ids[i * size : (i + 1) * size]), parent)
        return written

    def free(self, request_id: str) -> None:
        table = self.tables.pop(request_id, None)
        if table is not None:
            # tail first, so a chain's tail is evicted before its head
            self.pool.release(reversed(table.blocks))

    # -- reading tables -------------------------------------------------------------------

    def block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.tables[request_id].blocks]

    def claimed_pairs(self, request_id: str, num_blocks: int) -> list[BlockHashPair]:
        pairs: list[BlockHashPair] = []
        for block in self.tables[request_id].blocks[:num_blocks]:
            assert block.block_hash is not None, f"claimed {block} carries no hash"
            pairs.append((block.block_id, block.block_hash))
        return pairs

    def free_orphan_tables(self, running_ids: Container[str]) -> int:
        orphans = [rid for rid in self.tables if rid not in running_ids]
        for rid in orphans:
            self.free(rid)
        return len(orphans)

    # -- cache maintenance ----------------------------------------------------------------

    def remove_blocks(self, block_ids: Sequence[int], source: str) -> int:
        return self.pool.remove_blocks(block_ids, source)

    def clear_cache(self, source: str) -> int:
        return self.pool.clear(source)

    def reset_prefix_cache(self) -> bool:
        if self.pool.num_free != self.pool.num_blocks:
            return False
        self.pool.clear("cache_reset")
        return True
