"""Attention backends behind one interface (`base.AttentionBackend`)."""

from __future__ import annotations

import logging

import torch

from worker.attention.base import AttentionBackend, AttentionMetadata
from worker.attention.flash_attn_backend import (
    FlashAttention,
    FlashAttnUnsupported,
    check_flash_attn,
)
from worker.attention.torch_backend import TorchAttention

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "flash_attn")


def get_backend(
    name: str = "torch",
    *,
    dtype: torch.dtype = torch.float32,
    block_size: int = 16,
    device: torch.device | None = None,
) -> AttentionBackend:
    """`auto`: flash_attn on a CUDA device where it can run, else torch (saying why)."""
    device = device or torch.device("cpu")
    if name == "torch":
        return TorchAttention()
    if name == "flash_attn":
        check_flash_attn(dtype, block_size, device)
        return FlashAttention()
    if name == "auto":
        if device.type == "cuda":
            try:
                check_flash_attn(dtype, block_size, device)
                return FlashAttention()
            except FlashAttnUnsupported as err:
                log.warning("attention backend auto: %s; using torch", err)
        return TorchAttention()
    raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})")


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "FlashAttention",
    "FlashAttnUnsupported",
    "TorchAttention",
    "get_backend",
]
