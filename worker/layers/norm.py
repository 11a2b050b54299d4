"""RMSNorm as Llama computes it (float32, scaled by the weight in the model dtype); LayerNorm.

On CPU, with the compiled kernels (`worker/native.py`), RMSNorm runs as one call, and the
residual add before it with it (`add`); elsewhere as the torch ops below, which are the
reference the kernels are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.layers.module import Module
from worker.layers.native_ops import UsesNative


class RMSNorm(Module, UsesNative):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return self.native.rms_norm(x, self.weight, self.eps)
        return self.reference(x)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): a block's output joins the residual stream,
        whose new value the next norm reads and the next block's output is added to."""
        if self.native is not None:
            normed, summed = self.native.add_rms_norm(x, residual, self.weight, self.eps)
            return normed, summed
        summed = residual + x
        return self.reference(summed), summed

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # One fused kernel instead of six ops, bit-identical in float32: fewer dispatches,
            # and fewer parallel regions in a prefill, each of which waits for every thread.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        if x.is_cuda and x.dtype == self.weight.dtype:
            # one fused kernel (float32 inside) for the five below: a decode step on a GPU is
            # bound by kernel launches; the weight is applied before the rounding to half,
            # which moves a value by at most one unit of the last place
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class LayerNorm(Module):
    """LayerNorm with weight and bias (BERT), computed in float32 like RMSNorm above."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.layer_norm(
            x.float(), x.shape[-1:], self.weight.float(), self.bias.float(), self.eps
        )
        return out.to(x.dtype)
