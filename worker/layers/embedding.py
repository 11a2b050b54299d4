"""Token embedding and LM head (which may share the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LMHead(nn.Module):
    def __init__(self, dim: int, vocab_size: int, tied_to: Embedding | None = None) -> None:
        super().__init__()
        self.weight = (
            tied_to.weight
            if tied_to is not None
            else nn.Parameter(torch.empty(vocab_size, dim), requires_grad=False)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)
