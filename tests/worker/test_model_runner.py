"""ModelRunner's contract with the executor: sizes, outputs per chunk, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.helpers import logits_for, make_runner, random_tokens
from worker.runner.batch import BatchLimits, SeqChunk, check_chunk
from worker.runner.config import RunnerConfig
from worker.runner.model_runner import ModelRunner
from worker.sample.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llama(hf_checkpoint) -> Path:
    return hf_checkpoint("llama")


def test_sizes_reported(llama: Path) -> None:
    runner = ModelRunner(RunnerConfig(llama, kv_cache_memory_bytes=1 << 20, progress=False))
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # K+V, layers, block, kv heads, head_dim, fp32
    assert runner.num_blocks == (1 << 20) // per_block
    assert (runner.block_size, runner.max_model_len, runner.vocab_size) == (16, 256, 256)
    assert runner.eos_token_ids == [2]
    fixed = ModelRunner(
        RunnerConfig(
            llama,
            block_size=8,
            num_blocks=5,
            kv_cache_memory_bytes=1 << 20,
            max_model_len=100,
            progress=False,
        )
    )
    assert (fixed.num_blocks, fixed.max_model_len) == (5, 100)


def test_one_token_per_sampling_chunk(llama: Path) -> None:
    runner = make_runner(llama)
    out = runner.execute(
        [
            SeqChunk("a", [1, 2, 3], 0, [0], False),
            SeqChunk("b", [4, 5], 0, [1], True),
            SeqChunk("c", [6], 0, [2], True, SamplingParams(temperature=0.8, seed=1)),
        ]
    )
    assert out[0] is None
    assert all(isinstance(s.token_id, int) and s.error is None for s in out[1:])
    assert out[1].logprobs is None  # not asked for
    assert runner.execute([]) == []


def test_seeded_sampling_survives_recompute(llama: Path) -> None:
    """The same request recomputed in another runner, batch and blocks draws the same token."""
    prompt = random_tokens(21, 256, seed=5)
    first = make_runner(llama, seed=1)
    first.execute([SeqChunk("x", prompt[:10], 0, [3], False)])
    a = first.execute(
        [SeqChunk("r", prompt[10:], 10, [3, 4], True, SamplingParams(temperature=1.0, seed=9))]
    )
    second = make_runner(llama, seed=2)
    b = second.execute(
        [
            SeqChunk("o", [7, 7], 0, [0], True, SamplingParams(temperature=1.0)),
            SeqChunk("r", prompt, 0, [5, 6], True, SamplingParams(temperature=1.0, seed=9)),
        ]
    )
    assert a[0].token_id == b[1].token_id


LIMITS = BatchLimits(block_size=16, num_blocks=32, vocab_size=256, max_model_len=256)


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (SeqChunk("r", [], 0, [0], True), "at least one token"),
        (SeqChunk("r", [256], 0, [0], True), "outside the vocabulary"),
        (SeqChunk("r", [-1], 0, [0], True), "outside the vocabulary"),
        (SeqChunk("r", [1] * 17, 0, [0], True), "cannot hold 17 tokens"),
        (SeqChunk("r", [1], 0, [99], True), "block id outside"),
        (SeqChunk("r", [1], 300, list(range(20)), True), "max_model_len"),
        (SeqChunk("r", [1], 0, [0], True, SamplingParams(top_p=0.0)), "top_p"),
        (SeqChunk("r", [1], 0, [0], True, SamplingParams(temperature=-1.0)), "temperature"),
        (SeqChunk("r", [1], 0, [0], True, SamplingParams(min_p=1.5)), "min_p"),
        (
            SeqChunk("r", [1], 0, [0], True, SamplingParams(repetition_penalty=0.0)),
            "repetition_penalty",
        ),
        (
            SeqChunk("r", [1], 0, [0], True, SamplingParams(frequency_penalty=float("nan"))),
            "finite",
        ),
        (SeqChunk("r", [1], 0, [0], True, SamplingParams(logprobs=21)), "at most 20 logprobs"),
    ],
)
def test_bad_chunks_are_named(chunk: SeqChunk, message: str) -> None:
    error = check_chunk(chunk, LIMITS)
    assert error is not None and message in error and "request r" in error
    assert check_chunk(SeqChunk("ok", [1], 0, [1], True), LIMITS) is None


def test_runner_refuses_a_bad_batch_before_compute(llama: Path) -> None:
    """The executor drops bad chunks first; the runner itself never computes a bad one."""
    runner = make_runner(llama, num_blocks=32)
    with pytest.raises(ValueError, match="request r: token id outside"):
        runner.execute([SeqChunk("ok", [1], 0, [1], True), SeqChunk("r", [256], 0, [0], True)])


def test_refusals_before_memory(llama: Path) -> None:
    with pytest.raises(ValueError, match="dtype"):
        make_runner(llama, dtype="int8")
    with pytest.raises(ValueError, match="max_model_len"):
        make_runner(llama, max_model_len=100_000)
    with pytest.raises(ValueError, match="num_blocks or kv_cache_memory_bytes"):
        ModelRunner(RunnerConfig(llama, progress=False))


def test_bfloat16_runs_close_to_float32(llama: Path) -> None:
    tokens = random_tokens(30, 256, seed=6)
    chunk = SeqChunk("r", tokens, 0, [0, 1], True)
    full = logits_for(make_runner(llama), [chunk])
    half = make_runner(llama, dtype="bfloat16")
    assert half.kv_cache.k[0].dtype == torch.bfloat16
    assert torch.nn.functional.cosine_similarity(logits_for(half, [chunk]), full).item() > 0.99
