"""Linear layers without init cost, and packed ones that load several checkpoint tensors.

Parameters are created with `torch.empty`: the loader overwrites every one of them, and
initializing a large model's weights only to discard them costs seconds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedLinear(Linear):
    """Several projections of the same input in one matmul (q/k/v, gate/up).

    `shards` names the row range each checkpoint tensor fills, e.g. {"q": slice(0, 256), ...}.
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias)
        self.shard_sizes = dict(shard_sizes)
        self.shards: dict[str, slice] = {}
        start = 0
        for name, size in shard_sizes.items():
            self.shards[name] = slice(start, start + size)
            start += size

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split(list(self.shard_sizes.values()), dim=-1)
