"""Paged attention over the KV cache equals a single full prefill, however the work is split.

Covers cached prefixes at any split point, chunked prefill, mixed prefill+decode batches, and
same-step sharing: a request reading blocks another request writes in the same step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.helpers import blocks_for, full_logits, logits_for, make_runner, random_tokens
from worker.attention.torch_backend import TorchAttention, TorchPlan, write_kv
from worker.runner.batch import SeqChunk
from worker.runner.model_runner import ModelRunner

BS = 16
ATOL = 1e-5


@pytest.fixture(scope="module")
def llama(hf_checkpoint) -> Path:
    return hf_checkpoint("llama")


@pytest.fixture
def runner(llama: Path) -> ModelRunner:
    return make_runner(llama, num_blocks=48, block_size=BS)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("split", [1, 7, 15, 16, 17, 32, 40, 47])
def test_prefill_over_cached_prefix_equals_full_prefill(runner: ModelRunner, split: int) -> None:
    tokens = random_tokens(48, 256, seed=10)
    expected = full_logits(runner, tokens, first_block=10)
    table = blocks_for(len(tokens), BS)
    runner.execute([SeqChunk("a", tokens[:split], 0, table, False)])
    rest = logits_for(runner, [SeqChunk("a", tokens[split:], split, table, True)], all_tokens=True)
    close(rest, expected[split:])


def test_prefix_cache_hit_from_another_request(runner: ModelRunner) -> None:
    """Request b reuses a's two full blocks (as the scheduler's prefix cache would)."""
    prompt_a = random_tokens(40, 256, seed=11)
    prompt_b = prompt_a[:32] + random_tokens(13, 256, seed=12)
    runner.execute([SeqChunk("a", prompt_a, 0, [0, 1, 2], True)])
    table_b = [0, 1, 5, 6]
    got = logits_for(runner, [SeqChunk("b", prompt_b[32:], 32, table_b, True)], all_tokens=True)
    close(got, full_logits(runner, prompt_b, first_block=20)[32:])


def test_chunked_prefill_in_several_pieces(runner: ModelRunner) -> None:
    tokens = random_tokens(50, 256, seed=13)
    expected = full_logits(runner, tokens, first_block=20)
    table = [7, 3, 11, 5]  # block ids need not be ordered or contiguous
    start = 0
    for size in (5, 11, 16, 1, 17):
        got = logits_for(
            runner,
            [SeqChunk("a", tokens[start : start + size], start, table, True)],
            all_tokens=True,
        )
        close(got, expected[start : start + size])
        start += size


def test_mixed_batch_equals_running_apart(llama: Path) -> None:
    """A fresh prefill, a chunk over a cached prefix and two decodes of different lengths."""
    prompts = {
        name: random_tokens(n, 256, seed=20 + i)
        for i, (name, n) in enumerate([("p", 20), ("c", 45), ("d1", 30), ("d2", 3)])
    }
    tables = {"p": [0, 1], "c": [2, 3, 4], "d1": [5, 6], "d2": [7]}
    prior = {"c": 29, "d1": 29, "d2": 2}  # tokens already computed in an earlier step

    def chunk(name: str) -> SeqChunk:
        start = prior.get(name, 0)
        return SeqChunk(name, prompts[name][start:], start, tables[name], True)

    def fill_prior(runner: ModelRunner) -> None:
        runner.execute([SeqChunk(n, prompts[n][:k], 0, tables[n], False) for n, k in prior.items()])

    together = make_runner(llama, num_blocks=8, block_size=BS)
    fill_prior(together)
    mixed = logits_for(together, [chunk(n) for n in ("d1", "p", "c", "d2")])

    apart = make_runner(llama, num_blocks=8, block_size=BS)
    fill_prior(apart)
    alone = torch.cat([logits_for(apart, [chunk(n)]) for n in ("d1", "p", "c", "d2")])
    close(mixed, alone)


def _shared_step(runner: ModelRunner) -> tuple[SeqChunk, SeqChunk]:
    """a writes blocks 0 and 1; b, in the same step, claims them as its cached prefix."""
    prompt_a = random_tokens(40, 256, seed=30)
    prompt_b = prompt_a[:32] + random_tokens(10, 256, seed=31)
    a = SeqChunk("a", prompt_a, 0, [0, 1, 2], True)
    b = SeqChunk("b", prompt_b[32:], 32, [0, 1, 3], True)
    return a, b


def test_same_step_sharing_equals_one_after_another(llama: Path) -> None:
    one_step = make_runner(llama, num_blocks=8, block_size=BS)
    a, b = _shared_step(one_step)
    together = logits_for(one_step, [a, b])

    two_steps = make_runner(llama, num_blocks=8, block_size=BS)
    first = logits_for(two_steps, [a])
    second = logits_for(two_steps, [b])
    close(together, torch.cat([first, second]))


class ReadBeforeWrite(TorchAttention):
    """The order this project forbids: attend first, write the new K/V afterwards."""

    def forward(self, q, k, v, k_cache, v_cache, plan: TorchPlan, scale):
        nothing = TorchPlan(plan.slot_mapping[:0], plan.prefills, plan.decode)
        out = super().forward(q, k[:0], v[:0], k_cache, v_cache, nothing, scale)
        write_kv(k, v, k_cache, v_cache, plan.slot_mapping)
        return out


def test_same_step_sharing_needs_write_before_read(llama: Path) -> None:
    """The sharing test has teeth: with the order reversed, b reads blocks not yet written."""
    good = make_runner(llama, num_blocks=8, block_size=BS)
    bad = make_runner(llama, num_blocks=8, block_size=BS)
    for layer in bad.model.attention_layers():
        layer.backend = ReadBeforeWrite()
    a, b = _shared_step(good)
    assert not torch.allclose(logits_for(good, [a, b])[1], logits_for(bad, [a, b])[1], atol=1e-3)


def test_decode_steps_equal_full_prefill(runner: ModelRunner) -> None:
    tokens = random_tokens(37, 256, seed=40)
    expected = full_logits(runner, tokens, first_block=20)
    table = [9, 2, 14]
    runner.execute([SeqChunk("a", tokens[:20], 0, table, False)])
    for pos in range(20, 37):
        got = logits_for(runner, [SeqChunk("a", [tokens[pos]], pos, table, True)])
        close(got[0], expected[pos])


def test_sliding_window_chunks_equal_full_prefill(hf_checkpoint) -> None:
    runner = make_runner(hf_checkpoint("mistral_window"), num_blocks=16, block_size=4)
    tokens = random_tokens(30, 256, seed=41)
    expected = full_logits(runner, tokens, first_block=8)
    table = blocks_for(30, 4)
    runner.execute([SeqChunk("a", tokens[:13], 0, table, False)])
    got = logits_for(runner, [SeqChunk("a", tokens[13:29], 13, table, False)], all_tokens=True)
    close(got, expected[13:29])
    close(logits_for(runner, [SeqChunk("a", tokens[29:], 29, table, True)])[0], expected[29])
