"""The attention backend interface and the per-step metadata every backend reads.

A step is a flat varlen batch: the new tokens of all sequences concatenated, each sequence with
`start_pos` tokens already in the KV cache. A backend, for every layer, FIRST writes the new K/V
of the whole batch into their cache slots, THEN lets each query attend over its sequence's
cached context through its block table. That order is what lets a request read, in the same
step, blocks another request writes (docs/design.md, "The ledger": same-step sharing).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    """Built once per step (by `worker.runner.batch`), shared by every layer."""

    slot_mapping: torch.Tensor  # [T] long: flat cache slot (block * block_size + offset) per token
    query_start_loc: torch.Tensor  # [S+1] int32: cumulative query lengths (cu_seqlens_q)
    context_lens: torch.Tensor  # [S] int32: start_pos + query length of each sequence
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with 0 past a sequence's blocks
    query_lens_list: list[int]
    start_pos_list: list[int]
    block_tables_list: list[list[int]]  # each cut to the blocks its context needs
    block_size: int
    sliding_window: int | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_list)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_list, default=0)

    @property
    def max_context_len(self) -> int:
        return max(
            (s + q for s, q in zip(self.start_pos_list, self.query_lens_list, strict=True)),
            default=0,
        )


class AttentionBackend(ABC):
    name: str

    def plan(self, meta: AttentionMetadata) -> Any:
        """Per-step precomputation shared by all layers (masks, index tensors...)."""
        return meta

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: Any,
        scale: float,
    ) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D], caches [num_blocks, block_size, Hkv, D] -> [T, H, D]."""
