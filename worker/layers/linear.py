"""Linear layers without init cost, and packed ones that load several checkpoint tensors.

Parameters are created with `torch.empty`: the loader overwrites every one of them, and
initializing a large model's weights only to discard them costs seconds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def to_input_major(weight: nn.Parameter) -> torch.Tensor:
    """Re-lays a loaded [out, in] weight as contiguous [in, out] storage, in place; returns that
    storage. `weight` stays a valid [out, in] tensor (a transposed view of it), so nothing else
    changes and no memory is added.

    Why: on CPU, `x @ w_t` with w_t contiguous [in, out] runs a matrix-vector product ~3.7x
    faster than `F.linear(x, w)` at one row (tiny-llama's 30522x256 LM head: 0.9 ms against
    3.4 ms on a 2-core AVX-512 EPYC), and is no slower at any batch size measured (1 to 548
    rows). See benchmarks/worker_forward.py.
    """
    transposed = weight.data.t().contiguous()
    weight.data = transposed.t()
    return transposed


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.weight_t: torch.Tensor | None = None  # [in, out], set by prepare_for_cpu()

    def prepare_for_cpu(self) -> None:
        self.weight_t = to_input_major(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_t is None:
            return F.linear(x, self.weight, self.bias)
        out = x @ self.weight_t
        return out if self.bias is None else out + self.bias


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


def prepare_for_device(model: nn.Module, device: torch.device) -> None:
    """After the weights are loaded: on CPU, every layer that has a faster CPU layout takes
    it (`prepare_for_cpu`). CUDA's GEMMs run either layout at the same speed."""
    if device.type != "cpu":
        return
    for module in model.modules():
        prepare = getattr(module, "prepare_for_cpu", None)
        if prepare is not None:
            prepare()
