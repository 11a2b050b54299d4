"""Paged attention on CPU with a compiled decode kernel that reads the cache in place.

Decode rows (one new token per sequence: most rows of a serving step) go to
`csrc/paged_decode.cpp`, which walks each sequence's block table inside the KV cache, so
nothing is gathered: the torch reference copies every decoding sequence's blocks in every
layer (`index_select`, then one padded SDPA call), which at batch 1 cost more in per-op
overhead than the arithmetic and at 16 sequences of ~600 tokens moved ~3 MB per layer.
Prefill rows keep the torch path (SDPA's flash kernel is the better tool for many queries).

The kernel computes in float32 with a block-wise online softmax; it equals the torch backend
to ~1e-6 in float32 (`tests/worker/test_cpu_attention.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from worker.attention.base import AttentionMetadata
from worker.attention.torch_backend import TorchAttention


@dataclass
class KernelDecode:
    token_idx: torch.Tensor  # [n] long: rows of the flat batch
    block_tables: torch.Tensor  # [n, width] long
    context_lens: torch.Tensor  # [n] long: keys each query sees (its position + 1)
    window: int  # sliding window (0: none)


Kernel = Callable[..., torch.Tensor]


class CpuPagedAttention(TorchAttention):
    name = "cpu"

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def decode_group(
        self, meta: AttentionMetadata, seqs: list[int], rows: list[int]
    ) -> KernelDecode:
        width = max(len(meta.block_tables_list[i]) for i in seqs)
        device = meta.slot_mapping.device
        return KernelDecode(
            token_idx=torch.tensor(rows, dtype=torch.long, device=device),
            block_tables=meta.block_tables[seqs, :width].to(torch.long),
            context_lens=torch.tensor(
                [meta.start_pos_list[i] + 1 for i in seqs], dtype=torch.long, device=device
            ),
            window=meta.sliding_window or 0,
        )

    def attend_decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        group: KernelDecode,
        scale: float,
    ) -> torch.Tensor:
        return self.kernel(
            q, k_cache, v_cache, group.block_tables, group.context_lens, group.window, scale
        )
