"""What the quantized-weight tests share: random blocks of each type with their reference
dequantization, and the greedy rule
(tokens may differ only where the reference's two best logits are closer than a tolerance)."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

TYPES = [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1]
# (out, in): out not a multiple of any tile or chunk (64), in a single block and several
SHAPES = [(77, 96), (130, 32), (200, 576)]


def quantized(out: int, inp: int, qtype: GGMLQuantizationType, seed: int = 0):  # noqa: ANN201
    """Random weights as (uint8 blocks, their float32 dequantization by gguf)."""
    weights = np.random.default_rng(seed).standard_normal((out, inp), dtype=np.float32)
    blocks = quantize(weights, qtype)
    return torch.from_numpy(blocks.copy()), torch.from_numpy(dequantize(blocks, qtype).copy())


def greedy_disagreements(ref: torch.Tensor, got: torch.Tensor, tol: float) -> list[int]:
    """Positions where the argmaxes of `got` and `ref` ([T, vocab]) differ although the
    reference's two best logits are at least `tol` apart: each one breaks the rule."""
    top2 = ref.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    differ = ref.argmax(-1) != got.argmax(-1)
    return torch.nonzero(differ & (margin >= tol)).flatten().tolist()
