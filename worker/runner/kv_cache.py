"""Paged KV memory: per layer K and V of [num_blocks, block_size, num_kv_heads, head_dim].

The scheduler owns which block holds what; the worker only owns the memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVShape:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_block(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * itemsize

    def blocks_for_budget(self, budget_bytes: int) -> int:
        num_blocks = budget_bytes // self.bytes_per_block()
        if num_blocks < 1:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no block of "
                f"{self.bytes_per_block()} bytes"
            )
        return num_blocks


@dataclass
class KVCache:
    k: list[torch.Tensor]  # per layer [num_blocks, block_size, num_kv_heads, head_dim]
    v: list[torch.Tensor]
    num_blocks: int
    block_size: int

    @classmethod
    def allocate(cls, shape: KVShape, num_blocks: int, device: torch.device) -> KVCache:
        # Zeroed, not empty: padded reads are masked, but 0 * NaN from garbage memory is NaN.
        data = torch.zeros(
            2,
            shape.num_layers,
            num_blocks,
            shape.block_size,
            shape.num_kv_heads,
            shape.head_dim,
            dtype=shape.dtype,
            device=device,
        )
        return cls(
            k=list(data[0].unbind(0)),
            v=list(data[1].unbind(0)),
            num_blocks=num_blocks,
            block_size=shape.block_size,
        )

    def clear(self) -> None:
        for tensor in (*self.k, *self.v):
            tensor.zero_()
