"""The int8 screen of a float32 LM head (`Int8ScreenedArgmax.for_float_head`,
worker/layers/int8_screen.py): every float32 logit lies within its bound (the Q8_0 copy's own
error added), its token is the float32 tile kernel's first largest logit for nearly tied logits
(random and tied ones: tests/worker/test_greedy_head.py, for both screens), and what it cannot
bound goes back to the full logits."""

from __future__ import annotations

import pytest
import torch

from tests.worker.quant_helpers import int8_activations
from worker.layers.int8_screen import Q8_0, Int8ScreenedArgmax
from worker.layers.linear import f32_tiles
from worker.quant import kernels


@pytest.fixture
def screens(f32_tiles_kernel: None) -> None:
    if not kernels.require().q8_vnni_runs():
        pytest.skip("the int8 screen needs AVX-512 VNNI with VBMI")


def full_logits(x: torch.Tensor, tiles: torch.Tensor, vocab: int) -> torch.Tensor:
    """What the runner's full path computes: the float32 tile kernel's logits."""
    return torch.ops.kvledger_quant.linear_f32_rows16(x, tiles, vocab)


def full_argmax(x: torch.Tensor, tiles: torch.Tensor, vocab: int) -> list[int]:
    return full_logits(x, tiles, vocab).argmax(dim=1).tolist()


def screen_of(w: torch.Tensor) -> tuple[Int8ScreenedArgmax, torch.Tensor]:
    tiles = f32_tiles(w)
    screen = Int8ScreenedArgmax.for_float_head(tiles, w.shape[1], w.shape[0])
    assert screen is not None
    return screen, tiles


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_every_float_logit_lies_within_the_bound(screens: None, scale: float) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 1024 + 7  # a last group of 7 rows
    w = torch.randn(vocab, 96, generator=gen) * 0.05
    w[5] *= 40  # a row far larger than the rest: its blocks' steps are large
    screen, tiles = screen_of(w)
    for rows in (1, 4, 16):
        x = int8_activations(rows, 96, rows) * scale  # a zero block and an outlier
        approx = kernels.require().linear_int8_rows16(x, screen.tiles, Q8_0, 96)[:, :vocab]
        err = screen.bounds(x)[:, :vocab]
        assert ((approx - full_logits(x, tiles, vocab)).abs() <= err).all(), rows
        # and the bound is no wider than the Q8_0 copy's error needs: a few candidates a row
        floor = (approx - err).amax(dim=1, keepdim=True)
        assert ((approx + err) >= floor).sum(dim=1).max() < vocab // 8


def test_the_bound_covers_the_q8_copys_own_error(screens: None) -> None:
    """Rows of +-1 quantize exactly, so the screen's error is all the Q8_0 copy's: with x the
    sign of w_j - wq_j it is |w_j - wq_j|_1, which only the |x| |w_j - wq_j| term covers."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(256, 128, generator=gen) * 0.05
    screen, tiles = screen_of(w)
    copy = torch.ops.kvledger_quant.dequantize_rows16(screen.tiles, Q8_0, 128, torch.arange(256))
    rows = torch.tensor([3, 100, 255])
    x = torch.sign(w[rows] - copy[rows])
    approx = kernels.require().linear_int8_rows16(x, screen.tiles, Q8_0, 128)
    gap = (approx - full_logits(x, tiles, 256)).abs()
    own = gap[torch.arange(3), rows]
    assert (gap <= screen.bounds(x)).all()
    without = screen.row_bounds(x).float() * screen.norms[rows] + screen.slack
    assert (own > without).all(), "the Q8_0 copy's error is what the bound must cover here"


def reference_groups(screen: Int8ScreenedArgmax, x: torch.Tensor, vocab: int) -> list[int]:
    """The candidate groups by the rule, in torch: some row's a + e reaches its floor."""
    approx = kernels.require().linear_int8_rows16(x, screen.tiles, Q8_0, x.shape[1])[:, :vocab]
    err = screen.bounds(x)[:, :vocab]
    floor = (approx - err).amax(dim=1, keepdim=True)
    reach = torch.full((x.shape[0], screen.tiles.shape[0] * 16), float("-inf"))
    reach[:, :vocab] = approx + err - floor
    return (reach.amax(dim=0).view(-1, 16).amax(dim=1) >= 0).nonzero().flatten().tolist()


