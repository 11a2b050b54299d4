"""Decode attention computed the slow, obvious way: what the compiled kernels are checked
against (tests/worker/test_cpu_attention.py, tests/worker/test_native_avx2.py)."""

from __future__ import annotations

import torch


def reference(q, k_cache, v_cache, tables, lens, window, scale) -> torch.Tensor:  # noqa: ANN001
    """Each query against its visible keys, one by one, in float64."""
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q, dtype=torch.float64)
    for i in range(q.shape[0]):
        n = int(lens[i])
        keys = k_cache[tables[i]].flatten(0, 1)[:n].double()  # [n, Hkv, D]
        values = v_cache[tables[i]].flatten(0, 1)[:n].double()
        first = max(0, n - window) if window else 0
        group = q.shape[1] // hkv
        for h in range(q.shape[1]):
            k, v = keys[first:, h // group], values[first:, h // group]
            p = torch.softmax((k @ q[i, h].double()) * scale, dim=0)
            out[i, h] = p @ v
        assert bs * tables.shape[1] >= n
    return out
