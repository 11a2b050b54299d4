"""Greedy tokens from a small float32 LM head without computing every logit in float32.

A greedy row needs only the index of its largest logit. `ScreenedArgmax` finds it in two
passes over the head:

1. Screen: every logit approximately, from a bfloat16 copy of the weight and the row rounded
   to bfloat16, summed in float32 by AVX512-BF16's two-product instruction
   (`kvledger_quant::screen_bf16`, worker/csrc/quant/screen.cpp: half the bytes of the
   float32 head, twice the products per instruction). Each approximate logit `a_j` is within
   `e_j = SCREEN_BOUND |x| |w_j|` of the float32 logit `l_j` the head would compute (below), so
   only a token with `a_j + e_j >= max_i (a_i - e_i)` can hold a row's largest float32 logit.
   The screen returns the sixteen-token tile groups that hold such a candidate for any row.
2. Decide: those groups through the same float32 tile kernel, on the same rows, that computes
   the full head (`kvledger_quant::linear_f32_rows16`): the same sums, bit for bit (a group's
   sums do not depend on which other groups a call computes). A row's token is the first index
   of the largest of them. Every token tied at the row's float32 maximum is a candidate, so
   this is `argmax` over the full logits, ties included; the groups' other tokens are smaller
   or equal and change nothing.

On tiny-llama's 30522 x 256 head a row has a handful of candidates; the screen streams 15.6
MB where the float32 head streams 31 MB (docs/performance.md, "Linear layers and the LM head",
has the figures).

The bound. bfloat16 keeps 8 significant bits (unit roundoff u = 2^-8): rounding x and w costs
each product at most (2u + u^2)|x_k w_k| (the products themselves are exact in float32), the
float32 sums at most K 2^-24 of the sum of |products| (K the hidden size), and the float32
head's own sum is within K 2^-24 of the exact one. By Cauchy-Schwarz
`sum_k |x_k w_jk| <= |x| |w_j|`. For K up to MAX_IN_FEATURES (2^12) all of it is under 2.1 u
|x| |w_j|, and SCREEN_BOUND = 4u leaves room for the rounding of the norms and of the bound
itself. The instruction treats subnormal inputs and outputs as zero: each product lost so is
under 2^-126 max|w|, covered by an absolute slack of (K max|w| + 1) 2^-124 on every bound. A
non-finite row, a logit that could overflow, too many candidates, or more rows than the tiles
take: the caller computes the full logits instead (`None`).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

SCREEN_BOUND = 2.0**-6  # 4u, u = 2^-8 (the module docstring derives it)
MAX_IN_FEATURES = 1 << 12  # where the float32 sums' terms of the bound stay under 0.1 u
# Past this share of the vocabulary's groups among the candidates, the float32 pass over the
# whole head costs no more than the screen plus the decision: compute all of it.
MAX_CANDIDATE_GROUP_SHARE = 0.25
# float32 overflows at ~3.4e38; |l_j| <= |x| |w_j| (1 + 1e-3), so below this no logit can.
OVERFLOW_GUARD = 1e37
GROUP_ROWS = 16  # vocabulary rows per tile group (worker/csrc/quant/rows16_f32.cpp)


def screen_runs() -> bool:
    """Whether the screen's kernel runs here: the quantized kernels built, and AVX512-BF16."""
    from worker.quant import kernels  # the extension builds on first use, not at import

    return kernels.load().ok and bool(torch.ops.kvledger_quant.screen_bf16_runs())


