"""Reference paged attention in plain torch (CPU and CUDA); the backend CI runs.

Per layer: write the batch's new K/V into the cache, then attend. Sequences with several new
tokens (prefills, chunks over a cached prefix) attend one by one over their gathered context;
single-token sequences (decodes) attend together in one padded call. Masks and gather indices
are built once per step in `plan` and reused by every layer.

Contexts are gathered with `index_select` over whole blocks into buffers the step allocates
once and every layer reuses: advanced indexing (`cache[tables]`) copies element by element,
several times slower than whole-block copies (docs/performance.md, "Attention").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from worker.attention.base import AttentionBackend, AttentionMetadata


@dataclass
class PrefillSeq:
    q_start: int
    q_end: int
    context_len: int
    blocks: torch.Tensor  # [num_blocks_of_context] long
    mask: torch.Tensor | None  # [q_len, context_len] bool; None = causal from position 0
    gather: Gather | None = None  # made by the first layer, reused by the others


@dataclass
class DecodeGroup:
    token_idx: torch.Tensor  # [n] long: rows of the flat batch
    block_tables: torch.Tensor  # [n, max_blocks] long
    mask: torch.Tensor  # [n, 1, 1, max_blocks * block_size] bool: key is visible
    gather: Gather | None = None  # made by the first layer, reused by the others


@dataclass
class Gather:
    """Whole blocks of the cache copied out by `index_select` into buffers that every layer of
    the step reuses (each layer overwrites them before it reads them)."""

    blocks: torch.Tensor  # [num_blocks_gathered] long
    keys: torch.Tensor  # [num_blocks_gathered, block_size, Hkv, D]
    values: torch.Tensor

    @classmethod
    def for_cache(cls, blocks: torch.Tensor, cache: torch.Tensor) -> Gather:
        shape = (blocks.numel(), *cache.shape[1:])
        empty = torch.empty(shape, dtype=cache.dtype, device=cache.device)
        return cls(blocks, empty, torch.empty_like(empty))

    def __call__(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The blocks' keys and values in `dtype` (the queries'). A bfloat16 cache under a
        float32 model widens them, exactly, into new tensors each layer: this is the
        reference backend; the compiled kernel widens as it reads, in place."""
        torch.index_select(k_cache, 0, self.blocks, out=self.keys)
        torch.index_select(v_cache, 0, self.blocks, out=self.values)
        return self.keys.to(dtype), self.values.to(dtype)


@dataclass
class TorchPlan:
    slot_mapping: torch.Tensor
    prefills: list[PrefillSeq]
    decode: Any  # DecodeGroup here; each backend's own group (see decode_group)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    heads, dim = k_cache.shape[-2:]
    # a bfloat16 cache under float32 rows (--kv-cache-dtype): rounded to nearest even
    k_cache.view(-1, heads, dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, heads, dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


class TorchAttention(AttentionBackend):
    name = "torch"

    # a step's keys and values into their slots (the CPU backend takes the compiled copy)
    write_kv = staticmethod(write_kv)

    def plan(self, meta: AttentionMetadata) -> TorchPlan:
        device = meta.slot_mapping.device
        prefills: list[PrefillSeq] = []
        row_seqs: list[int] = []  # per row attended on its own: its sequence, row, position
        rows: list[int] = []
        positions: list[int] = []
        q_start = 0
        for i, q_len in enumerate(meta.query_lens_list):
            if q_len == 1 or self.attends_as_rows(meta, i):
                start = meta.start_pos_list[i]
                row_seqs += [i] * q_len
                rows += range(q_start, q_start + q_len)
                positions += range(start, start + q_len)
            else:
                prefills.append(_prefill_seq(meta, i, q_start, device))
            q_start += q_len
        decode = self.decode_group(meta, row_seqs, rows, positions) if rows else None
        return TorchPlan(meta.slot_mapping, prefills, decode)

    def attends_as_rows(self, meta: AttentionMetadata, i: int) -> bool:
        """Whether sequence i's several new tokens go with the decode rows, each a query of
        its own over the keys up to its position, rather than through one SDPA call."""
        return False

    def decode_group(
        self, meta: AttentionMetadata, seqs: list[int], rows: list[int], positions: list[int]
    ) -> Any:
        """What the decode rows of every layer share (built once a step): row `rows[j]` of the
        batch is a query of sequence `seqs[j]` at `positions[j]`."""
        return _decode_group(meta, seqs, rows, positions, meta.slot_mapping.device)

    def attend_decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        group: Any,
        scale: float,
    ) -> torch.Tensor:
        """q [n, H, D]: the decode rows' queries, in the group's order -> their attention."""
        return _attend_decode(q, k_cache, v_cache, group, scale)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: TorchPlan,
        scale: float,
    ) -> torch.Tensor:
        self.write_kv(k, v, k_cache, v_cache, plan.slot_mapping)  # every write before any read
        decode = plan.decode
        if decode is not None and not plan.prefills:  # decode-only: every row, in order
            return self.attend_decode(q, k_cache, v_cache, decode, scale)
        out = torch.empty_like(q)
        for seq in plan.prefills:
            out[seq.q_start : seq.q_end] = _attend_prefill(q, k_cache, v_cache, seq, scale)
        if decode is not None:
            rows = decode.token_idx
            out[rows] = self.attend_decode(q[rows], k_cache, v_cache, decode, scale)
        return out


