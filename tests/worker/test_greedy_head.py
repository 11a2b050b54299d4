"""The screened greedy LM head (`worker/layers/greedy_head.py`): its token is the full float32
head's first largest logit, for random, tied and nearly tied logits, and it hands back to the
full logits whatever it cannot bound; the runner uses it only for plain greedy rows."""

from __future__ import annotations

import pytest
import torch

from worker.layers.greedy_head import ScreenedArgmax, screen_runs
from worker.layers.int8_screen import Int8ScreenedArgmax
from worker.layers.linear import f32_tiles
from worker.quant import kernels
from worker.runner.batch import SeqChunk
from worker.sample.sampler import plain_greedy
from worker.sample.sampling_params import SamplingParams

from .helpers import blocks_for, make_runner, random_tokens


@pytest.fixture
def screens(f32_tiles_kernel: None) -> None:
    if not screen_runs():
        pytest.skip("the screen needs AVX512-BF16")


@pytest.fixture
def any_screen(f32_tiles_kernel: None) -> None:
    if not screen_runs() and not kernels.require().q8_vnni_runs():
        pytest.skip("a float32 head's screens need AVX512-BF16 or AVX-512 VNNI with VBMI")


def full_argmax(x: torch.Tensor, tiles: torch.Tensor, vocab: int) -> list[int]:
    """What the runner's full path picks: the tile kernel's logits, their first largest."""
    return torch.ops.kvledger_quant.linear_f32_rows16(x, tiles, vocab).argmax(dim=1).tolist()


@pytest.fixture(params=["bf16", "int8"])
def either_screen_of(request, f32_tiles_kernel: None):  # noqa: ANN001, ANN201
    """`screen_of` for each screen of a float32 head: this module's bfloat16 one and the int8
    one of a Q8_0 copy (tests/worker/test_int8_float_screen.py has the int8 one's own cases)."""
    if request.param == "bf16":
        if not screen_runs():
            pytest.skip("the screen needs AVX512-BF16")
        return screen_of
    if not kernels.require().q8_vnni_runs():
        pytest.skip("the int8 screen needs AVX-512 VNNI with VBMI")

    def int8_screen_of(w: torch.Tensor) -> tuple[Int8ScreenedArgmax, torch.Tensor]:
        tiles = f32_tiles(w)
        screen = Int8ScreenedArgmax.for_float_head(tiles, w.shape[1], w.shape[0])
        assert screen is not None
        return screen, tiles

    return int8_screen_of


def screen_of(w: torch.Tensor) -> tuple[ScreenedArgmax, torch.Tensor]:
    tiles = f32_tiles(w)
    screen = ScreenedArgmax.for_head(tiles, w.shape[0], 16)
    assert screen is not None
    return screen, tiles


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_random_rows_pick_the_full_heads_token(either_screen_of, scale: float) -> None:  # noqa: ANN001
    gen = torch.Generator().manual_seed(0)
    vocab = 4096 + 7  # a last group of 7 rows: its padding is never a candidate
    w = torch.randn(vocab, 64, generator=gen) * 0.1
    screen, tiles = either_screen_of(w)
    for rows in (1, 3, 4, 16):
        x = torch.randn(rows, 64, generator=gen) * scale
        assert screen(x) == full_argmax(x, tiles, vocab)
    assert screen.screened_rows == 24


def test_exact_ties_take_the_first_index(either_screen_of) -> None:  # noqa: ANN001
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(512, 32, generator=gen) * 0.05
    w[40] = w[300] = w[301] = torch.randn(32, generator=gen)  # three equal rows, two groups
    screen, tiles = either_screen_of(w)
    x = w[40].repeat(2, 1)  # each row's largest logit is at 40, 300 and 301 alike
    assert full_argmax(x, tiles, 512) == [40, 40]
    assert screen(x) == [40, 40]


def test_near_ties_are_decided_in_float32(screens: None) -> None:
    """Two logits closer than bfloat16 can tell apart: the float32 sums decide, as in the
    full head, whichever of the two is larger there."""
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(256, 48, generator=gen) * 0.05
    base = torch.randn(48, generator=gen)
    w[17], w[200] = base, base * (1 + 2**-17)  # the same in bfloat16; 200 larger in float32
    screen, tiles = screen_of(w)
    x = torch.stack([base, -base])  # row 0: 200 wins by a hair; row 1: another token
    expected = full_argmax(x, tiles, 256)
    assert expected[0] == 200
    assert screen(x) == expected


