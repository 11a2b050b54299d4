"""A torch stand-in for the `flash_attn` package: flash-attn 2's documented semantics, slowly.

Written from the docstrings of `flash_attn_varlen_func` and `flash_attn_with_kvcache` (and the
shape checks of `mha_varlen_fwd` / `mha_fwd_kvcache`): paged K/V of
[num_blocks, page_block_size, nheads_k, headdim] gathered through an int32 block table of
[batch, max_blocks]; int32 cu_seqlens; GQA with query head h reading KV head h // (H / Hk);
causal masks aligned to the bottom-right corner, rows with nothing visible output zero; a local
window (left, right) around position i + seqlen_k - seqlen_q. It runs any float dtype (the real
kernels refuse fp32; the adapter's refusal is tested separately). Dropout, softcap, ALiBi,
rotary and in-place cache appends are not implemented: the adapter passes none of them.
"""

from __future__ import annotations

import importlib.machinery
import types

import torch

calls = {"varlen": 0, "kvcache": 0}


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    calls["varlen"] += 1
    _unsupported(
        dropout_p=dropout_p,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        return_attn_probs=return_attn_probs,
    )
    assert q.dim() == 3 and q.dtype == k.dtype == v.dtype
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    batch = cu_seqlens_q.numel() - 1
    assert cu_seqlens_k.numel() == batch + 1
    paged = block_table is not None
    if paged:
        _check_paged(k, v, block_table, batch)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    out = torch.zeros_like(q)
    for b in range(batch):
        seqlen_q, seqlen_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        assert seqlen_q <= max_seqlen_q and seqlen_k <= max_seqlen_k
        if paged:
            keys, values = (_gather(x, block_table[b], seqlen_k) for x in (k, v))
        else:
            keys, values = k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
        out[cu_q[b] : cu_q[b + 1]] = attend(
            q[cu_q[b] : cu_q[b + 1]], keys, values, scale, causal, window_size
        )
    return out


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    calls["kvcache"] += 1
    _unsupported(
        k=k,
        v=v,
        rotary_cos=rotary_cos,
        rotary_sin=rotary_sin,
        cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        return_softmax_lse=return_softmax_lse,
    )
    assert q.dim() == 4 and q.dtype == k_cache.dtype == v_cache.dtype
    batch = q.shape[0]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32)
    assert cache_seqlens is not None and cache_seqlens.dtype == torch.int32
    if block_table is not None:
        _check_paged(k_cache, v_cache, block_table, batch)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros_like(q)
    for b, seqlen_k in enumerate(cache_seqlens.tolist()):
        if block_table is not None:
            keys, values = (_gather(x, block_table[b], seqlen_k) for x in (k_cache, v_cache))
        else:
            keys, values = k_cache[b, :seqlen_k], v_cache[b, :seqlen_k]
        out[b] = attend(q[b], keys, values, scale, causal, window_size)
    return out


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    window_size: tuple[int, int],
) -> torch.Tensor:
    """One sequence: q [sq, H, D], k/v [sk, Hk, D] -> [sq, H, D]."""
    heads, kv_heads = q.shape[1], k.shape[1]
    assert heads % kv_heads == 0
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    visible = visibility(q.shape[0], k.shape[0], causal, window_size)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # nothing visible: zero output
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def visibility(
    seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int]
) -> torch.Tensor:
    """[sq, sk] bool, aligned to the bottom-right corner."""
    i = torch.arange(seqlen_q).view(-1, 1) + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k).view(1, -1)
    left, right = window_size
    if causal:
        right = 0
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    return visible


def _gather(cache: torch.Tensor, table: torch.Tensor, seqlen: int) -> torch.Tensor:
    block_size = cache.shape[1]
    needed = -(-seqlen // block_size)
    assert needed <= table.numel(), "block table too short for the sequence"
    return cache[table[:needed].long()].flatten(0, 1)[:seqlen]


def _check_paged(k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor, batch: int) -> None:
    assert k.dim() == 4 and k.shape == v.shape, "paged K/V: [num_blocks, block, heads, dim]"
    assert block_table.dtype == torch.int32, "block_table must have dtype torch.int32"
    assert block_table.dim() == 2 and block_table.shape[0] == batch
    assert block_table.stride(-1) == 1, "block_table must have contiguous last dimension"
    assert k.stride(-1) == 1 and v.stride(-1) == 1


def _unsupported(**kwargs: object) -> None:
    for name, value in kwargs.items():
        if value is not None and (isinstance(value, torch.Tensor) or value):
            raise NotImplementedError(f"the stand-in does not implement {name}")


def module() -> types.ModuleType:
    mod = types.ModuleType("flash_attn")
    # a spec, so that libraries probing for flash_attn (transformers) see "not installed"
    mod.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    mod.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
    mod.flash_attn_with_kvcache = flash_attn_with_kvcache  # type: ignore[attr-defined]
    return mod
