"""The timed steps of benchmarks/worker_forward.py: one prefill or decode step of kvledger's
`ModelRunner` or of transformers on a fixed batch, and `race`, which times them in turns.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from worker.runner.batch import SeqChunk
from worker.runner.model_runner import ModelRunner


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1000, vocab, (batch, length), generator=gen).tolist()


def tables(batch: int, tokens: int, block_size: int) -> list[list[int]]:
    per_seq = -(-tokens // block_size)
    return [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]


@dataclass
class Step:
    """One step of an engine on a fixed batch: `run` is timed and returns the greedy tokens;
    `reset` runs untimed after each `run`."""

    run: Callable[[], list[int]]
    reset: Callable[[], None] = lambda: None


def race(steps: dict[str, Step], repeats: int) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Median ms of each step over `repeats` timed runs, after one warm-up run each, and the
    tokens of that warm-up. The steps take turns, in an order reversed every round, so drifts in
    machine load fall on all of them alike. (Timed in blocks, one engine after the other, the
    one timed second came out up to ~20% faster: a batch-32 prefill page-faults in ~75-115 MB
    of activations that the allocator gave back to the OS, as many as what ran before left.)"""
    tokens = {}
    for name, step in steps.items():
        tokens[name] = step.run()
        step.reset()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            steps[name].run()
            samples[name].append(time.perf_counter() - started)
            steps[name].reset()
    return {name: statistics.median(s) * 1000 for name, s in samples.items()}, tokens


def kvl_tokens(runner: ModelRunner, chunks: list[SeqChunk]) -> list[int]:
    return [sample.token_id for sample in runner.execute(chunks)]


def kvl_prefill(runner: ModelRunner, batch: int, length: int) -> Step:
    ids = prompts(batch, length, runner.vocab_size, 1)
    blocks = tables(batch, length, runner.block_size)
    chunks = [SeqChunk(f"p{i}", ids[i], 0, blocks[i], True) for i in range(batch)]
    return Step(lambda: kvl_tokens(runner, chunks))


def kvl_decode(runner: ModelRunner, batch: int, context: int) -> Step:
    ids = prompts(batch, context + 1, runner.vocab_size, 2)
    blocks = tables(batch, context + 1, runner.block_size)
    runner.execute([SeqChunk(f"d{i}", ids[i][:context], 0, blocks[i], False) for i in range(batch)])
    # every run computes position `context` again (rewriting its slot): the same context each time
    chunks = [SeqChunk(f"d{i}", [ids[i][context]], context, blocks[i], True) for i in range(batch)]
    return Step(lambda: kvl_tokens(runner, chunks))


def hf_prefill(model, batch: int, length: int) -> Step:
    ids = torch.tensor(prompts(batch, length, model.config.vocab_size, 1), device=model.device)

    @torch.inference_mode()
    def run() -> list[int]:
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].argmax(dim=-1).tolist()

    return Step(run)


def hf_decode(model, batch: int, context: int) -> Step:
    ids = torch.tensor(prompts(batch, context + 1, model.config.vocab_size, 2), device=model.device)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)
    assert cache.get_seq_length() == context

    @torch.inference_mode()
    def run() -> list[int]:
        out = model(input_ids=ids[:, context:], past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(dim=-1).tolist()

    def crop() -> None:  # back to `context` tokens, so every run sees the same context
        cache.crop(-1)
        assert cache.get_seq_length() == context

    return Step(run, crop)
