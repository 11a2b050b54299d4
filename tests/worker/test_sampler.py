"""Sampling: greedy, temperature, top-k, top-p, and seeds derived per position."""

from __future__ import annotations

import torch

from worker.batch import SeqChunk
from worker.sampler import Sampler, filtered_probs, position_generator

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])


def chunk(pos: int = 10, **kw) -> SeqChunk:
    return SeqChunk("r", [1], pos - 1, [0], True, **kw)


def test_greedy_and_degenerate_settings_pick_the_argmax() -> None:
    sampler = Sampler(0)
    rows = LOGITS.repeat(4, 1)
    chunks = [chunk(), chunk(temperature=1.0, top_k=1), chunk(temperature=1.0, top_p=1e-6),
              chunk(temperature=1e-4, seed=3)]
    assert sampler(rows, chunks) == [5, 5, 5, 5]


def test_top_k_and_top_p_cut_the_support() -> None:
    assert set(filtered_probs(LOGITS, 1.0, 2, 1.0).nonzero().flatten().tolist()) == {0, 5}
    probs = torch.softmax(LOGITS, -1)
    top2 = float(probs[5] + probs[0])
    kept = filtered_probs(LOGITS, 1.0, 0, top2 - 1e-3).nonzero().flatten().tolist()
    assert set(kept) == {0, 5}
    assert torch.allclose(filtered_probs(LOGITS, 1.0, 0, 1.0), probs)


def test_temperature_spreads_draws() -> None:
    sampler = Sampler(0)
    draws = sampler(LOGITS.repeat(200, 1), [chunk(temperature=5.0)] * 200)
    assert len(set(draws)) == 6
    cold = sampler(LOGITS.repeat(200, 1), [chunk(temperature=0.05)] * 200)
    assert set(cold) == {5}


def test_seed_depends_on_position_not_on_batch() -> None:
    logits = torch.zeros(1, 1000)  # uniform: the draw is the generator's alone
    alone = Sampler(1)(logits, [chunk(pos=7, temperature=1.0, seed=42)])
    noise = torch.randn(3, 1000)
    batched = Sampler(2)(torch.cat([noise[:2], logits, noise[2:]]),
                         [chunk(temperature=1.0), chunk(temperature=1.0, seed=5),
                          chunk(pos=7, temperature=1.0, seed=42), chunk(temperature=1.0)])
    assert batched[2] == alone[0]
    by_position = [Sampler(0)(logits, [chunk(pos=p, temperature=1.0, seed=42)])[0]
                   for p in range(1, 9)]
    assert len(set(by_position)) > 1
    g1, g2 = position_generator(42, 7), position_generator(42, 7)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))
