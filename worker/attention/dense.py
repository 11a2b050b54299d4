"""Attention within each sequence of a flat varlen batch, without any KV cache.

For passes that keep nothing: BERT-family encoders (bidirectional) and decoder embedding passes
(causal). The flat [T] rows are scattered into a padded [S, L] layout so that one SDPA call per
layer serves the whole batch; padded keys are masked and padded queries are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DensePlan:
    rows: torch.Tensor  # [T] long: each flat row's place in the padded [S * L] layout
    num_seqs: int
    max_len: int
    mask: torch.Tensor | None  # [S, 1, L or 1, L] bool (True = visible); None = no padding
    causal: bool


def dense_plan(seq_lens: list[int], causal: bool, device: torch.device,
               sliding_window: int | None = None) -> DensePlan:
    num_seqs, max_len = len(seq_lens), max(seq_lens)
    lens = torch.tensor(seq_lens, device=device)
    starts = torch.arange(num_seqs, device=device) * max_len
    rows = torch.repeat_interleave(starts, lens) + seq_positions(seq_lens, device)
    windowed = causal and sliding_window is not None and max_len > sliding_window
    if min(seq_lens) == max_len and not windowed:
        return DensePlan(rows, num_seqs, max_len, None, causal)
    pos = torch.arange(max_len, device=device)
    mask = (pos.view(1, -1) < lens.view(-1, 1)).view(num_seqs, 1, 1, max_len)
    if causal:
        q_pos, k_pos = pos.view(-1, 1), pos.view(1, -1)
        visible = k_pos <= q_pos
        if windowed:
            visible &= q_pos - k_pos < sliding_window
        mask = mask & visible  # [S, 1, L, L]
    return DensePlan(rows, num_seqs, max_len, mask, causal)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DensePlan,
                    scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
    padded = [_pad(x, plan) for x in (q, k, v)]  # each [S, heads, L, D]
    out = F.scaled_dot_product_attention(
        *padded, attn_mask=plan.mask, is_causal=plan.causal and plan.mask is None,
        scale=scale, enable_gqa=True)
    return out.transpose(1, 2).flatten(0, 1)[plan.rows]


def _pad(x: torch.Tensor, plan: DensePlan) -> torch.Tensor:
    padded = x.new_zeros(plan.num_seqs * plan.max_len, *x.shape[1:])
    padded[plan.rows] = x
    return padded.view(plan.num_seqs, plan.max_len, *x.shape[1:]).transpose(1, 2)


def seq_positions(seq_lens: list[int], device: torch.device) -> torch.Tensor:
    """0..n-1 for each sequence, concatenated."""
    return torch.cat([torch.arange(n, device=device) for n in seq_lens])
