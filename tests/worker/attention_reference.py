"""Decode attention computed the slow, obvious way: what the compiled kernels are checked
against (tests/worker/test_cpu_attention.py, tests/worker/test_shared_prefix.py,
tests/worker/test_native_avx2.py); and the shared-prefix layout the last two check them on."""

from __future__ import annotations

import torch

from worker.attention.shared_prefix import shared_prefix_groups


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


def shared_prefix_layout(
    heads: int, kv_heads: int, dim: int, bs: int, dtype: torch.dtype, seed: int
) -> tuple[tuple, torch.Tensor, torch.Tensor]:
    """Two groups and two lone sequences over scattered blocks: group A (5 sequences, 6 shared
    blocks, two of them sharing 2 more), group B (2 sequences, 1 shared block, one of them
    with nothing after it), contexts ending anywhere in a block."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 80
    k_cache = torch.randn(num_blocks, bs, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, bs, kv_heads, dim, generator=gen).to(dtype)
    free = iter(torch.randperm(num_blocks, generator=gen).tolist())
    shared_a = [next(free) for _ in range(6)]
    branch = [next(free) for _ in range(2)]
    shared_b = [next(free)]
    tables, lens = [], []
    for extra, own in ((0, 3), (2, 1), (2, 2), (0, 1), (0, 4)):  # group A
        tables.append(shared_a + branch[:extra] + [next(free) for _ in range(own)])
        lens.append((len(tables[-1]) - 1) * bs + 1 + len(tables) * 3 % bs)
    tables.append(shared_b + [next(free)])  # group B
    lens.append(bs + 5)
    tables.append(list(shared_b))  # its context is the shared block alone
    lens.append(bs)
    for own in (3, 7):  # alone
        tables.append([next(free) for _ in range(own)])
        lens.append(own * bs - 2)
    width = max(map(len, tables))
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    groups = shared_prefix_groups(tables, lens, bs)
    assert groups.blocks == [6, 1] and groups.group_of.count(-1) == 2  # the layout it says
    q = torch.randn(len(tables), heads, dim, generator=gen).to(dtype)
    args = (q, k_cache, v_cache, padded, torch.tensor(lens), 0, dim**-0.5)
    return args, torch.tensor(groups.group_of), torch.tensor(groups.blocks)
