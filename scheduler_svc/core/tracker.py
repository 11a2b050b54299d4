"""Computed-blocks tracker: per live request, its hash chain and its last prefix lookup.

The chain is a pure function of the request's tokens, extended block by block and kept across
preemption. The lookup is what the cache held for the request at one moment; it is re-verified
before use when anything was removed since, dropped whenever an attempt does not admit the
request, and the whole entry goes when the request ends. Every drop is counted by reason,
every lookup found untrue by the source of the removal.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

from scheduler_svc.core.block_hash import (
    BlockHash,
    BlockHasher,
    ExtraKeys,
    LazyChain,
    extend_chain,
    request_extra_keys,
)
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.kv_cache_interface import CacheLookup, KVManager
from scheduler_svc.core.request import Request
from scheduler_svc.core.stats import SchedulerStats, bump


@dataclass(slots=True)
class TrackerEntry:
    chain: list[BlockHash]
    extra_keys: ExtraKeys
    lookup: CacheLookup | None = None


class ComputedBlocksTracker:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVManager,
        stats: SchedulerStats,
        hasher: BlockHasher,
    ) -> None:
        self.entries: dict[str, TrackerEntry] = {}
        self._block_size = config.block_size
        self._caching = config.caches_prefixes
        self._kv = kv
        self._stats = stats
        self._hasher = hasher

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, request: Request) -> None:
        rid = request.request_id
        assert rid not in self.entries, f"{rid} is already tracked"
        self.entries[rid] = TrackerEntry([], request_extra_keys(request.cache_salt))
        self.lookup(request)  # taken at arrival, verified again before it is used

    def chain(self, request: Request, num_blocks: int) -> list[BlockHash]:
        entry = self.entries[request.request_id]
        if len(entry.chain) < num_blocks:
            extend_chain(
                entry.chain,
                request.all_token_ids,
                self._block_size,
                num_blocks,
                entry.extra_keys,
                self._hasher,
            )
        return entry.chain

    def lookup(self, request: Request) -> CacheLookup:
        """The request's cache hit as of now: kept if still true, recomputed if stale."""
        entry = self.entries[request.request_id]
        if not self._caching or request.skip_prefix_cache:
            if entry.lookup is None:
                entry.lookup = CacheLookup()
            return entry.lookup
        previous = entry.lookup
        if previous is not None:
            source = self._kv.stale_source(previous)
            if source is not None:
                bump(self._stats.stale_entries, source)
                previous = None
        # the last token is always computed: its logits are what we sample from
        max_blocks = max(request.num_tokens - 1, 0) // self._block_size
        chain = self.chain(request, max_blocks)
        entry.lookup = self._kv.find_cached_prefix(
            request.all_token_ids, chain, max_blocks, previous
        )
        return entry.lookup

    def peek_lookup(self, request_id: str) -> CacheLookup | None:
        entry = self.entries.get(request_id)
        return entry.lookup if entry is not None else None

    def release_lookup(self, request_id: str, reason: str) -> None:
        entry = self.entries.get(request_id)
        if entry is not None and entry.lookup is not None:
            entry.lookup = None
            bump(self._stats.entries_released, reason)

    def remove(self, request_id: str, reason: str) -> None:
        if self.entries.pop(request_id, None) is not None:
            bump(self._stats.entries_released, reason)

    def purge_orphans(self, live_ids: Container[str], num_live: int) -> int:
        """The auditor: entries of requests that are gone. Should always find none."""
        if len(self.entries) == num_live:
            return 0  # every live request has an entry (an invariant), so none is extra
        orphans = [rid for rid in self.entries if rid not in live_ids]
        for rid in orphans:
            del self.entries[rid]
        self._stats.orphans += len(orphans)
        return len(orphans)

    def cached_prefix_tokens(self, token_ids: Sequence[int], cache_salt: str | None) -> int:
        """Read-only probe for routing: nothing is stored or counted. One walk over the cache,
        hashing each block only when the walk reaches it, so a cold prompt costs one hash."""
        if not self._caching or not token_ids:
            return 0
        max_blocks = (len(token_ids) - 1) // self._block_size
        extra_keys = request_extra_keys(cache_salt)
        chain = LazyChain(token_ids, self._block_size, max_blocks, extra_keys, self._hasher)
        return self._kv.find_cached_prefix(token_ids, chain, max_blocks).num_tokens
