"""Attention within each sequence of a flat varlen batch, without any KV cache.

For passes that keep nothing: BERT-family encoders (bidirectional) and decoder embedding passes
(causal). One SDPA call per sequence, unpadded: on CPU a padded batch needs a mask, and a
masked SDPA falls back to a kernel many times slower than the unmasked per-sequence calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DensePlan:
    bounds: list[tuple[int, int]]  # each sequence's [start, end) rows in the flat batch
    causal: bool
    masks: list[torch.Tensor | None]  # per sequence: a sliding-window mask when it needs one


def dense_plan(
    seq_lens: list[int], causal: bool, device: torch.device, sliding_window: int | None = None
) -> DensePlan:
    bounds: list[tuple[int, int]] = []
    masks: list[torch.Tensor | None] = []
    start = 0
    for n in seq_lens:
        bounds.append((start, start + n))
        start += n
        windowed = causal and sliding_window is not None and n > sliding_window
        masks.append(_window_mask(n, sliding_window, device) if windowed else None)
    return DensePlan(bounds, causal, masks)


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DensePlan, scale: float
) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
    out = torch.empty_like(q)
    for (start, end), mask in zip(plan.bounds, plan.masks, strict=True):
        # [1, heads, n, D]: 4-d inputs keep torch's CPU SDPA on its fast kernel
        seq_q, seq_k, seq_v = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        attended = F.scaled_dot_product_attention(
            seq_q,
            seq_k,
            seq_v,
            attn_mask=mask,
            is_causal=plan.causal and mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = attended[0].transpose(0, 1)
    return out


def seq_positions(seq_lens: list[int], device: torch.device) -> torch.Tensor:
    """0..n-1 for each sequence, concatenated."""
    return torch.cat([torch.arange(n, device=device) for n in seq_lens])


def _window_mask(n: int, window: int, device: torch.device) -> torch.Tensor:
    pos = torch.arange(n, device=device)
    distance = pos.view(-1, 1) - pos.view(1, -1)  # query position - key position
    return (distance >= 0) & (distance < window)
