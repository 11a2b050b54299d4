"""Greedy tokens from a small float32 LM head without computing every logit in float32.

A greedy row needs only the index of its largest logit. `ScreenedArgmax` finds it in two
passes over the head:

1. Screen: every logit approximately, in bfloat16 through oneDNN (a bfloat16 copy of the
   weight: half the bytes of float32, and twice the products per instruction where the CPU has
   AVX512-BF16 or AMX). Each approximate logit `a_j` is within `e_j = SCREEN_BOUND * |x| |w_j|`
   of the float32 logit `l_j` the head would compute (below), so only the tokens with
   `a_j + e_j >= max_i (a_i - e_i)` can hold a row's largest float32 logit: the candidates.
2. Decide: the candidates' sixteen-row tile groups through the same float32 tile kernel, on the
   same rows, that computes the full head (`kvledger_quant::linear_f32_rows16`): the same sums,
   bit for bit (a group's sums do not depend on which other groups a call computes). The
   row's token is the first index of the largest of them, as `argmax` over the full logits.

So the token equals the full float32 head's greedy token, ties included, always; only the work
differs: on tiny-llama's 30522 x 256 head a row has 1-6 candidates (one or two groups), and
the screen costs half the float32 pass or less (docs/performance.md).

The bound. bfloat16 keeps 8 significant bits (unit roundoff u = 2^-8): rounding x and w costs
each product at most (2u + u^2)|x_k w_k|, oneDNN's float32 accumulation at most
K 2^-24 of the sum of |products| (K the hidden size), and the bfloat16 output one more u of
|a_j|; the float32 head's own sum is within K 2^-24 of the exact one. By Cauchy-Schwarz
`sum_k |x_k w_jk| <= |x| |w_j|`. For K up to 2^12 all of it is under 3.1 u |x| |w_j|, and
SCREEN_BOUND = 4u leaves room for the norms' own rounding. oneDNN may flush subnormal inputs
and outputs to zero: each flushed product is under 2^-126 max|w|, covered by an absolute
slack of K 2^-124 max|w| + 2^-124 added to every bound. A hidden size past MAX_IN_FEATURES,
a non-finite row, a logit that could overflow, too many candidates, or more rows than the tiles
take: the caller computes the full logits instead (`None`).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

SCREEN_BOUND = 2.0**-6  # 4u, u = 2^-8 (the module docstring derives it)
MAX_IN_FEATURES = 1 << 12  # where the accumulation terms of the bound stay under 0.1 u
# Past this share of the vocabulary's tile groups among the candidates, the float32 pass over
# the whole head is no dearer than the screen plus the decision: compute all of it.
MAX_CANDIDATE_GROUP_SHARE = 0.25
# float32 overflows at ~3.4e38; |l_j| <= |x| |w_j| (1 + 1e-3), so below this no logit can.
OVERFLOW_GUARD = 1e37
GROUP_ROWS = 16  # vocabulary rows per tile group (worker/csrc/quant/rows16_f32.cpp)


def bf16_linear_available() -> bool:
    """Whether oneDNN multiplies bfloat16 here at full speed (AVX512-BF16 or AMX): without it,
    its bfloat16 path converts to float32 and the screen would cost more than it saves."""
    mkldnn = torch.backends.mkldnn
    return bool(mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class ScreenedArgmax:
    """The greedy token of each row of `x @ W^T`, for a float32 head kept as sixteen-row tiles
    [ceil(V / 16), K, 16] (`worker.layers.linear.f32_tiles`); see the module docstring."""

    def __init__(self, tiles: torch.Tensor, vocab_size: int, max_rows: int) -> None:
        groups, inp, rows = tiles.shape
        if rows != GROUP_ROWS or groups * GROUP_ROWS < vocab_size:
            raise ValueError(f"tiles of shape {tuple(tiles.shape)} do not hold {vocab_size} rows")
        self.tiles = tiles
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        weight = tiles.transpose(1, 2).reshape(groups * GROUP_ROWS, inp)[:vocab_size]
        self.norms = weight.double().norm(dim=1).float()  # [V]: |w_j|
        self.max_norm = float(self.norms.max()) if vocab_size else 0.0
        # subnormals flushed to zero (module docstring); a normal float32, far below any gap
        self.slack = (inp * float(weight.abs().max()) + 1.0) * 2.0**-124
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), None)
        self.max_groups = max(1, int(groups * MAX_CANDIDATE_GROUP_SHARE))
        self.screened_rows = 0  # rows decided by the screen (the tests check that it ran)

    @classmethod
    def for_head(
        cls, tiles: torch.Tensor | None, vocab_size: int, max_rows: int
    ) -> ScreenedArgmax | None:
        """The screen for a head's float32 tiles, or None (saying why) where it cannot run."""
        why = None
        if tiles is None or tiles.dtype != torch.float32:
            why = "the LM head has no float32 tiles"
        elif tiles.shape[1] > MAX_IN_FEATURES:
            why = f"hidden size {tiles.shape[1]} is past {MAX_IN_FEATURES}"
        elif not bf16_linear_available():
            why = "oneDNN has no native bfloat16 here"
        elif not bool(torch.isfinite(tiles).all()):
            why = "the LM head holds non-finite weights"
        if why is not None:
            log.info("greedy LM head screen off: %s", why)
            return None
        try:
            return cls(tiles, vocab_size, max_rows)
        except RuntimeError as err:  # oneDNN refused the bfloat16 weight
            log.info("greedy LM head screen off: %s", err)
            return None

    def __call__(self, x: torch.Tensor) -> list[int] | None:
        """x [R, K] float32 -> each row's greedy token, or None: compute the full logits."""
        rows = x.shape[0]
        if not 0 < rows <= self.max_rows or x.dtype != torch.float32:
            return None
        x = x.contiguous()
        x_norm = x.double().norm(dim=1)
        top = float(x_norm.max())
        if not top * self.max_norm < OVERFLOW_GUARD:  # also catches NaN and inf
            return None
        approx = torch.ops.mkldnn._linear_pointwise(x.bfloat16(), self.packed, None, "none", [], "")
        scale = SCREEN_BOUND * x_norm.float()
        floor, groups = torch.ops.kvledger_quant.screen_groups(
            approx, scale, self.norms, 1.0, self.slack
        )
        if groups.numel() > self.max_groups:
            return None
        exact = torch.ops.kvledger_quant.linear_f32_rows16(
            x, self.tiles.index_select(0, groups), groups.numel() * GROUP_ROWS
        )
        cols = (groups.unsqueeze(1) * GROUP_ROWS + torch.arange(GROUP_ROWS)).flatten()
        inside = cols < self.vocab_size
        near = cols.clamp(max=self.vocab_size - 1)  # padding columns are never candidates
        bound = scale.unsqueeze(1) * self.norms[near] + self.slack
        candidate = (approx[:, near].float() + bound >= floor.unsqueeze(1)) & inside
        scores = exact.masked_fill(~candidate, float("-inf"))
        best = scores.argmax(dim=1)  # the first largest: `cols` ascend
        if not bool(torch.isfinite(scores.gather(1, best.unsqueeze(1))).all()):
            return None
        self.screened_rows += rows
        return cols[best].tolist()


def screen_for(head: object, vocab_size: int, wanted: bool) -> ScreenedArgmax | None:
    """The screen of a model's LM head (`model.lm_head` after `prepare_for_device`) when it is
    wanted (--screened-greedy-head) and the head keeps float32 tiles (a small float32 model on
    an AVX-512 CPU, one rank; tensor-parallel and quantized heads keep none), else None."""
    matmul = getattr(head, "cpu_matmul", None)
    tiles = getattr(matmul, "tiles", None)
    if not wanted or tiles is None or getattr(head, "group", None) is not None:
        return None
    from worker.layers.linear import TILE_MAX_ROWS

    return ScreenedArgmax.for_head(tiles, vocab_size, TILE_MAX_ROWS)
