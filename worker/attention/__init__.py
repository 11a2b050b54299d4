"""Attention backends behind one interface (`base.AttentionBackend`)."""

from __future__ import annotations

from worker.attention.base import AttentionBackend, AttentionMetadata
from worker.attention.torch_backend import TorchAttention

BACKENDS = ("torch",)


def get_backend(name: str = "torch") -> AttentionBackend:
    if name in ("auto", "torch"):
        return TorchAttention()
    raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})")


__all__ = ["AttentionBackend", "AttentionMetadata", "TorchAttention", "get_backend"]
