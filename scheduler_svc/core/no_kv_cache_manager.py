"""The KV manager of models without a KV cache (encoders): same interface, nothing to do."""

from __future__ import annotations

from collections.abc import Container, Sequence

from scheduler_svc.core.block_hash import BlockHash
from scheduler_svc.core.kv_block import KVBlock
from scheduler_svc.core.kv_cache_interface import CacheLookup, KVManager
from scheduler_svc.core.output import BlockHashPair


class NoKVCacheManager(KVManager):
    @property
    def num_blocks_total(self) -> int:
        return 0

    @property
    def num_free_blocks(self) -> int:
        return 0

    @property
    def num_cached_blocks(self) -> int:
        return 0

    @property
    def usage(self) -> float:
        return 0.0

    @property
    def token_capacity(self) -> int | None:
        return None

    @property
    def num_tables(self) -> int:
        return 0

    def find_cached_prefix(
        self,
        token_ids: Sequence[int],
        chain: Sequence[BlockHash],
        max_blocks: int,
        start: CacheLookup | None = None,
    ) -> CacheLookup:
        return CacheLookup()

    def stale_source(self, lookup: CacheLookup) -> str | None:
        return None

    def allocate_for_admission(
        self, request_id: str, hits: list[KVBlock], num_tokens: int
    ) -> list[KVBlock] | None:
        return []

    def allocate_slots(self, request_id: str, num_tokens: int) -> list[int] | None:
        return []

    def trim(self, request_id: str, num_tokens: int) -> int:
        return 0

    def commit_full_blocks(
        self,
        request_id: str,
        token_ids: Sequence[int],
        chain: Sequence[BlockHash],
        num_full_blocks: int,
        cache: bool = True,
    ) -> list[BlockHashPair]:
        return []

    def free(self, request_id: str) -> None:
        return None

    def block_ids(self, request_id: str) -> list[int]:
        return []

    def claimed_pairs(self, request_id: str, num_blocks: int) -> list[BlockHashPair]:
        return []

    def free_orphan_tables(self, running_ids: Container[str]) -> int:
        return 0

    def remove_blocks(self, block_ids: Sequence[int], source: str) -> int:
        return 0

    def clear_cache(self, source: str) -> int:
        return 0

    def reset_prefix_cache(self) -> bool:
        return True