def bf16_tiles(tiles: torch.Tensor) -> torch.Tensor:
    """Float32 tiles [G, K, 16] (`f32_tiles`) as the screen's [G, ceil(K / 2), 16, 2] in
    bfloat16: tiles[g][k] holds row 16 g + j's values 2k and 2k + 1 in lane j (a zero pads an
    odd K). Built from the tiles, not a [V, K] copy: loading holds no float32 copy beyond them."""
    groups, inp, _ = tiles.shape
    pairs = -(-inp // 2)
    half = tiles.bfloat16()
    if 2 * pairs != inp:
        half = F.pad(half, (0, 0, 0, 1))
    return half.view(groups, pairs, 2, GROUP_ROWS).transpose(2, 3).contiguous()


class ScreenedArgmax:
    """The greedy token of each row of `x @ W^T`, for a float32 head kept as sixteen-row tiles
    [ceil(V / 16), K, 16] (`worker.layers.linear.f32_tiles`); see the module docstring."""

    def __init__(self, tiles: torch.Tensor, vocab_size: int, max_rows: int) -> None:
        groups, inp, rows = tiles.shape
        if rows != GROUP_ROWS or not (groups - 1) * GROUP_ROWS < vocab_size <= groups * rows:
            raise ValueError(f"tiles of shape {tuple(tiles.shape)} do not hold {vocab_size} rows")
        self.tiles = tiles
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        # |w_j| of each row, padding rows (zeros) included: [16 G], summed in float64 a slice
        # of groups at a time (a float64 copy of the whole head would double the load's peak)
        norms = [piece.double().norm(dim=1) for piece in tiles.split(64)]
        self.norms = torch.cat(norms).flatten().float()
        self.max_norm = float(self.norms.max())
        low, high = tiles.aminmax()
        largest = max(-float(low), float(high))
        self.slack = (inp * largest + 1.0) * 2.0**-124  # subnormals (module docstring)
        self.screen_tiles = bf16_tiles(tiles)
        self.pad = 2 * self.screen_tiles.shape[1] - inp
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
        elif not screen_runs():
            why = "this CPU has no AVX512-BF16"
        elif not bool(torch.isfinite(tiles).all()):
            why = "the LM head holds non-finite weights"
        elif max(-float(tiles.min()), float(tiles.max())) >= OVERFLOW_GUARD:
            why = "the LM head holds weights past bfloat16's range"
        if why is not None:
            log.info("greedy LM head screen off: %s", why)
            return None
        return cls(tiles, vocab_size, max_rows)

    def __call__(self, x: torch.Tensor) -> list[int] | None:
        """x [R, K] float32 -> each row's greedy token, or None: compute the full logits."""
        rows = x.shape[0]
        if not 0 < rows <= self.max_rows or x.dtype != torch.float32:
            return None
        x = x.contiguous()
        x_norm = x.double().norm(dim=1)
        top = float(x_norm.max())
        # no logit can overflow, nor any x_k in bfloat16; NaN and inf fail both
        if not (top < OVERFLOW_GUARD and top * self.max_norm < OVERFLOW_GUARD):
            return None
        pairs = F.pad(x, (0, self.pad)).bfloat16().view(torch.int32)
        scale = (SCREEN_BOUND * x_norm).float()
        groups = torch.ops.kvledger_quant.screen_bf16(
            pairs, self.screen_tiles, scale, self.norms, self.slack, self.vocab_size
        )
        if not 0 < groups.numel() <= self.max_groups:
            return None
        exact = torch.ops.kvledger_quant.linear_f32_rows16(
            x, self.tiles.index_select(0, groups), groups.numel() * GROUP_ROWS
        )
        tokens = first_largest(exact, groups, self.vocab_size)
        if tokens is not None:
            self.screened_rows += rows
        return tokens


def first_largest(exact: torch.Tensor, groups: torch.Tensor, vocab_size: int) -> list[int] | None:
    """Each row's token from the exact logits [R, 16 n] of the candidate `groups` (ascending):
    the first index of the largest, padding rows past the vocabulary excluded; None where a
    row's largest is not finite (the full logits and the sampler decide then)."""
    cols = (groups.unsqueeze(1) * GROUP_ROWS + torch.arange(GROUP_ROWS)).flatten()
    scores = exact.masked_fill(cols >= vocab_size, float("-inf"))  # padding tokens
    best = scores.argmax(dim=1)  # the first largest: `cols` ascend
    if not bool(torch.isfinite(scores.gather(1, best.unsqueeze(1))).all()):
        return None
    return cols[best].tolist()
