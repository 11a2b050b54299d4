"""Greedy tokens from a Q8_0 LM head (sixteen-row tiles) without every logit of the exact path.

The exact path's head multiplies float32 rows by the dequantized Q8_0 weight, one FMA per
weight and row: at 16 rows SmolLM2's tied 49152 x 576 head is a sizeable share of a decode
step (docs/performance.md, "Linear layers and the LM head"). A greedy
row needs only the index of its largest logit, so `Int8ScreenedArgmax` finds it in two passes,
as `worker.layers.greedy_head.ScreenedArgmax` does for a float32 head:

1. Screen: every logit approximately, through the int8-activation kernel on the same tiles
   (`linear_int8_rows16`: one `vpdpbusd` holds 64 of the products; worker/csrc/quant/
   rows16_vnni_q8.cpp). Each approximate logit `a_j` is within `e_j = B |w_j|` of the exact
   path's logit `l_j` (below), so only a token with `a_j + e_j >= max_i (a_i - e_i)` can hold
   a row's largest exact logit.
2. Decide: the sixteen-token groups holding such a candidate for any row, through the exact
   kernel on the same rows (`linear_rows16` on those tiles): the very sums the full head
   computes (a group's sums depend neither on the other groups nor, below the GEMM path's 128
   rows, on the batch). A row's token is the first index of the largest of them, so this is
   `argmax` over the full logits, ties included.

The bound. The kernel quantizes each block of 32 activations with d = max|x| / 127 and
round-to-nearest quants, so each activation moves by at most d / 2 (plus the float32
roundings of 127 / max|x|, x times it and d: under 2^-14 of d / 2, which the factor
1 + 2^-10 below covers); with e the row's moves, `|sum_k w_jk e_k| <= |w_j| |e|`
(Cauchy-Schwarz), and |e| <= sqrt(sum over blocks of 32 (d / 2)^2). The int8 sums are
exact; their scaling and the float32 sum over nb blocks cost at most (nb + 2) u of
sum |w x^| <= |w_j| (|x| + |e|), and the exact head's own float32 sum at most K u |w_j| |x|
(u = 2^-24, K the hidden size). So
    B = ((1 + 2^-10) |e|max + (nb + 2) u (|x| + |e|max) + K u |x|) (1 + 2^-10)
with the norms in float64, and B |w_j| taken in float32 from both rounded up; an absolute
slack covers subnormal products. On SmolLM2's chats a row keeps a median of 2 candidate
tokens (at most 23 of 244 rows), 30-60 of the 3072 groups for 16 rows. Fewer rows than
MIN_ROWS, a non-finite row, a logit that could overflow, or too many candidates: the caller
computes the full logits (`None`); after too many candidates the screen stays off for a
number of steps that doubles with each refusal in a row (up to 64), as on a random model's
flat logits it would cost ~half the full head for nothing.

A float32 head (`for_float_head`: a float checkpoint's head kept as float32 tiles,
worker/layers/linear.py) is screened the same way from a Q8_0 copy of its weights made once at
load (~1.06 bytes a weight, against the 2 of the bfloat16 screen's copy), and decided by the
float32 tile kernel on the candidate groups, so the token is the float32 head's. The copy's
own error adds |x| |w_j - wq_j| to each bound: with wq_j the copy's row,
    |a_j - l_j| <= |a_j - x . wq_j| + |x . (wq_j - w_j)| + |x . w_j - l_j|,
the first and last terms as above with max(|w_j|, |wq_j|) for |w_j|, the middle one by
Cauchy-Schwarz, |w_j - wq_j| computed in float64 from the copy itself and rounded up. From one
row to the float32 tiles' 16 (a row streams a quarter of the float32 head's bytes). On
tiny-llama's random head its bound is well under the bfloat16 screen's 2^-6 |x| |w_j| (the
copy's actual error, not a worst case), so fewer candidates a row pass it.
"""

from __future__ import annotations

import logging

import torch

from worker.layers.greedy_head import (
    GROUP_ROWS,
    MAX_CANDIDATE_GROUP_SHARE,
    OVERFLOW_GUARD,
    first_largest,
)
from worker.layers.linear import TILE_MAX_ROWS

log = logging.getLogger(__name__)

