"""Sampling: each parameter's effect, per request in one batch; seeds; logprobs; NaN rows."""

from __future__ import annotations

import math

import pytest
import torch

from worker.runner.batch import SeqChunk
from worker.sample.penalties import apply_penalties
from worker.sample.sampler import Sampler, filter_logits, position_generator
from worker.sample.sampling_params import SamplingParams

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])


def chunk(pos: int = 10, **kw) -> SeqChunk:
    return SeqChunk("r", [1], pos - 1, [0], True, SamplingParams(**kw))


def tokens(samples) -> list[int]:
    return [s.token_id for s in samples]


def support(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def test_greedy_and_degenerate_settings_pick_the_argmax() -> None:
    sampler = Sampler(0)
    rows = LOGITS.repeat(5, 1)
    chunks = [
        chunk(),
        chunk(temperature=1.0, top_k=1),
        chunk(temperature=1.0, top_p=1e-6),
        chunk(temperature=1e-4, seed=3),
        chunk(temperature=1.0, min_p=0.99),
    ]
    assert tokens(sampler(rows, chunks)) == [5, 5, 5, 5, 5]


def test_filters_per_row_in_one_call() -> None:
    probs = torch.softmax(LOGITS, -1)
    top2 = float(probs[5] + probs[0])
    rows = LOGITS.repeat(5, 1)
    out = filter_logits(
        rows,
        top_k=torch.tensor([2, 0, 0, 0, 3]),
        top_p=torch.tensor([1.0, top2 - 1e-3, 1.0, 1.0, 1.0]),
        min_p=torch.tensor([0.0, 0.0, 0.3, 0.0, 0.0]),
    )
    assert support(out[0]) == {0, 5}  # top-k 2
    assert support(out[1]) == {0, 5}  # top-p just under the two most likely
    # min-p 0.3: keep tokens at least 0.3 times as likely as the best (e^-1 > 0.3 > e^-2)
    assert support(out[2]) == {0, 5}
    assert torch.equal(out[3], LOGITS)  # all off: untouched
    assert support(out[4]) == {0, 1, 5}


def test_top_k_keeps_ties() -> None:
    row = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    out = filter_logits(row, torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert support(out[0]) == {1, 2}
    out = filter_logits(row, torch.tensor([1]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert support(out[0]) == {1, 2}


@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 5e-6])
def test_a_vanishing_temperature_is_greedy(temperature: float) -> None:
    """logits / 1e-40 overflows to inf; the row must still give the argmax, never token 0."""
    rows = torch.tensor([[0.5, 1.0, 3.0, -2.0]]).repeat(3, 1)
    chunks = [chunk(temperature=temperature), chunk(temperature=temperature, seed=7)]
    chunks.append(chunk(temperature=temperature, top_p=0.5))
    assert tokens(Sampler(0)(rows, chunks)) == [2, 2, 2]


def test_temperature_spreads_draws() -> None:
    sampler = Sampler(0)
    draws = tokens(sampler(LOGITS.repeat(200, 1), [chunk(temperature=5.0)] * 200))
    assert len(set(draws)) == 6
    cold = tokens(sampler(LOGITS.repeat(200, 1), [chunk(temperature=0.05)] * 200))
    assert set(cold) == {5}


def test_draws_follow_the_distribution() -> None:
    """The exponential race samples softmax(logits / T): frequencies match within noise."""
    sampler = Sampler(7)
    n = 4000
    draws = torch.tensor(tokens(sampler(LOGITS.repeat(n, 1), [chunk(temperature=1.0)] * n)))
    freq = torch.bincount(draws, minlength=6).float() / n
    assert torch.allclose(freq, torch.softmax(LOGITS, -1), atol=0.03)


def test_min_p_and_top_p_restrict_draws() -> None:
    sampler = Sampler(0)
    rows = LOGITS.repeat(300, 1)
    assert set(tokens(sampler(rows, [chunk(temperature=1.0, min_p=0.3)] * 300))) == {0, 5}
    probs = torch.softmax(LOGITS, -1)
    top_p = float(probs[5] + probs[0]) - 1e-3
    assert set(tokens(sampler(rows, [chunk(temperature=1.0, top_p=top_p)] * 300))) == {0, 5}


def test_seed_depends_on_position_not_on_batch() -> None:
    logits = torch.zeros(1, 1000)  # uniform: the draw is the generator's alone
    alone = tokens(Sampler(1)(logits, [chunk(pos=7, temperature=1.0, seed=42)]))
    noise = torch.randn(3, 1000)
    batched = tokens(
        Sampler(2)(
            torch.cat([noise[:2], logits, noise[2:]]),
            [
                chunk(temperature=1.0),
                chunk(temperature=1.0, seed=5),
                chunk(pos=7, temperature=1.0, seed=42),
                chunk(temperature=1.0, top_k=3),
            ],
        )
    )
    assert batched[2] == alone[0]
    by_position = [
        tokens(Sampler(0)(logits, [chunk(pos=p, temperature=1.0, seed=42)]))[0] for p in range(1, 9)
    ]
    assert len(set(by_position)) > 1
    g1, g2 = position_generator(42, 7), position_generator(42, 7)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))


# ---- penalties ----------------------------------------------------------------------------

PROMPT = [0, 1, 1]
OUTPUT = [5, 5, 2]
HISTORY = PROMPT + OUTPUT


