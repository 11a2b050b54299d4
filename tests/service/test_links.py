"""The scheduler service over real gRPC, with real worker links whose model is a stand-in.

The stand-in runner is the edge of this test: it returns a token that depends only on the
sequence position, so a request recomputed on another worker yields the same tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from protos import frontend_pb2
from tests.service.helpers import (
    VOCAB,
    GatedRunner,
    ScoringRunner,
    Worker,
    expected_tokens,
    generate,
    ledger_idle,
    running_scheduler,
    wait_for,
)


def test_generate_streams_every_token_and_frees_everything(scheduler):
    worker = Worker(scheduler.target, "w0")
    try:
        wait_for(lambda: scheduler.engine.links)
        out = [
            t for r in generate(scheduler.target, "r1", list(range(1, 11)), 7) for t in r.token_ids
        ]
        assert out == expected_tokens(10, 7)
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        worker.stop()


def test_client_cancel_aborts_and_frees(stepped_scheduler):
    scheduler = stepped_scheduler
    worker = Worker(scheduler.target, "w0")
    try:
        wait_for(lambda: scheduler.engine.links)
        stream = generate(scheduler.target, "r1", list(range(1, 30)), 200)
        next(stream)
        stream.cancel()
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        worker.stop()


def test_errors_map_to_status_codes(scheduler):
    with pytest.raises(grpc.RpcError) as err:
        next(generate(scheduler.target, "r1", [1, 2], 3))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    worker = Worker(scheduler.target, "w0")
    try:
        wait_for(lambda: scheduler.engine.links)
        with pytest.raises(grpc.RpcError) as err:
            next(generate(scheduler.target, "r2", [VOCAB + 5], 3))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            next(generate(scheduler.target, "r3", list(range(1, 300)), 3))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        worker.stop()
    wait_for(lambda: not scheduler.engine.links)
    with pytest.raises(grpc.RpcError) as err:
        next(generate(scheduler.target, "r4", [1, 2], 3))
    assert err.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)


def test_lost_worker_requests_continue_on_another(stepped_scheduler):
    scheduler = stepped_scheduler
    first = Worker(scheduler.target, "w0")
    wait_for(lambda: len(scheduler.engine.links) == 1)
    stream = generate(scheduler.target, "r1", list(range(1, 20)), 40)
    got = list(next(stream).token_ids)
    second = Worker(scheduler.target, "w1")
    try:
        wait_for(lambda: len(scheduler.engine.links) == 2)
        first.stop()
        for response in stream:
            got += response.token_ids
        assert got == expected_tokens(19, 40)
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        second.stop()


def test_without_chunked_prefill_a_long_prompt_runs_in_one_step():
    with running_scheduler("--no-enable-chunked-prefill") as scheduler:
        worker = Worker(scheduler.target, "w0")
        try:
            wait_for(lambda: scheduler.engine.links)
            prompt = list(range(1, 200))  # longer than the 64-token budget
            out = [t for r in generate(scheduler.target, "r1", prompt, 3) for t in r.token_ids]
            assert out == expected_tokens(199, 3)
            wait_for(lambda: ledger_idle(scheduler))
        finally:
            worker.stop()


def test_a_worker_that_differs_from_its_model_peers_is_refused(scheduler):
    first = Worker(scheduler.target, "w0")
    try:
        wait_for(lambda: len(scheduler.engine.links) == 1)
        odd = Worker(scheduler.target, "w1", vocab_size=VOCAB + 1)
        odd.thread.join(10)
        assert not odd.thread.is_alive(), "the refused worker stops instead of retrying"
        assert list(scheduler.engine.links) == ["w0"]
    finally:
        first.stop()


def test_a_lost_workers_pool_is_not_kept_frozen(scheduler):
    import gc

    baseline = None
    for i in range(3):
        worker = Worker(scheduler.target, f"w{i}", num_blocks=5000)
        wait_for(lambda: len(scheduler.engine.links) == 1)
        worker.stop()
        wait_for(lambda: not scheduler.engine.links)
        frozen = scheduler.call(gc.get_freeze_count)
        baseline = frozen if baseline is None else baseline
        assert frozen < baseline + 1000, "each lost pool stayed in the permanent generation"


def scoring(top: int = 0) -> frontend_pb2.SamplingParams:
    return frontend_pb2.SamplingParams(logprobs=-1, prompt_logprobs=top)


def collect(
    stream: Iterator[frontend_pb2.GenerateResponse],
) -> tuple[list[int], list[frontend_pb2.TokenLogprob], int]:
    """Tokens, prompt logprobs, and the response index of the first token."""
    tokens: list[int] = []
    prompt: list[frontend_pb2.TokenLogprob] = []
    first_token_at = -1
    for i, response in enumerate(stream):
        assert not (tokens and response.prompt_logprobs), "prompt logprobs after a token"
        prompt += response.prompt_logprobs
        if response.token_ids and first_token_at < 0:
            first_token_at = i
        tokens += response.token_ids
    return tokens, prompt, first_token_at


def assert_scored_once(prompt_ids: list[int], got: list[frontend_pb2.TokenLogprob]) -> None:
    assert [e.token_id for e in got] == prompt_ids[1:]
    assert [e.logprob for e in got] == pytest.approx([-p / 100 for p in range(1, len(prompt_ids))])


class GatedScoringRunner(GatedRunner, ScoringRunner):
    """Scores prompts, and holds the step computing position `at` of request `rid`."""

    def __init__(self, rid: str, at: int) -> None:
        GatedRunner.__init__(self, rid, at)
        ScoringRunner.__init__(self)


def test_prompt_logprobs_of_a_chunked_prefill_arrive_once_across_preemption():
    # A budget of 64 tokens splits the 100-token prompt in two; 30 blocks of 4 tokens cannot
    # hold both requests to the end, so the later one (b) is preempted and recomputed. The
    # worker holds a's 6th token until b has arrived: a then has ~40 tokens left however many
    # steps a bundle plans, more than b's 22 steps, so the pool runs out with both running.
    runner = GatedScoringRunner("a", at=25)
    with running_scheduler() as scheduler:
        worker = Worker(scheduler.target, "w0", num_blocks=30, runner=runner)
        try:
            wait_for(lambda: scheduler.engine.links)
            first = generate(scheduler.target, "a", list(range(1, 21)), 60)
            next(first)
            prompt = list(range(200, 300))
            got_b: list = []
            b = threading.Thread(
                target=lambda: got_b.append(
                    collect(generate(scheduler.target, "b", prompt, 20, sampling=scoring()))
                )
            )
            b.start()
            assert runner.reached.wait(10)
            wait_for(lambda: scheduler.call(lambda: "b" in scheduler.engine.links["w0"].live))
            runner.release.set()
            b.join(30)
            assert got_b, "b's stream did not complete"
            tokens, got, first_token_at = got_b[0]
            assert tokens == expected_tokens(100, 20)
            assert first_token_at == 0, "every prompt logprob comes with the first token"
            assert_scored_once(prompt, got)
            assert [t for r in first for t in r.token_ids] == expected_tokens(20, 60)[1:]
            preemptions = scheduler.call(
                lambda: scheduler.engine.links["w0"].scheduler.stats.preemptions
            )
            assert preemptions >= 1, "the test must preempt to mean anything"
            wait_for(lambda: ledger_idle(scheduler))
        finally:
            runner.release.set()
            worker.stop()


def test_prompt_logprobs_are_not_repeated_after_a_lost_worker(scheduler):
    # w0 holds r1's step at position 24 until it is lost, so r1 always has tokens left for w1
    gate = GatedScoringRunner("r1", at=24)
    first = Worker(scheduler.target, "w0", runner=gate)
    wait_for(lambda: len(scheduler.engine.links) == 1)
    prompt = list(range(1, 20))
    stream = generate(scheduler.target, "r1", prompt, 40, sampling=scoring())
    response = next(stream)
    got, tokens = list(response.prompt_logprobs), list(response.token_ids)
    runner = ScoringRunner()
    second = Worker(scheduler.target, "w1", runner=runner)
    try:
        wait_for(lambda: len(scheduler.engine.links) == 2)
        assert gate.reached.wait(30)
        first.client.stop()
        gate.release.set()  # the held step ends on a link that is gone
        first.thread.join(5)
        more_tokens, more, _ = collect(stream)
        assert tokens + more_tokens == expected_tokens(19, 40)
        assert_scored_once(prompt, got + more)
        assert runner.num_scored == 0, "a prompt already scored is not scored again"
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        second.stop()


def test_prompt_logprob_requests_are_never_served_from_the_cache(scheduler):
    worker = Worker(scheduler.target, "w0", runner=ScoringRunner())
    try:
        wait_for(lambda: scheduler.engine.links)
        prompt = list(range(1, 30))
        for rid in ("lp1", "lp2"):  # the engine skips the cache without being told
            responses = list(generate(scheduler.target, rid, prompt, 2, sampling=scoring(2)))
            assert all(r.num_cached_tokens == 0 for r in responses)
            assert_scored_once(prompt, [e for r in responses for e in r.prompt_logprobs])
        plain = list(generate(scheduler.target, "plain", prompt, 2))
        assert plain[0].num_cached_tokens > 0, "the prompt is cached: a hit was possible"
        assert not any(r.prompt_logprobs for r in plain)
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        worker.stop()
