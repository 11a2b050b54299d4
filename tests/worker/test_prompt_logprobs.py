"""Prompt logprobs (echo with logprobs): each prompt token's logprob given the tokens before
it equals log_softmax of transformers' logits, in one chunk or across a chunked prefill."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from protos import frontend_pb2, worker_pb2
from tests.worker.helpers import (
    blocks_for,
    hf_logprobs,
    make_runner,
    random_tokens,
    wire_step,
)
from worker.executor import Executor
from worker.runner import model_runner
from worker.runner.batch import BatchLimits, SeqChunk, check_chunk
from worker.sample.sampler import PromptLogprobs
from worker.sample.sampling_params import SamplingParams

PROMPT = random_tokens(37, 256, seed=60)
TOP = 3
ATOL = 1e-4


@pytest.fixture(scope="module")
def llama(hf_checkpoint) -> Path:
    return hf_checkpoint("llama")


@pytest.fixture(scope="module")
def reference(llama: Path) -> torch.Tensor:
    return hf_logprobs(llama, PROMPT)


def assert_matches(
    reference: torch.Tensor,
    start: int,
    token_ids: list[int],
    logprobs: list[float],
    top_ids: list[list[int]],
    top_logprobs: list[list[float]],
) -> None:
    """Entry k scores prompt token start + k, predicted at position start + k - 1."""
    rows = reference[start - 1 : start - 1 + len(token_ids)]
    assert token_ids == PROMPT[start : start + len(token_ids)]
    want = rows.gather(1, torch.tensor(token_ids).unsqueeze(1)).flatten()
    torch.testing.assert_close(torch.tensor(logprobs), want, atol=ATOL, rtol=0)
    want_top = rows.topk(TOP, dim=-1)
    assert top_ids == want_top.indices.tolist()
    torch.testing.assert_close(torch.tensor(top_logprobs), want_top.values, atol=ATOL, rtol=0)


def check_prompt(reference: torch.Tensor, prompt: PromptLogprobs) -> None:
    assert_matches(
        reference,
        prompt.start,
        prompt.token_ids,
        [e.logprob for e in prompt.entries],
        [e.top_ids for e in prompt.entries],
        [e.top_logprobs for e in prompt.entries],
    )


def scoring_chunk(rid: str, start: int, end: int, table: list[int]) -> SeqChunk:
    return SeqChunk(
        rid,
        PROMPT[start:end],
        start,
        table,
        end == len(PROMPT),
        SamplingParams(logprobs=TOP, prompt_logprobs=TOP),
        all_token_ids=PROMPT,
        num_prompt_tokens=len(PROMPT),
    )


def test_one_chunk_scores_every_prompt_token_after_the_first(llama, reference) -> None:
    runner = make_runner(llama)
    other = random_tokens(9, 256, seed=61)
    # Another request ahead of it in the batch: its rows must not be mistaken for the prompt's.
    plain = SeqChunk("plain", other, 0, blocks_for(9, 16, first=10), True)
    out = runner.execute([plain, scoring_chunk("p", 0, len(PROMPT), blocks_for(37, 16))])
    assert out[0] is not None and out[0].prompt_logprobs is None
    sample = out[1]
    assert sample is not None and sample.error is None
    prompt = sample.prompt_logprobs
    assert prompt is not None and prompt.start == 1 and len(prompt.entries) == len(PROMPT) - 1
    check_prompt(reference, prompt)
    # The last prompt position predicts the sampled token: its logprob is the sampled one's.
    assert sample.logprobs is not None
    assert sample.logprobs.logprob == pytest.approx(reference[-1, sample.token_id].item(), abs=ATOL)


def test_long_chunks_are_scored_in_slices(llama, reference, monkeypatch) -> None:
    monkeypatch.setattr(model_runner, "PROMPT_SCORE_ROWS", 5)
    (sample,) = make_runner(llama).execute([scoring_chunk("p", 0, len(PROMPT), blocks_for(37, 16))])
    assert sample is not None and sample.prompt_logprobs is not None
    assert len(sample.prompt_logprobs.entries) == len(PROMPT) - 1
    check_prompt(reference, sample.prompt_logprobs)


def test_a_prefill_in_three_chunks_scores_each_token_once(llama, reference) -> None:
    """Through the executor and the wire: plans split the prompt 13 + 11 + 13."""
    ex = Executor(make_runner(llama))
    sampling = frontend_pb2.SamplingParams(temperature=0, logprobs=TOP, prompt_logprobs=TOP)
    table = blocks_for(len(PROMPT) + 1, 16)
    results = [
        wire_step(
            ex,
            worker_pb2.Plan(
                step_id=1,
                new_requests=[
                    worker_pb2.NewRequest(
                        request_id="p",
                        token_ids=PROMPT,
                        block_ids=table,
                        num_computed_tokens=0,
                        num_scheduled_tokens=13,
                        num_prompt_tokens=len(PROMPT),
                        sampling=sampling,
                    )
                ],
            ),
        )
    ]
    for step, (computed, count) in enumerate([(13, 11), (24, 13)], start=2):
        results.append(
            wire_step(
                ex,
                worker_pb2.Plan(
                    step_id=step,
                    continuing=[
                        worker_pb2.ContinueRequest(
                            request_id="p", num_computed_tokens=computed, num_scheduled_tokens=count
                        )
                    ],
                ),
            )
        )
    pieces = [r.prompt_logprobs for r in results]
    assert [len(p) for p in pieces] == [1, 1, 1]
    assert [(p[0].start, len(p[0].entries)) for p in pieces] == [(1, 13), (14, 11), (25, 12)]
    assert [len(r.sampled) for r in results] == [0, 0, 1], "only the last chunk samples"
    entries = [e for p in pieces for e in p[0].entries]
    assert_matches(
        reference,
        1,
        [e.token_id for e in entries],
        [e.logprob for e in entries],
        [[t.token_id for t in e.top] for e in entries],
        [[t.logprob for t in e.top] for e in entries],
    )
    # Decoding scores no prompt token: nothing more is sent.
    decode = wire_step(
        ex,
        worker_pb2.Plan(
            step_id=4,
            continuing=[
                worker_pb2.ContinueRequest(
                    request_id="p", num_computed_tokens=len(PROMPT), num_scheduled_tokens=1
                )
            ],
        ),
    )
    assert len(decode.sampled) == 1 and not decode.prompt_logprobs


def test_requests_that_do_not_ask_get_no_prompt_logprobs(llama) -> None:
    ex = Executor(make_runner(llama))
    sampling = frontend_pb2.SamplingParams(temperature=0, logprobs=TOP)  # sampled tokens only
    result = wire_step(
        ex,
        worker_pb2.Plan(
            step_id=1,
            new_requests=[
                worker_pb2.NewRequest(
                    request_id="r",
                    token_ids=PROMPT,
                    block_ids=blocks_for(38, 16),
                    num_computed_tokens=0,
                    num_scheduled_tokens=20,
                    num_prompt_tokens=len(PROMPT),
                    sampling=sampling,
                )
            ],
        ),
    )
    assert not result.prompt_logprobs and not result.sampled and not result.errors
    result = wire_step(
        ex,
        worker_pb2.Plan(
            step_id=2,
            continuing=[
                worker_pb2.ContinueRequest(
                    request_id="r", num_computed_tokens=20, num_scheduled_tokens=17
                )
            ],
        ),
    )
    assert not result.prompt_logprobs and len(result.sampled) == 1


def test_too_many_prompt_logprobs_are_refused() -> None:
    limits = BatchLimits(block_size=16, num_blocks=8, vocab_size=256, max_model_len=128)
    chunk = SeqChunk(
        "r",
        PROMPT[:5],
        0,
        [0],
        False,
        SamplingParams(prompt_logprobs=21),
        all_token_ids=PROMPT,
        num_prompt_tokens=len(PROMPT),
    )
    assert "prompt logprobs" in (check_chunk(chunk, limits) or "")
