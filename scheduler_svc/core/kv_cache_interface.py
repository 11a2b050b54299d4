"""The interface every KV manager exposes, and the prefix lookup it hands out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

from scheduler_svc.core.block_hash import BlockHash
from scheduler_svc.core.kv_block import KVBlock
from scheduler_svc.core.output import BlockHashPair


@dataclass(slots=True)
class CacheLookup:
    """A prefix-cache hit as computed at one moment: true only while its blocks keep their hash.

    `generations` pins the identity of each hit block; `epoch` and `version` let a reader skip
    re-checking when nothing was removed (epoch) or added (version) since.
    """

    blocks: list[KVBlock] = field(default_factory=list)
    generations: list[int] = field(default_factory=list)
    num_tokens: int = 0
    epoch: int = 0
    version: int = 0
    max_blocks: int = 0  # the cap it was computed under: a longer cap needs a longer walk


class KVManager(ABC):
    """Block tables and the prefix cache of one worker, from the scheduler's side."""

    @property
    @abstractmethod
    def num_blocks_total(self) -> int: ...

    @property
    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @property
    @abstractmethod
    def num_cached_blocks(self) -> int: ...

    @property
    @abstractmethod
    def usage(self) -> float: ...

    @property
    @abstractmethod
    def token_capacity(self) -> int | None:
        """Most tokens one request can ever hold; None when unbounded."""

    @abstractmethod
    def find_cached_prefix(
        self,
        token_ids: Sequence[int],
        chain: Sequence[BlockHash],
        max_blocks: int,
        start: CacheLookup | None = None,
    ) -> CacheLookup:
        """Longest cached prefix of at most max_blocks blocks. `start`, a lookup that
        stale_source() has just vouched for, is continued instead of walked again."""

    @abstractmethod
    def stale_source(self, lookup: CacheLookup) -> str | None:
        """None if the lookup is still true; otherwise why one of its blocks lost its hash."""

    @abstractmethod
    def allocate_for_admission(
        self, request_id: str, hits: list[KVBlock], num_tokens: int
    ) -> list[KVBlock] | None:
        """Atomically pin `hits` and add blocks to hold num_tokens; None (and no change) if
        it cannot fit."""

    @abstractmethod
    def allocate_slots(self, request_id: str, num_tokens: int) -> list[int] | None:
        """Grow a table to hold num_tokens; the new block ids, or None (and no change)."""

    @abstractmethod
    def trim(self, request_id: str, num_tokens: int) -> int:
        """Shrink a table to the blocks that hold num_tokens (speculative decoding: slots
        taken for draft tokens the worker rejected); how many blocks went back."""

    @abstractmethod
    def commit_full_blocks(
        self,
        request_id: str,
        token_ids: Sequence[int],
        chain: Sequence[BlockHash],
        num_full_blocks: int,
        cache: bool = True,
    ) -> list[BlockHashPair]:
        """Cache the blocks that became full; returns them with their hashes (for `written`).
        With `cache=False` the blocks only count as committed: no hash, nothing declared."""

    @abstractmethod
    def free(self, request_id: str) -> None: ...

    @abstractmethod
    def block_ids(self, request_id: str) -> list[int]: ...

    @abstractmethod
    def claimed_pairs(self, request_id: str, num_blocks: int) -> list[BlockHashPair]: ...

    @property
    @abstractmethod
    def num_tables(self) -> int: ...

    @abstractmethod
    def free_orphan_tables(self, running_ids: Container[str]) -> int: ...

    @abstractmethod
    def remove_blocks(self, block_ids: Sequence[int], source: str) -> int: ...

    @abstractmethod
    def clear_cache(self, source: str) -> int: ...

    @abstractmethod
    def reset_prefix_cache(self) -> bool: ...