Q8_0 = 8  # ggml's type number
# Below this many rows the int8 head saves little (one row streams the same 29 MB either way,
# and in cache it is barely faster on SmolLM2's head) and the decision pass costs more.
MIN_ROWS = 4
MAX_ROWS = 127  # the exact head's tile kernel below the GEMM path (rows16_ops.cpp, kGemmRows)
# A float32 head's rows: up to its tile kernel's (`TILE_MAX_ROWS`), in one chunk, so that the
# decision's sums are those of the full head over the same rows (rows16_f32.cpp tiles rows
# by the call's row count).
FLOAT_MAX_ROWS = TILE_MAX_ROWS
QUANT_SLICE_BYTES = 32 << 20  # of a float32 head, quantized at a time (bounds the load's scratch)
# A block of activations whose largest is below this makes the kernel's 127 / max|x| overflow
# (float32): its quants are then no rounding of the block, and the bound does not hold.
TINY_BLOCK = 1e-36
MAX_Q8_WEIGHT = 65504 * 127 / 2  # a Q8_0 block's float16 scale (max|w| / 127) stays finite
U = 2.0**-24
QUANT_SLACK = 1 + 2.0**-10  # float32 roundings of d and x / d in the kernel's quantization
BOUND_SLACK = 1 + 2.0**-10  # the norms' and the bound's own rounding
ROUND_UP = 1 + 2.0**-20  # a float64 -> float32 conversion, rounded up
MAX_BACK_OFF = 64  # steps
NORM_SLICE = 16  # groups
CHUNK_ROWS = 16  # rows screened together: bounds the screen's scratch


