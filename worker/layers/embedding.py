"""Token embedding and LM head (which may share the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.layers.linear import CpuMatmul, release
from worker.layers.module import Module


class Embedding(Module):
    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LMHead(Module):
    def __init__(self, dim: int, vocab_size: int, tied_to: Embedding | None = None) -> None:
        super().__init__()
        self.weight = (
            tied_to.weight
            if tied_to is not None
            else nn.Parameter(torch.empty(vocab_size, dim), requires_grad=False)
        )
        self.tied = tied_to is not None
        self.cpu_matmul: CpuMatmul | None = None  # set by prepare_for_cpu()

    def prepare_for_cpu(self, both_layouts: bool = False) -> None:
        """The LM head is the one large matmul of a small model's decode step (see
        `CpuMatmul`). A tied head keeps the embedding's weight for lookups: one extra copy."""
        self.cpu_matmul = CpuMatmul(self.weight.data, both_layouts)
        if not self.tied:
            release(self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.cpu_matmul is None:
            return F.linear(hidden, self.weight)
        return self.cpu_matmul(hidden)
