"""A continuation (GenerateRequest.resumed_token_ids, sent by a frontend whose scheduler link
broke) is admitted with those tokens as outputs: only new tokens come back, max_tokens counts
the resumed ones, the prompt stays the prompt, and a malformed one is refused."""

from __future__ import annotations

import threading

import grpc
import pytest

from tests.service.helpers import (
    VOCAB,
    GatedRunner,
    Worker,
    expected_tokens,
    generate,
    ledger_idle,
    running_scheduler,
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


def test_a_continuation_is_admitted_past_a_full_queue():
    """It was admitted before its frontend's link broke: a full queue must not end a stream
    that already sent text (a new request gets 429)."""
    with running_scheduler("--max-waiting-requests", "1", "--max-num-seqs", "1") as scheduler:
        gate = GatedRunner("a", at=12)
        worker = Worker(scheduler.target, "w0", runner=gate)
        out: dict[str, list[int]] = {}

        def collect(rid: str, **kw) -> None:  # noqa: ANN003
            replies = generate(scheduler.target, rid, list(range(1, 11)), 8, **kw)
            out[rid] = [t for r in replies for t in r.token_ids]

        def waiting() -> int:
            return scheduler.call(
                lambda: sum(lk.scheduler.num_waiting for lk in scheduler.engine.links.values())
            )

        try:
            wait_for(lambda: scheduler.engine.links)
            threads = [threading.Thread(target=collect, args=("a",))]
            threads[0].start()
            assert gate.reached.wait(10)  # a runs, held; the one seat is taken
            threads.append(threading.Thread(target=collect, args=("b",)))
            threads[1].start()
            wait_for(lambda: waiting() == 1)  # the queue is full
            with pytest.raises(grpc.RpcError) as err:
                list(generate(scheduler.target, "c", list(range(1, 11)), 8))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            resumed = expected_tokens(10, 2)
            threads.append(
                threading.Thread(target=collect, args=("d",), kwargs={"resumed_token_ids": resumed})
            )
            threads[2].start()
            wait_for(lambda: waiting() == 2)  # admitted past the limit
            gate.release.set()
            for t in threads:
                t.join(30)
            assert out["d"] == expected_tokens(10, 8)[2:]
            assert out["a"] == out["b"] == expected_tokens(10, 8)
            wait_for(lambda: ledger_idle(scheduler))
        finally:
            gate.release.set()
            worker.stop()