def _attend_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: PrefillSeq, scale: float
) -> torch.Tensor:
    if seq.gather is None:
        seq.gather = Gather.for_cache(seq.blocks, k_cache)
    k_blocks, v_blocks = seq.gather(k_cache, v_cache, q.dtype)
    # 4-d inputs: with 3-d ones torch's CPU SDPA falls back to its much slower math kernel
    keys = k_blocks.flatten(0, 1)[: seq.context_len].transpose(0, 1).unsqueeze(0)
    values = v_blocks.flatten(0, 1)[: seq.context_len].transpose(0, 1).unsqueeze(0)
    queries = q[seq.q_start : seq.q_end].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, D]
    out = F.scaled_dot_product_attention(
        queries,
        keys,
        values,
        attn_mask=seq.mask,
        is_causal=seq.mask is None,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def _attend_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup, scale: float
) -> torch.Tensor:
    if group.gather is None:
        group.gather = Gather.for_cache(group.block_tables.flatten(), k_cache)
    n, width = group.block_tables.shape
    k_blocks, v_blocks = group.gather(k_cache, v_cache, q.dtype)
    keys = k_blocks.view(n, width * k_cache.shape[1], *k_cache.shape[2:]).transpose(1, 2)
    values = v_blocks.view(n, width * v_cache.shape[1], *v_cache.shape[2:]).transpose(1, 2)
    queries = q.unsqueeze(2)  # [n, H, 1, D]
    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=group.mask, scale=scale, enable_gqa=True
    )
    return out.squeeze(2)


def _prefill_seq(meta: AttentionMetadata, i: int, q_start: int, device: torch.device) -> PrefillSeq:
    start, q_len = meta.start_pos_list[i], meta.query_lens_list[i]
    context_len = start + q_len
    blocks = torch.tensor(meta.block_tables_list[i], dtype=torch.long, device=device)
    mask = None
    if start > 0 or meta.sliding_window is not None:
        q_pos = torch.arange(start, context_len, device=device).unsqueeze(1)
        k_pos = torch.arange(context_len, device=device).unsqueeze(0)
        mask = _visible(q_pos, k_pos, meta.sliding_window)
    return PrefillSeq(q_start, q_start + q_len, context_len, blocks, mask)


def _decode_group(
    meta: AttentionMetadata,
    seqs: list[int],
    rows: list[int],
    positions: list[int],
    device: torch.device,
) -> DecodeGroup:
    width = max(len(meta.block_tables_list[i]) for i in seqs)
    tables = meta.block_tables[seqs, :width].to(torch.long)
    q_pos = torch.tensor(positions, device=device).view(-1, 1)
    k_pos = torch.arange(width * meta.block_size, device=device).view(1, -1)
    mask = _visible(q_pos, k_pos, meta.sliding_window).view(len(seqs), 1, 1, -1)
    token_idx = torch.tensor(rows, dtype=torch.long, device=device)
    return DecodeGroup(token_idx, tables, mask)


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Causal (key at or before the query), and within the sliding window if there is one."""
    visible = k_pos <= q_pos
    if window is not None:
        visible &= q_pos - k_pos < window
    return visible
