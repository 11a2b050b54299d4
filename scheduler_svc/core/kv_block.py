"""One physical KV block as the ledger knows it."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.core.block_hash import BlockHash


@dataclass(eq=False, slots=True)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    # Set only while the block is in the pool's hash map: a hash here is always a claim the
    # pool stands behind.
    block_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()  # the content behind the hash, compared on every lookup
    parent: KVBlock | None = None  # the cached block this one's hash chains from
    children: set[KVBlock] | None = None  # cached blocks chaining from this one
    generation: int = 0  # moves whenever the cached identity changes; lookups remember it
    removal_source: str | None = None  # why it last lost its hash
    prev_free: KVBlock | None = None  # free-queue links, valid only while ref_cnt == 0
    next_free: KVBlock | None = None

    def __repr__(self) -> str:
        cached = self.block_hash.hex()[:8] if self.block_hash is not None else "-"
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hash={cached})"
