"""What the quantized-weight tests share: random blocks of each type with their reference
dequantization, and the greedy rule
(tokens may differ only where the reference's two best logits are closer than a tolerance)."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from tests.worker.gguf_files import random_blocks

Q = GGMLQuantizationType
# the types of every kernel (float and int8 activations, rows16 tiles)
TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1]
# the types only the float kernels read: Q5_x, and the K-quants (super-blocks of 256 values)
FLOAT_ONLY_TYPES = [Q.Q5_0, Q.Q5_1]
K_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
# (out, in): out not a multiple of any tile or chunk (64), in a single block and several
SHAPES = [(77, 96), (130, 32), (200, 576)]
K_SHAPES = [(77, 256), (130, 768)]


def quantized(out: int, inp: int, qtype: GGMLQuantizationType, seed: int = 0):  # noqa: ANN201
    """Random weights as (uint8 blocks, their float32 dequantization by gguf). The K-quants,
    which gguf only dequantizes, are random blocks with small finite scales."""
    if qtype in K_TYPES:
        blocks = random_blocks(out, inp, qtype, seed)
    else:
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


def int8_rule(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x's activations as the rule quantizes and dequantizes them, each block's scale d),
    in float32 arithmetic as the kernels compute them."""
    rows, inp = x.shape
    xb = x.numpy().reshape(rows, inp // 32, 32)
    amax = np.abs(xb).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(xb * inv)  # numpy's rint rounds ties to even
    d = (amax * np.float32(1 / 127)).astype(np.float32)
    return torch.from_numpy((q * d).reshape(rows, inp)), torch.from_numpy(d[..., 0])


def int8_activations(rows: int, inp: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inp, generator=gen)
    x[0, :32] = 0  # an all-zero block: scale 0, values 0
    x[-1, -1] = 40.0  # an outlier, as real hidden states have: its block's step is large
    return x
