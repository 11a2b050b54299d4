"""The pool of physical blocks: ref counts, the LRU free queue and the prefix-cache map.

Rules that keep the map truthful:
- a block is in the map iff its block_hash is set, and the map key is that hash;
- a block is registered only if the block it chains from is registered (its parent), and losing
  a hash takes every registered descendant with it, so no lookup can reach a block whose
  prefix is gone;
- every removal moves the removal epoch and the block's generation, which is how lookups
  computed earlier learn that they may no longer be true.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduler_svc.core.block_hash import BlockHash
from scheduler_svc.core.free_block_queue import FreeBlockQueue
from scheduler_svc.core.kv_block import KVBlock
from scheduler_svc.core.stats import SchedulerStats


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, stats: SchedulerStats) -> None:
        self.block_size = block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[BlockHash, KVBlock] = {}
        self.removal_epoch = 0  # moves on every eviction, worker-reported removal, clear
        self.registration_version = 0  # moves whenever a hash is added
        self._stats = stats

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def take(self, n: int) -> list[KVBlock]:
        """Take n blocks from the LRU end, evicting whatever hashes they still carry."""
        taken = self.free_queue.popleft_n(n)
        evicted = 0
        for block in taken:
            if block.block_hash is not None:
                self._uncache(block, "eviction")
                evicted += 1
            block.ref_cnt = 1
        if evicted:
            self._stats.evictions += evicted
            self.removal_epoch += 1
        return taken

    def pin(self, blocks: Iterable[KVBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def release(self, blocks_in_free_order: Iterable[KVBlock]) -> None:
        """Drop one reference each; blocks reaching 0 join the queue in the order given."""
        for block in blocks_in_free_order:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def give_back(self, blocks: Iterable[KVBlock]) -> None:
        """Blocks a table held only for positions it no longer needs (rejected draft tokens):
        they carry no hash, so they go to the front of the queue and are taken before any
        cached block is evicted."""
        for block in blocks:
            assert block.ref_cnt == 1 and block.block_hash is None, f"{block} is not spare"
            block.ref_cnt = 0
            self.free_queue.appendleft(block)

    def find_prefix(
        self,
        token_ids: Sequence[int],
        chain: Sequence[BlockHash],
        max_blocks: int,
        start: Sequence[KVBlock] = (),
    ) -> list[KVBlock]:
        """Longest run of cached blocks holding these tokens, continuing a known-good start."""
        size = self.block_size
        hits = list(start[:max_blocks])
        prev = hits[-1] if hits else None
        for i in range(len(hits), min(max_blocks, len(chain))):
            block = self.cached.get(chain[i])
            if (
                block is None
                or block.parent is not prev
                or block.token_ids != tuple(token_ids[i * size : (i + 1) * size])
            ):
                break
            hits.append(block)
            prev = block
        return hits

    def register(
        self,
        block: KVBlock,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        parent: KVBlock | None,
    ) -> bool:
        """Cache a full block. The first holder of a hash keeps it; duplicates stay private."""
        if block_hash in self.cached:
            return False
        assert block.block_hash is None, f"{block} is already cached"
        block.block_hash = block_hash
        block.token_ids = token_ids
        block.parent = parent
        block.generation += 1
        if parent is not None:
            if parent.children is None:
                parent.children = set()
            parent.children.add(block)
        self.cached[block_hash] = block
        self.registration_version += 1
        return True

    def remove_blocks(self, block_ids: Iterable[int], source: str) -> int:
        """Worker-reported removals: those hashes (and their descendants) leave the cache."""
        removed = 0
        for block_id in block_ids:
            if 0 <= block_id < len(self.blocks):
                block = self.blocks[block_id]
                if block.block_hash is not None:
                    removed += self._uncache(block, source)
        self.removal_epoch += 1  # the worker said content changed: always distrust lookups
        return removed

    def clear(self, source: str) -> int:
        removed = 0
        for block in list(self.cached.values()):
            if block.block_hash is not None:
                removed += self._uncache(block, source)
        self.removal_epoch += 1
        return removed

    def _uncache(self, root: KVBlock, source: str) -> int:
        stack = [root]
        removed = 0
        while stack:
            block = stack.pop()
            assert block.block_hash is not None
            del self.cached[block.block_hash]
            block.block_hash = None
            block.token_ids = ()
            block.generation += 1
            block.removal_source = source
            parent = block.parent
            if parent is not None and parent.children is not None:
                parent.children.discard(block)
            block.parent = None
            if block.children:
                stack.extend(block.children)
            block.children = None
            removed += 1
        return removed