def test_the_compiled_candidate_groups_follow_the_rule(screens: None) -> None:
    """`candidate_groups` (worker/csrc/quant/screen_groups.cpp) against the rule in torch, with
    the Q8_0 copy's residual term (a float32 head) and without (a Q8_0 head), padding included."""
    gen = torch.Generator().manual_seed(6)
    vocab = 2048 + 9
    w = torch.randn(vocab, 64, generator=gen) * 0.05
    w[100:400] = w[100]  # a run of equal rows: many candidates in many groups
    screen, _ = screen_of(w)
    q8_head = Int8ScreenedArgmax(screen.tiles, 64, vocab, kernels.require())
    for head in (screen, q8_head):
        for rows in (1, 5, 16):
            x = torch.randn(rows, 64, generator=gen)
            x[0] = w[100] * 3  # the run's tokens lead row 0
            approx = kernels.require().linear_int8_rows16(x, head.tiles, Q8_0, 64)
            groups = torch.ops.kvledger_quant.candidate_groups(
                approx, *head.scales(x), head.residuals, head.slack, vocab
            )
            assert groups.tolist() == reference_groups(head, x, vocab)
            assert groups.numel() >= 19  # the run's groups at least


def test_padding_tokens_are_never_candidates(screens: None) -> None:
    """Every real logit negative: the padding rows' zero logits would lead every row if the
    masks let them in (a vocabulary of 645: 40 groups and 5 tokens of a 41st)."""
    gen = torch.Generator().manual_seed(7)
    vocab = 645
    w = torch.rand(vocab, 64, generator=gen) + 0.1
    w[100] *= 0.1  # the least negative logit of every row
    w[643] *= 0.2  # and a runner-up in the partial group
    screen, tiles = screen_of(w)
    x = -torch.rand(4, 64, generator=gen) - 0.1
    approx = kernels.require().linear_int8_rows16(x, screen.tiles, Q8_0, 64)
    groups = torch.ops.kvledger_quant.candidate_groups(
        approx, *screen.scales(x), screen.residuals, screen.slack, vocab
    )
    assert groups.tolist() == reference_groups(screen, x, vocab) == [6]
    assert screen(x) == full_argmax(x, tiles, vocab) == [100] * 4


def test_near_ties_are_decided_in_float32(screens: None) -> None:
    """Two rows with the same Q8_0 blocks: the screen cannot tell them apart, the float32
    sums decide, as in the full head."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(256, 64, generator=gen) * 0.05
    base = torch.randn(64, generator=gen)
    w[17], w[200] = base, base * (1 + 2**-17)
    screen, tiles = screen_of(w)
    copy = torch.ops.kvledger_quant.dequantize_rows16(
        screen.tiles, Q8_0, 64, torch.tensor([17, 200])
    )
    assert torch.equal(copy[0], copy[1])  # the same in the screen's Q8_0 copy
    x = torch.stack([base, -base])
    expected = full_argmax(x, tiles, 256)
    assert expected[0] == 200
    assert screen(x) == expected


def test_what_it_cannot_bound_goes_to_the_full_logits(screens: None) -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(640, 32, generator=gen)
    screen, _ = screen_of(w)
    x = torch.randn(2, 32, generator=gen)
    assert screen(x.clone().fill_(float("nan"))) is None
    assert screen(torch.where(torch.arange(32) == 3, float("inf"), x)) is None
    assert screen(x * 1e37) is None  # a logit could overflow
    assert screen(torch.randn(17, 32)) is None  # more rows than the float32 tiles take
    tiny = x.clone()
    tiny[1] = 3.7e-37  # 127 / max|x| overflows in the kernel: its quants are no rounding
    assert screen(tiny) is None
    flat, _ = screen_of(torch.ones(640, 32))  # every token a candidate: no saving
    assert flat(x) is None and flat.skip == 1  # and it backs off
    assert screen.screened_rows == 0 and flat.screened_rows == 0


def test_a_head_it_cannot_screen_gets_none(screens: None) -> None:
    w = torch.randn(64, 64)
    w[3, 2] = float("nan")
    assert Int8ScreenedArgmax.for_float_head(f32_tiles(w), 64, 64) is None
    w[3, 2] = 1e38
    assert Int8ScreenedArgmax.for_float_head(f32_tiles(w), 64, 64) is None
    w[3, 2] = 9e6  # a Q8_0 block's float16 scale would overflow
    assert Int8ScreenedArgmax.for_float_head(f32_tiles(w), 64, 64) is None
    assert Int8ScreenedArgmax.for_float_head(f32_tiles(torch.randn(64, 48)), 48, 64) is None
