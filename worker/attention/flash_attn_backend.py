"""Paged attention with upstream flash-attn 2 (CUDA, fp16/bf16, Ampere or newer).

The KV memory layout is already flash-attn's paged layout: per layer
`[num_blocks, block_size, num_kv_heads, head_dim]`, indexed through an int32 block table
`[num_seqs, max_blocks]`. Per layer the new K/V of the whole batch are written first (as the
torch backend does: docs/design.md, "The ledger"), then:

- a batch of decodes only -> `flash_attn_with_kvcache(q [S, 1, H, D], ..., cache_seqlens,
  block_table)`;
- anything else (prefills, chunks over a cached prefix, mixed) -> one
  `flash_attn_varlen_func(q [T, H, D], k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, ...,
  block_table)`.

Both use `causal=True`, which flash-attn aligns to the bottom right of each sequence's
[query, key] matrix: the last query sees every key, exactly what a chunk over a cached prefix
needs. A sliding window of W keys is `window_size=(W - 1, 0)`.

Upstream refuses fp32, pre-Ampere GPUs and paged blocks whose size is not a multiple of 256;
`check_flash_attn` says so before any memory is taken.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from worker.attention.base import AttentionBackend, AttentionMetadata
from worker.attention.torch_backend import write_kv

MIN_CAPABILITY = (8, 0)
BLOCK_MULTIPLE = 256
DTYPES = (torch.float16, torch.bfloat16)


class FlashAttnUnsupported(ValueError):
    pass


def import_flash_attn() -> ModuleType:
    try:
        return importlib.import_module("flash_attn")
    except ImportError as err:
        raise FlashAttnUnsupported(
            f"the flash_attn backend needs the flash-attn package ({err}); install "
            "`kvledger[cuda]` on a CUDA machine, or use --attention-backend torch"
        ) from err


def device_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def check_flash_attn(dtype: torch.dtype, block_size: int, device: torch.device) -> None:
    """Refuse, with the reason, what upstream flash-attn 2 cannot run."""
    import_flash_attn()
    if device.type != "cuda":
        raise FlashAttnUnsupported(f"the flash_attn backend needs a CUDA device, not {device}")
    capability = device_capability(device)
    if capability < MIN_CAPABILITY:
        raise FlashAttnUnsupported(
            f"flash-attn 2 needs an Ampere or newer GPU (compute capability >= 8.0); this one "
            f"is {capability[0]}.{capability[1]}; use --attention-backend torch"
        )
    if dtype not in DTYPES:
        raise FlashAttnUnsupported(
            f"flash-attn runs float16 and bfloat16 only, not {dtype}; "
            "use --dtype bfloat16 (or --attention-backend torch)"
        )
    if block_size % BLOCK_MULTIPLE:
        raise FlashAttnUnsupported(
            f"upstream flash-attn needs a paged KV block size divisible by {BLOCK_MULTIPLE}, "
            f"got {block_size}; use --block-size 256 (or --attention-backend torch)"
        )


@dataclass
class FlashPlan:
    slot_mapping: torch.Tensor  # [T] long
    cu_seqlens_q: torch.Tensor  # [S+1] int32
    cu_seqlens_k: torch.Tensor  # [S+1] int32
    seqlens_k: torch.Tensor  # [S] int32: context length of each sequence (cache_seqlens)
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor  # [S, max_blocks] int32, contiguous
    window_size: tuple[int, int]
    decode_only: bool


class FlashAttention(AttentionBackend):
    """Checks nothing itself: `get_backend("flash_attn", ...)` runs `check_flash_attn` first.
    Constructing it directly is the seam the CPU tests use with a torch stand-in module."""

    name = "flash_attn"

    def __init__(self) -> None:
        module = import_flash_attn()
        self._varlen = module.flash_attn_varlen_func
        self._with_kvcache = module.flash_attn_with_kvcache

    def plan(self, meta: AttentionMetadata) -> FlashPlan:
        seqlens_k = meta.context_lens.to(torch.int32)
        cu_seqlens_k = torch.zeros(meta.num_seqs + 1, dtype=torch.int32, device=seqlens_k.device)
        cu_seqlens_k[1:] = seqlens_k.cumsum(0)
        window = meta.sliding_window
        return FlashPlan(
            slot_mapping=meta.slot_mapping,
            cu_seqlens_q=meta.query_start_loc.to(torch.int32),
            cu_seqlens_k=cu_seqlens_k,
            seqlens_k=seqlens_k,
            max_seqlen_q=meta.max_query_len,
            max_seqlen_k=meta.max_context_len,
            block_table=meta.block_tables.to(torch.int32).contiguous(),
            window_size=(window - 1, 0) if window is not None else (-1, -1),
            decode_only=meta.max_query_len == 1,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: FlashPlan,
        scale: float,
    ) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, plan.slot_mapping)  # every write before any read
        if plan.decode_only:
            out = self._with_kvcache(
                q.unsqueeze(1),
                k_cache,
                v_cache,
                cache_seqlens=plan.seqlens_k,
                block_table=plan.block_table,
                softmax_scale=scale,
                causal=True,
                window_size=plan.window_size,
            )
            return out.squeeze(1)
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=plan.cu_seqlens_q,
            cu_seqlens_k=plan.cu_seqlens_k,
            max_seqlen_q=plan.max_seqlen_q,
            max_seqlen_k=plan.max_seqlen_k,
            softmax_scale=scale,
            causal=True,
            window_size=plan.window_size,
            block_table=plan.block_table,
        )
