"""KV memory layout and sizing from a byte budget."""

from __future__ import annotations

import pytest
import torch

from worker.runner.kv_cache import KVCache, KVShape

SHAPE = KVShape(num_layers=4, block_size=16, num_kv_heads=2, head_dim=32, dtype=torch.float32)


def test_bytes_per_block_and_budget() -> None:
    assert SHAPE.bytes_per_block() == 2 * 4 * 16 * 2 * 32 * 4
    assert SHAPE.blocks_for_budget(10 * SHAPE.bytes_per_block() + 1) == 10
    half = KVShape(4, 16, 2, 32, torch.bfloat16)
    assert half.blocks_for_budget(10 * SHAPE.bytes_per_block()) == 20
    with pytest.raises(ValueError, match="holds no block"):
        SHAPE.blocks_for_budget(SHAPE.bytes_per_block() - 1)


def test_allocate_per_layer_k_and_v() -> None:
    cache = KVCache.allocate(SHAPE, num_blocks=3, device=torch.device("cpu"))
    assert len(cache.k) == len(cache.v) == 4
    assert all(t.shape == (3, 16, 2, 32) and t.is_contiguous() for t in (*cache.k, *cache.v))
    assert all(not t.any() for t in cache.k)  # zeroed: masked padding never meets NaN garbage
    cache.k[1][2, 3] = 1.0
    assert cache.k[0].sum() == 0 and cache.v[1].sum() == 0  # layers and K/V do not alias


def test_gpu_kv_budget_is_the_utilization_share_minus_used_and_headroom():
    from worker.runner.kv_cache import gpu_kv_budget

    gib = 1 << 30
    # 80 GiB device, 10 GiB in use (weights), 90 %: 72 - 10 - 1 headroom = 61 GiB.
    assert gpu_kv_budget(80 * gib, 70 * gib, 0.9) == int(80 * gib * 0.9) - 10 * gib - gib
    with pytest.raises(ValueError, match="leaves no memory"):
        gpu_kv_budget(16 * gib, 2 * gib, 0.9)
    with pytest.raises(ValueError, match="must be in"):
        gpu_kv_budget(16 * gib, 16 * gib, 1.5)