class Int8ScreenedArgmax:
    """The greedy token of each row of `x @ W^T` for a Q8_0 head held as rows16 tiles
    [V / 16, nb * 544] (`QuantizedLinear` with `rows16`); see the module docstring. With
    `exact_tiles` (a float32 head's [V / 16, K, 16] tiles, `worker.layers.linear.f32_tiles`),
    `tiles` are their Q8_0 quantization (`for_float_head`) and those float32 tiles decide."""

    def __init__(
        self,
        tiles: torch.Tensor,
        in_features: int,
        vocab_size: int,
        kernels,  # noqa: ANN001
        exact_tiles: torch.Tensor | None = None,
    ) -> None:
        self.tiles = tiles
        self.in_features = in_features
        self.vocab_size = vocab_size
        self.kernels = kernels
        self.exact_tiles = exact_tiles
        # a float32 head streams four times the screen's bytes: worth it from one row; its
        # tile kernel's sums stay the full head's up to TILE_MAX_ROWS rows
        self.rows = (1, FLOAT_MAX_ROWS) if exact_tiles is not None else (MIN_ROWS, MAX_ROWS)
        groups = tiles.shape[0]
        if not (groups - 1) * GROUP_ROWS < vocab_size <= groups * GROUP_ROWS:
            raise ValueError(f"{groups} tile groups do not hold {vocab_size} rows")
        # |w_j| of every row, padding included, in float64 a slice of 16 groups at a time:
        # slices of 256 (19 MB in float64) left tens of MB more in the worker's resident memory.
        # Each slice's norms go into one tensor allocated before the loop: kept as a list of
        # small tensors, each landed above its slice's freed ~1 MB scratch on glibc's heap and
        # pinned it there (hundreds of MiB resident on SmolLM2's head once glibc's mmap
        # threshold had risen past the scratch's size, which depends on what the process freed
        # before; docs/performance.md, "Memory").
        norms = torch.empty(groups * GROUP_ROWS, dtype=torch.float64)
        residuals = torch.zeros(groups * GROUP_ROWS, dtype=torch.float64)
        largest = 0.0
        for start in range(0, groups, NORM_SLICE):
            stop = min(start + NORM_SLICE, groups)
            rows = torch.arange(start * GROUP_ROWS, stop * GROUP_ROWS)
            w = torch.ops.kvledger_quant.dequantize_rows16(tiles, Q8_0, in_features, rows)
            norm = w.double().norm(dim=1)
            largest = max(largest, float(w.abs().max()))
            if exact_tiles is not None:  # |w_j - wq_j|, and max(|w_j|, |wq_j|) for the rest
                f = exact_tiles[start:stop].transpose(1, 2).reshape(-1, in_features).double()
                residuals[start * GROUP_ROWS : stop * GROUP_ROWS] = (f - w.double()).norm(dim=1)
                norm = torch.maximum(norm, f.norm(dim=1))
                largest = max(largest, float(f.abs().max()))
            norms[start * GROUP_ROWS : stop * GROUP_ROWS] = norm
        self.norms = (norms * ROUND_UP).float()
        # a Q8_0 head is its own exact head: no residual term (`candidate_groups` skips it)
        self.residuals = (
            (residuals * ROUND_UP * BOUND_SLACK).float()
            if exact_tiles is not None
            else torch.zeros(0)
        )
        self.slack = (in_features * largest + 1.0) * 2.0**-120  # subnormal products
        self.max_norm = float(self.norms.max())
        self.max_groups = max(1, int(groups * MAX_CANDIDATE_GROUP_SHARE))
        self.screened_rows = 0  # rows decided by the screen (the tests check that it ran)
        self.refusals = 0  # consecutive steps with too many candidates
        self.skip = 0  # steps still to compute in full before screening again

    def back_off(self) -> None:
        """Too many candidates (flat logits, as a random model's): the screen cost ~half the
        full head for nothing, so the next 1, 2, 4 ... 64 steps compute every logit."""
        self.refusals += 1
        self.skip = min(1 << (self.refusals - 1), MAX_BACK_OFF)

    def row_bounds(self, x: torch.Tensor) -> torch.Tensor | None:
        """B of each row (float64 [R]), or None where a logit could overflow or x is not finite.
        A float32 head adds |x| |w_j - wq_j| to each bound (`bounds`)."""
        terms = self._row_terms(x)
        return None if terms is None else terms[0]

    def _row_terms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(B, |x|) of each row in float64, or None (`row_bounds`)."""
        xd = x.double()
        x_norm = xd.norm(dim=1)
        top = float(x_norm.max())
        if not (top < OVERFLOW_GUARD and top * self.max_norm < OVERFLOW_GUARD):
            return None  # NaN and inf fail too
        amax = xd.view(x.shape[0], -1, 32).abs().amax(dim=2)
        if bool(((amax > 0) & (amax < TINY_BLOCK)).any()):
            return None  # the kernel's scale of such a block overflows (TINY_BLOCK)
        d = amax / 127.0
        e_max = (d.square().sum(dim=1) * 8.0).sqrt() * QUANT_SLACK  # sqrt(sum 32 (d / 2)^2)
        nb = self.in_features // 32
        rounding = (nb + 2) * U * (x_norm + e_max) + self.in_features * U * x_norm
        return (e_max + rounding) * BOUND_SLACK, x_norm

    def __call__(self, x: torch.Tensor) -> list[int] | None:
        """x [R, K] float32 -> each row's greedy token, or None: compute the full logits. Rows
        go CHUNK_ROWS at a time (a chunk's approximate logits are 3 MB on SmolLM2's head;
        the Q8_0 tiles' exact kernel gives a row the same sums in any batch below the GEMM
        path); a float32 head's rows, at most FLOAT_MAX_ROWS = CHUNK_ROWS, go in one."""
        rows = x.shape[0]
        if not self.rows[0] <= rows <= self.rows[1] or x.dtype != torch.float32:
            return None
        if self.skip > 0:  # backing off after refusals (`back_off`)
            self.skip -= 1
            return None
        tokens: list[int] = []
        for chunk in x.contiguous().split(CHUNK_ROWS):
            decided = self.decide(chunk)
            if decided is None:
                return None
            tokens += decided
        self.skip, self.refusals = 0, 0
        self.screened_rows += rows
        return tokens

    def decide(self, x: torch.Tensor) -> list[int] | None:
        """One chunk of rows through the screen and the exact candidates (module docstring)."""
        scales = self.scales(x)
        if scales is None:
            return None
        approx = self.kernels.linear_int8_rows16(x, self.tiles, Q8_0, self.in_features)
        # a group holds a candidate when some row's a + e reaches that row's floor
        groups = torch.ops.kvledger_quant.candidate_groups(
            approx, *scales, self.residuals, self.slack, self.vocab_size
        )
        if not 0 < groups.numel() <= self.max_groups:
            self.back_off()
            return None
        if self.exact_tiles is not None:
            exact = torch.ops.kvledger_quant.linear_f32_rows16(
                x, self.exact_tiles.index_select(0, groups), groups.numel() * GROUP_ROWS
            )
        else:
            exact = self.kernels.linear_rows16(
                x, self.tiles.index_select(0, groups), Q8_0, self.in_features
            )
        return first_largest(exact, groups, self.vocab_size)

    def scales(self, x: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """What `bounds` multiplies per row (float32, rounded up): B, the norms, |x|."""
        terms = self._row_terms(x)
        if terms is None:
            return None
        bounds, x_norm = terms
        return (bounds * ROUND_UP).float(), self.norms, (x_norm * ROUND_UP * BOUND_SLACK).float()

    def bounds(self, x: torch.Tensor) -> torch.Tensor | None:
        """e_j of every row and logit (float32 [R, 16 G]): B |w_j| (`row_bounds`), plus
        |x| |w_j - wq_j| (zero for a Q8_0 head), plus the subnormal slack; what
        `candidate_groups` (worker/csrc/quant/screen_groups.cpp) computes for each logit."""
        scales = self.scales(x)
        if scales is None:
            return None
        scale, norms, x_norm = scales
        err = scale[:, None] * norms[None, :] + self.slack
        if self.residuals.numel():
            err += x_norm[:, None] * self.residuals[None, :]
        return err

    @classmethod
    def for_head(cls, head: object, vocab_size: int) -> Int8ScreenedArgmax | None:
        """The screen of a quantized head (`QuantizedLinear`), or None (saying why) where it
        cannot run: Q8_0 tiles with float activations (the exact path; `gguf-int8` computes
        its int8 logits in full already) on a CPU whose int8 kernel runs Q8_0 tiles."""
        from worker.quant import kernels

        why = None
        if getattr(head, "ggml_type", None) != Q8_0 or not getattr(head, "rows16", False):
            why = "the LM head is not Q8_0 tiles"
        elif head.activations != "float" or head.bias is not None:
            why = "the LM head is not the exact path's"
        elif not kernels.require().q8_vnni_runs():
            why = "this CPU has no AVX-512 VNNI with VBMI"
        elif head.in_features % 32:
            why = "the hidden size is not whole blocks"
        if why is not None:
            log.info("int8 screen of the Q8_0 LM head off: %s", why)
            return None
        return cls(head.blocks, head.in_features, vocab_size, kernels.require())

    @classmethod
    def for_float_head(
        cls, tiles: torch.Tensor, in_features: int, vocab_size: int
    ) -> Int8ScreenedArgmax | None:
        """The int8 screen of a float32 head's tiles [G, K, 16], its weights quantized to Q8_0
        tiles once here (about a quarter of the float32 bytes), or None (saying why) where it
        cannot run."""
        from worker.quant import kernels

        why = None
        if not kernels.require().q8_vnni_runs():
            why = "this CPU has no AVX-512 VNNI with VBMI"
        elif in_features % 32:
            why = "the hidden size is not whole blocks"
        elif not bool(torch.isfinite(tiles).all()):
            why = "the LM head holds non-finite weights"
        elif max(-float(tiles.min()), float(tiles.max())) >= MAX_Q8_WEIGHT:
            why = "the LM head holds weights past Q8_0's float16 scales"
        if why is not None:
            log.info("int8 screen of the float32 LM head off: %s", why)
            return None
        return cls(q8_tiles(tiles, in_features), in_features, vocab_size, kernels.require(), tiles)


def q8_tiles(tiles: torch.Tensor, in_features: int) -> torch.Tensor:
    """Float32 tiles [G, K, 16] as Q8_0 rows16 tiles [G, K / 32 * 544] (gguf's quantizer: a
    block's scale max|w| / 127 in float16, its values rounded), a slice of groups at a time
    into one tensor allocated first (slices kept in a list pin the heap: the note in
    `Int8ScreenedArgmax.__init__`)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    groups = tiles.shape[0]
    out = torch.empty(groups, in_features // 32 * 34 * GROUP_ROWS, dtype=torch.uint8)
    step = max(1, QUANT_SLICE_BYTES // (GROUP_ROWS * in_features * 4))
    for start in range(0, groups, step):
        piece = tiles[start : start + step]
        rows = piece.transpose(1, 2).reshape(-1, in_features).numpy()
        blocks = torch.from_numpy(quantize(rows, GGMLQuantizationType.Q8_0))
        out[start : start + piece.shape[0]] = torch.ops.kvledger_quant.pack_rows16(
            blocks, Q8_0, in_features
        )
    return out
