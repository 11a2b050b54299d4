"""A continuation (GenerateRequest.resumed_token_ids, sent by a frontend whose scheduler link
broke) is admitted with those tokens as outputs: only new tokens come back, max_tokens counts
the resumed ones, the prompt stays the prompt, and a malformed one is refused."""

from __future__ import annotations

import grpc
import pytest

from tests.service.helpers import (
    VOCAB,
    Worker,
    expected_tokens,
    generate,
    ledger_idle,
    wait_for,
)


def test_a_continuation_streams_only_the_tokens_still_to_come(scheduler):
    worker = Worker(scheduler.target, "w0")
    try:
        wait_for(lambda: scheduler.engine.links)
        prompt, done = list(range(1, 11)), expected_tokens(10, 3)
        replies = list(generate(scheduler.target, "r1", prompt, 7, resumed_token_ids=done))
        assert [t for r in replies for t in r.token_ids] == expected_tokens(10, 7)[3:]
        assert {r.num_prompt_tokens for r in replies} == {10}
        assert replies[-1].finish_reason == "length"
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        worker.stop()


@pytest.mark.parametrize(
    ("resumed", "says"),
    [([VOCAB + 1], "out of vocabulary"), ([5] * 7, "fewer resumed tokens than max_tokens")],
)
def test_a_malformed_continuation_is_refused_and_holds_nothing(scheduler, resumed, says):
    worker = Worker(scheduler.target, "w0")
    try:
        wait_for(lambda: scheduler.engine.links)
        with pytest.raises(grpc.RpcError) as err:
            list(generate(scheduler.target, "r1", [1, 2, 3], 7, resumed_token_ids=resumed))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in err.value.details()
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        worker.stop()
