"""Workers of one model with different KV pools (a CPU and a GPU worker under one name): a
request goes to a worker whose pool can hold it, at first placement and after a lost worker."""

from __future__ import annotations

import grpc
import pytest

from tests.service.helpers import (
    Worker,
    expected_tokens,
    generate,
    ledger_idle,
    wait_for,
)

# Blocks of 4 tokens; every worker's context is 256 tokens.
SMALL, MEDIUM, BIG = 16, 32, 256  # pools of 64, 128 and 1024 tokens


def start(scheduler, *workers: tuple[str, int]) -> list[Worker]:  # noqa: ANN001
    """Registers the workers one by one, in this order (the order that wins ties)."""
    started = []
    for worker_id, num_blocks in workers:
        started.append(Worker(scheduler.target, worker_id, num_blocks=num_blocks))
        count = len(started)
        wait_for(lambda: len(scheduler.engine.links) == count)  # noqa: B023 - waited on here
    return started


def stop(workers: list[Worker]) -> None:
    for worker in workers:
        worker.stop()


def test_a_prompt_only_the_bigger_pool_holds_is_served_there(scheduler):
    workers = start(scheduler, ("small", SMALL), ("big", BIG))
    try:
        prompt = list(range(1, 101))  # 100 tokens: more than the small pool
        out = [t for r in generate(scheduler.target, "r1", prompt, 3) for t in r.token_ids]
        assert out == expected_tokens(100, 3)
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        stop(workers)


def test_a_request_goes_where_it_can_reach_max_tokens(scheduler):
    workers = start(scheduler, ("small", SMALL), ("big", BIG))
    try:
        responses = list(generate(scheduler.target, "r1", list(range(1, 41)), 100))
        out = [t for r in responses for t in r.token_ids]
        assert out == expected_tokens(40, 100), "not cut short by the small pool"
        assert responses[-1].finish_reason == "length"
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        stop(workers)


def test_when_no_pool_holds_the_whole_request_one_that_holds_its_prompt_serves_it(scheduler):
    workers = start(scheduler, ("small", SMALL), ("medium", MEDIUM))
    try:
        # 100 + 100 tokens fit neither pool; the 100-token prompt fits the medium one, which
        # ends the request with `length` when its pool is full.
        responses = list(generate(scheduler.target, "r1", list(range(1, 101)), 100))
        out = [t for r in responses for t in r.token_ids]
        assert out == expected_tokens(100, 128 - 100)
        assert responses[-1].finish_reason == "length"
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        stop(workers)


def test_a_prompt_no_pool_holds_is_still_refused_with_the_ledgers_reason(scheduler):
    workers = start(scheduler, ("small", SMALL), ("medium", MEDIUM))
    try:
        with pytest.raises(grpc.RpcError) as err:
            next(generate(scheduler.target, "r1", list(range(1, 201)), 3))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "more than a worker of this model can hold" in err.value.details()
        assert "pool" not in err.value.details(), "the pool size is not for clients"
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        stop(workers)


def test_after_a_lost_worker_a_request_moves_to_a_pool_that_holds_it(scheduler):
    # "big1" wins the first placement on any routing; once it is lost, "small" would win
    # the tie with "big2" if pool sizes were ignored.
    workers = start(scheduler, ("big1", BIG), ("small", SMALL), ("big2", BIG))
    try:
        stream = generate(scheduler.target, "r1", list(range(1, 41)), 100)
        got = list(next(stream).token_ids)
        assert scheduler.call(lambda: scheduler.engine.link_of("r1").worker_id) == "big1"
        workers[0].stop()
        for response in stream:
            got += response.token_ids
        assert got == expected_tokens(40, 100)
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        stop(workers)
