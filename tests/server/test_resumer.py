"""server/resume.py: which failures a live request survives, for how long, and what it
re-submits."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata

from protos import frontend_pb2
from server.resume import Resumer, continuation


def error(code: grpc.StatusCode, details: str) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details)


BROKEN = error(grpc.StatusCode.UNAVAILABLE, "Socket closed")
NO_WORKER = error(grpc.StatusCode.UNAVAILABLE, "no worker for model 'm' is up")
UNKNOWN_MODEL = error(grpc.StatusCode.NOT_FOUND, "model 'm' does not exist")
REFUSED = error(grpc.StatusCode.INVALID_ARGUMENT, "the prompt is empty")


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def test_a_request_never_admitted_is_not_resumed():
    async def go() -> float | None:
        return Resumer(timeout=30).retry_after(BROKEN)

    assert run(go()) is None


def test_a_broken_link_is_resumed_and_then_a_scheduler_without_workers_is_waited_for():
    async def go() -> list[float | None]:
        r = Resumer(timeout=30, admitted=True)
        return [r.retry_after(e) for e in (BROKEN, NO_WORKER, UNKNOWN_MODEL, BROKEN)]

    delays = run(go())
    assert all(d is not None and 0 < d <= 0.5 for d in delays), delays
    assert delays == sorted(delays)  # backing off


@pytest.mark.parametrize("err", [NO_WORKER, UNKNOWN_MODEL, REFUSED])
def test_answers_of_a_live_scheduler_are_not_a_broken_link(err):
    async def go() -> float | None:
        return Resumer(timeout=30, admitted=True).retry_after(err)

    assert run(go()) is None


def test_a_refusal_while_resuming_fails_at_once():
    async def go() -> tuple[float | None, float | None]:
        r = Resumer(timeout=30, admitted=True)
        return r.retry_after(BROKEN), r.retry_after(REFUSED)

    first, then = run(go())
    assert first is not None and then is None


def test_past_the_deadline_it_gives_up_and_a_resumed_request_gets_a_new_deadline():
    async def go() -> list[float | None]:
        r = Resumer(timeout=0.05, admitted=True)
        out = [r.retry_after(BROKEN)]
        await asyncio.sleep(0.06)
        out.append(r.retry_after(BROKEN))  # past it
        r.resumed()
        out.append(r.retry_after(BROKEN))  # a later break: a deadline of its own
        return out

    assert [d is not None for d in run(go())] == [True, False, True]


def test_zero_timeout_never_resumes():
    async def go() -> float | None:
        return Resumer(timeout=0, admitted=True).retry_after(BROKEN)

    assert run(go()) is None


def test_a_continuation_carries_the_streamed_tokens_under_a_new_id():
    original = frontend_pb2.GenerateRequest(
        request_id="cmpl-1-0",
        model="m",
        prompt_token_ids=[1, 2, 3],
        sampling=frontend_pb2.SamplingParams(seed=7, prompt_logprobs=2),
        stop=frontend_pb2.StopCriteria(max_tokens=10),
    )
    again = continuation(original, [5, 6], attempt=2, prompt_logprobs_received=True)
    assert again.request_id == "cmpl-1-0-resume2"
    assert list(again.prompt_token_ids) == [1, 2, 3]
    assert list(again.resumed_token_ids) == [5, 6]
    assert again.sampling.seed == 7 and again.stop.max_tokens == 10
    assert not again.sampling.HasField("prompt_logprobs")  # sent once, before the first token
    before_any = continuation(original, [], attempt=1, prompt_logprobs_received=False)
    assert before_any.sampling.prompt_logprobs == 2
    assert original.request_id == "cmpl-1-0" and not original.resumed_token_ids
