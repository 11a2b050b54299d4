"""The executor over a real model: sampling state survives preemption and recompute."""

from __future__ import annotations

from pathlib import Path

import pytest

from protos import frontend_pb2, worker_pb2
from tests.worker.helpers import make_runner, random_tokens, wire_step
from worker.executor import Executor

PROMPT = random_tokens(10, 256, seed=50)
STEPS = 16


@pytest.fixture(scope="module")
def llama(hf_checkpoint) -> Path:
    return hf_checkpoint("llama")


def admit(
    tokens: list[int], blocks: list[int], sampling: frontend_pb2.SamplingParams
) -> worker_pb2.NewRequest:
    return worker_pb2.NewRequest(
        request_id="r",
        token_ids=tokens,
        block_ids=blocks,
        num_computed_tokens=0,
        num_scheduled_tokens=len(tokens),
        num_prompt_tokens=len(PROMPT),
        sampling=sampling,
    )


def generate(
    ex: Executor, sampling: frontend_pb2.SamplingParams, preempt_after: int | None = None
) -> list[int]:
    """Prefill, then decode one token a step; optionally preempt and re-admit (recompute)."""
    out: list[int] = []
    plan = worker_pb2.Plan(new_requests=[admit(PROMPT, [0, 1], sampling)])
    for step in range(STEPS):
        (sampled,) = wire_step(ex, plan).sampled
        out.append(sampled.token_id)
        computed = len(PROMPT) + step
        if step + 1 == preempt_after:
            plan = worker_pb2.Plan(
                dropped_request_ids=["r"], new_requests=[admit(PROMPT + out, [5, 6], sampling)]
            )
        else:
            plan = worker_pb2.Plan(
                continuing=[
                    worker_pb2.ContinueRequest(
                        request_id="r", num_computed_tokens=computed, num_scheduled_tokens=1
                    )
                ]
            )
    return out


# Output-only penalties first: a recompute that took outputs for prompt would lose them.
@pytest.mark.parametrize(("temperature", "repetition"), [(0.0, 1.0), (0.05, 1.8)])
def test_penalties_and_seeds_survive_preemption(
    llama: Path, temperature: float, repetition: float
) -> None:
    sampling = frontend_pb2.SamplingParams(
        temperature=temperature,
        top_p=1.0,
        repetition_penalty=repetition,
        frequency_penalty=2.0,
        presence_penalty=2.0,
        seed=4,
        logprobs=-1,
    )
    straight = generate(Executor(make_runner(llama, num_blocks=8)), sampling)
    recomputed = generate(Executor(make_runner(llama, num_blocks=8)), sampling, preempt_after=8)
    assert recomputed == straight
    plain = frontend_pb2.SamplingParams(temperature=temperature, top_p=1.0, seed=4, logprobs=-1)
    assert generate(Executor(make_runner(llama, num_blocks=8)), plain) != straight, (
        "the penalties must change something for this test to mean anything"
    )