def penalized(**kw) -> SeqChunk:
    return SeqChunk(
        "r",
        [HISTORY[-1]],
        len(HISTORY) - 1,
        [0],
        True,
        SamplingParams(**kw),
        all_token_ids=HISTORY,
        num_prompt_tokens=len(PROMPT),
    )


def test_repetition_penalty_matches_transformers() -> None:
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0, -1.0, 3.0, 0.7]])
    ours = apply_penalties(logits, [penalized(repetition_penalty=1.7)])
    hf = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([HISTORY]), logits.clone())
    torch.testing.assert_close(ours, hf)
    # seen (prompt or output) tokens only: 3, 4 and 6 are untouched
    assert ours[0, [3, 4, 6]].tolist() == logits[0, [3, 4, 6]].tolist()


def test_frequency_and_presence_count_output_tokens_only() -> None:
    logits = torch.zeros(1, 7)
    out = apply_penalties(logits, [penalized(frequency_penalty=0.5, presence_penalty=0.25)])[0]
    assert out[5].item() == -(2 * 0.5 + 0.25)  # twice in the output
    assert out[2].item() == -(0.5 + 0.25)  # once
    assert out[0].item() == out[1].item() == 0.0  # prompt tokens: not penalized
    assert torch.equal(logits, torch.zeros(1, 7)), "the input is not modified"


def test_penalties_are_per_request_in_one_batch() -> None:
    logits = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0, 3.0, 0.0]]).repeat(3, 1)
    chunks = [penalized(presence_penalty=2.5), chunk(), penalized(repetition_penalty=2.0)]
    out = apply_penalties(logits, chunks)
    assert out[0, 5].item() == 0.5 and out[0, 0].item() == 1.0
    assert torch.equal(out[1], logits[1])
    assert out[2, 5].item() == 1.5 and out[2, 0].item() == 0.5 and out[2, 3].item() == 0.0
    # greedy follows the penalized logits: token 5 loses to 0 (first of the ties) under presence
    assert tokens(Sampler(0)(logits, chunks)) == [0, 5, 5]


def test_no_penalty_means_no_copy() -> None:
    logits = torch.randn(2, 7)
    assert apply_penalties(logits, [chunk(), chunk(temperature=0.5)]) is logits


# ---- logprobs, failures ---------------------------------------------------------------------


def test_logprobs_are_raw_and_top_n() -> None:
    logits = torch.stack([LOGITS, LOGITS, LOGITS])
    raw = torch.log_softmax(LOGITS, -1)
    out = Sampler(0)(
        logits,
        [
            chunk(logprobs=3, temperature=0.7, top_k=2, presence_penalty=1.0),
            chunk(),
            chunk(logprobs=0),
        ],
    )
    first = out[0].logprobs
    assert first is not None
    assert math.isclose(first.logprob, raw[out[0].token_id].item(), rel_tol=1e-6)
    assert first.top_ids == [5, 0, 1]
    assert first.top_logprobs == pytest.approx(raw[[5, 0, 1]].tolist())
    assert out[1].logprobs is None
    assert out[2].logprobs is not None and out[2].logprobs.top_ids == []
    assert out[2].logprobs.logprob == pytest.approx(raw[5].item())


def test_nan_or_inf_logits_fail_only_their_row() -> None:
    logits = LOGITS.repeat(4, 1)
    logits[1, 2] = float("nan")
    logits[3, 0] = float("inf")
    out = Sampler(0)(
        logits, [chunk(logprobs=2), chunk(logprobs=2), chunk(temperature=1.0, seed=1), chunk()]
    )
    assert [s.error is not None for s in out] == [False, True, False, True]
    assert "NaN" in (out[1].error or "")
    assert out[0].token_id == 5 and out[0].logprobs is not None
    assert 0 <= out[2].token_id < 6


def test_finite_rows_whose_sum_overflows_still_sample() -> None:
    huge = torch.full((2, 6), 3e38)
    huge[0, 4] = float("-inf")  # -inf is not finite: the row fails
    out = Sampler(0)(huge, [chunk(), chunk()])
    assert out[0].error is not None
    assert out[1].error is None and out[1].token_id == 0


def _filter_by_full_sort(logits, top_k, top_p):  # noqa: ANN001, ANN202 - the old definition
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
    kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


@pytest.mark.parametrize("seed", range(6))
def test_topk_candidates_filter_exactly_like_a_full_sort(seed: int) -> None:
    """filter_logits looks among the best tokens only (topk, not a full-vocabulary sort); it
    must keep exactly the tokens a full sort keeps: peaked and flat rows (a flat top-p row
    needs more than TOP_P_CANDIDATES tokens), ties at the k-th value, rows filtering nothing."""
    gen = torch.Generator().manual_seed(seed)
    vocab = 5000
    logits = (
        torch.randn(8, vocab, generator=gen) * torch.tensor([8, 8, 0.01, 3, 1, 5, 2, 0.5])[:, None]
    )
    logits[3, :40] = logits[3].max() + 1  # 40 tokens tied at the top
    top_k = torch.tensor([0, 5, 0, 20, 3000, 0, 50, 0])
    top_p = torch.tensor([0.9, 1.0, 0.95, 0.5, 0.99, 0.3, 1.0, 1.0 if seed % 2 else 0.8])
    got = filter_logits(logits, top_k, top_p, torch.zeros(8))
    want = _filter_by_full_sort(logits, top_k, top_p)
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    assert torch.equal(got[torch.isfinite(got)], logits[torch.isfinite(want)])
