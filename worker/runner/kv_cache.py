"""Paged KV memory: per layer K and V of [num_blocks, block_size, num_kv_heads, head_dim], and
how many blocks a worker keeps (a number given, a byte budget, or on CUDA what the weights left
of the utilization share).

The scheduler owns which block holds what; the worker only owns the memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvledger.config.worker import KV_CACHE_DTYPES
from worker.runner.heap import release_free_heap


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


def kv_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The cache's dtype for --kv-cache-dtype `name` under a model of `dtype`: auto is the
    model's. A bfloat16 cache under a float32 model runs on CPU only (the compiled kernel
    widens its rows as it loads them; the torch backend widens its gathered copy): on CUDA,
    flash-attn reads the cache in the queries' dtype."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"unsupported KV cache dtype {name!r} ({', '.join(KV_CACHE_DTYPES)})")
    chosen = dtype if name == "auto" else getattr(torch, name)
    if chosen == dtype:
        return chosen
    if chosen == torch.bfloat16 and dtype == torch.float32 and device.type == "cpu":
        return chosen
    raise ValueError(
        f"--kv-cache-dtype {name} needs a float32 model on CPU (here {dtype} on "
        f"{device.type}); a model's own dtype is always a valid cache dtype (auto)"
    )


# Room kept for activations and the allocator's slack; not profiled (nothing here has run on a
# GPU): a forward pass's peak grows with max_num_batched_tokens.
GPU_ACTIVATION_HEADROOM_BYTES = 1 << 30


def gpu_kv_budget(
    total: int, free: int, utilization: float, headroom: int = GPU_ACTIVATION_HEADROOM_BYTES
) -> int:
    """Bytes for the KV cache: the utilization share of the device minus what is already used
    (weights, other processes) and the activation headroom."""
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    budget = int(total * utilization) - (total - free) - headroom
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization {utilization} leaves no memory for the KV "
            f"cache: {(total - free) / 2**30:.1f} GiB of {total / 2**30:.1f} GiB "
            "are already in use"
        )
    return budget


def num_blocks_for(num_blocks: int | None, budget: int | None, shape: KVShape) -> int:
    """The pool's size: the number given, else what the byte budget holds."""
    if num_blocks is not None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        return num_blocks
    if budget is None:
        raise ValueError("give num_blocks or kv_cache_memory_bytes to size the KV cache")
    return shape.blocks_for_budget(budget)


@dataclass
class KVCache:
    k: list[torch.Tensor]  # per layer [num_blocks, block_size, num_kv_heads, head_dim]
    v: list[torch.Tensor]
    num_blocks: int
    block_size: int

    @classmethod
    def allocate(cls, shape: KVShape, num_blocks: int, device: torch.device) -> KVCache:
        # Loading the weights left freed scratch on the C heap: back to the OS before the pool
        # stacks on top of it (worker/runner/heap.py).
        release_free_heap()
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
