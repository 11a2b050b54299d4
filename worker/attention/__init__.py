"""Attention backends behind one interface (`base.AttentionBackend`)."""

from __future__ import annotations

import logging

import torch

from kvledger.config.worker import ATTENTION_BACKENDS
from worker import native
from worker.attention.base import AttentionBackend, AttentionMetadata
from worker.attention.cpu_backend import CpuPagedAttention
from worker.attention.flash_attn_backend import (
    FlashAttention,
    FlashAttnUnsupported,
    check_flash_attn,
)
from worker.attention.torch_backend import TorchAttention

log = logging.getLogger(__name__)

BACKENDS = ATTENTION_BACKENDS  # the names live in the worker's settings (torch-free)


def get_backend(
    name: str = "torch",
    *,
    dtype: torch.dtype = torch.float32,
    block_size: int = 16,
    device: torch.device | None = None,
) -> AttentionBackend:
    """`auto`: flash_attn on a CUDA device where it can run; on CPU the compiled paged kernel
    where it builds; else torch (saying why)."""
    device = device or torch.device("cpu")
    if name == "torch":
        return TorchAttention()
    if name == "cpu":
        return _cpu_backend(device, strict=True)
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
        return _cpu_backend(device, strict=False)
    raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})")


def _cpu_backend(device: torch.device, strict: bool) -> AttentionBackend:
    """The compiled CPU kernel; where it cannot run, an error (`cpu` asked by name) or the
    torch reference with a warning (`auto`)."""
    problem = "it runs on CPU only"
    if device.type == "cpu":
        built = native.load()
        if built.module is not None:
            kernel = built.module
            return CpuPagedAttention(kernel.paged_decode_shared, write=kernel.write_kv)
        problem = built.reason
    if strict:
        raise ValueError(f"attention backend cpu: {problem}")
    log.warning("attention backend auto: %s; using torch", problem)
    return TorchAttention()


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "CpuPagedAttention",
    "FlashAttention",
    "FlashAttnUnsupported",
    "TorchAttention",
    "get_backend",
]