def test_what_it_cannot_bound_goes_to_the_full_logits(screens: None) -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(640, 32, generator=gen)
    screen, _ = screen_of(w)
    x = torch.randn(2, 32, generator=gen)
    assert screen(x.clone().fill_(float("nan"))) is None
    assert screen(torch.where(torch.arange(32) == 3, float("inf"), x)) is None
    assert screen(x * 1e37) is None  # a logit could overflow
    assert screen(torch.cat([x[:1], torch.full((1, 32), 1e38)])) is None  # past bfloat16
    assert screen(torch.randn(17, 32)) is None  # more rows than the tiles take
    flat, _ = screen_of(torch.ones(640, 32))  # every token a candidate: no saving
    assert flat(x) is None
    assert screen.screened_rows == 0 and flat.screened_rows == 0
    no_rows = torch.zeros(0, 16, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="no rows"):
        torch.ops.kvledger_quant.screen_bf16(
            no_rows, screen.screen_tiles, torch.zeros(0), screen.norms, 0.0, 640
        )


def test_a_head_it_cannot_screen_gets_none(screens: None) -> None:
    w = torch.randn(64, 16)
    w[3, 2] = float("nan")
    assert ScreenedArgmax.for_head(f32_tiles(w), 64, 16) is None
    assert ScreenedArgmax.for_head(None, 64, 16) is None
    w[3, 2] = 1e38  # finite in float32, not in bfloat16
    assert ScreenedArgmax.for_head(f32_tiles(w), 64, 16) is None


def test_only_plain_greedy_rows_qualify() -> None:
    def chunk(**kw) -> SeqChunk:  # noqa: ANN003
        return SeqChunk("r", [1], 0, [0], True, SamplingParams(**kw))

    assert plain_greedy(chunk())
    assert plain_greedy(chunk(temperature=1e-6))
    for kw in (
        {"temperature": 0.7},
        {"temperature": 0.7, "top_k": 1},  # draws among tied maxima
        {"logprobs": 0},
        {"repetition_penalty": 1.1},
        {"presence_penalty": 0.5},
        {"logit_bias": {5: 1.0}},
        {"min_tokens": 3, "min_tokens_masked": (2,)},
    ):
        assert not plain_greedy(chunk(**kw)), kw


@torch.inference_mode()
def decode(runner, steps: int, batch: int, **sampling) -> list[list[int]]:  # noqa: ANN001, ANN003
    """Greedy tokens of `batch` sequences through `ModelRunner.execute`, prefill included."""
    params = SamplingParams(**sampling)
    seqs = [random_tokens(40 + 3 * i, runner.vocab_size, seed=i) for i in range(batch)]
    tables = [blocks_for(60 + 3 * i + steps, 16, first=i * 8) for i in range(batch)]
    chunks = [
        SeqChunk(f"s{i}", seq, 0, table, True, params)
        for i, (seq, table) in enumerate(zip(seqs, tables, strict=True))
    ]
    for _ in range(steps):
        for seq, sample in zip(seqs, runner.execute(chunks), strict=True):
            assert sample is not None and sample.error is None
            seq.append(sample.token_id)
        chunks = [
            SeqChunk(c.request_id, seq[-1:], len(seq) - 1, c.block_table, True, params)
            for c, seq in zip(chunks, seqs, strict=True)
        ]
    return seqs


def test_the_runner_screens_greedy_rows_only(any_screen: None, tiny_llama_dir) -> None:  # noqa: ANN001
    screened = make_runner(tiny_llama_dir, num_blocks=8 * 16 + 1, attention_backend="auto")
    full = make_runner(
        tiny_llama_dir, num_blocks=8 * 16 + 1, attention_backend="auto", screened_greedy_head=False
    )
    assert full.greedy_head is None and screened.greedy_head is not None
    # the int8 screen of a Q8_0 copy where the CPU runs it (test_int8_float_screen.py), then
    # this module's bfloat16 screen on the same tiles
    heads = [screened.greedy_head]
    if isinstance(heads[0], Int8ScreenedArgmax):
        if screen_runs():
            heads.append(ScreenedArgmax.for_head(heads[0].exact_tiles, full.vocab_size, 16))
    else:
        assert not kernels.require().q8_vnni_runs()
    for head in heads:
        screened.greedy_head = head
        for batch in (1, 16):
            assert decode(screened, 6, batch) == decode(full, 6, batch)
        assert head.screened_rows == 6 * 17
        with_logprobs = decode(screened, 2, 2, logprobs=1)
        assert with_logprobs == decode(full, 2, 2, logprobs=1)
        assert head.screened_rows == 6 * 17  # logprobs need the full logits
