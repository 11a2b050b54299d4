"""Finishing and ignoring: every way a request ends on its own (stop tokens, length, a prompt
that can never run, an embedding), and the duplicate id refused at arrival."""

from collections.abc import Callable

import pytest

from scheduler_svc.core import (
    FinishReason,
    ModelResult,
    Request,
    RequestStatus,
    Scheduler,
)
from tests.core.fakes import FakeWorker
from tests.core.harness import Harness, config, has_unfinished, request


def scripted(tokens: list[int]) -> Callable[[str, list[int]], int]:
    def next_token(rid: str, seen: list[int]) -> int:
        return tokens[len(seen) - 4] if len(seen) - 4 < len(tokens) else 1

    return next_token


@pytest.mark.parametrize(
    ("kw", "script", "outputs", "reason"),
    [
        ({"eos_token_ids": frozenset({7})}, [5, 7, 5], [5, 7], "stop"),
        ({"eos_token_ids": frozenset({7}), "ignore_eos": True}, [5, 7, 5], [5, 7, 5], "length"),
        ({"eos_token_ids": frozenset({7}), "min_tokens": 3}, [7, 7, 7, 7], [7, 7, 7], "stop"),
        ({"stop_token_ids": frozenset({6})}, [5, 6, 5], [5, 6], "stop"),
        ({"stop_token_ids": frozenset({6}), "min_tokens": 2}, [6, 5, 6], [6, 5, 6], "stop"),
        ({"stop_token_ids": frozenset({6}), "min_tokens": 2}, [6, 6, 5], [6, 6], "stop"),
        ({}, [5, 5, 5, 5, 5], [5, 5, 5], "length"),
    ],
)
def test_token_level_stops(
    kv: bool, kw: dict, script: list[int], outputs: list[int], reason: str
) -> None:
    cfg = config(kv=kv)
    h = Harness(Scheduler(cfg), FakeWorker(4, kv=kv, next_token=scripted(script)))
    r = request("r", [1, 2, 3, 4], max_tokens=3, **kw)
    h.add(r)
    h.run_to_idle()
    assert h.outputs("r") == outputs and h.finish_of("r").finish_reason == reason
    assert r.finish_reason == reason and r.output_token_ids == outputs


def test_max_model_len_caps_generation(kv: bool) -> None:
    h = Harness.build(kv, max_model_len=10)
    h.add(request("r", range(8), max_tokens=100))
    h.run_to_idle()
    assert h.outputs("r") == [1008, 1009] and h.finish_of("r").finish_reason == "length"


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "message"),
    [
        ([], 4, "the prompt is empty"),
        (list(range(65)), 4, "more than the maximum context length of 64"),
        (
            list(range(33)),
            4,
            "33 tokens, more than a worker of this model can hold in its KV cache",
        ),
        (list(range(4)), 0, "max_tokens must be at least 1"),
    ],
)
def test_prompts_that_can_never_run_finish_as_ignored_with_a_reason(
    kv: bool, prompt: list[int], max_tokens: int, message: str
) -> None:
    h = Harness.build(kv)
    r = request("bad", prompt, max_tokens=max_tokens)
    h.add(r, request("fine", [1, 2, 3], max_tokens=1))
    if not kv and "KV cache" in message:
        assert r.status is RequestStatus.WAITING  # no pool, no such limit
        h.run_to_idle()
        return
    assert r.status is RequestStatus.FINISHED and r.finish_reason is FinishReason.IGNORED
    assert has_unfinished(h.sched) and h.sched.abort_request("bad") is False
    out = h.plan()
    (update,) = out.finished
    assert update.request_id == "bad" and update.finish_reason == "ignored"
    assert message in update.finish_message and update.new_token_ids == []
    assert [n.request_id for n in out.new] == ["fine"]  # it never blocked the queue
    h.finish_step()
    h.run_to_idle()
    assert [u.request_id for u in h.updates if u.finish_reason == "ignored"] == ["bad"]
    assert "bad" not in h.sched.tracker.entries  # it never got an entry to release


def test_embedding_requests_finish_when_their_prompt_is_computed(kv: bool) -> None:
    h = Harness.build(kv, max_num_batched_tokens=8)
    e = request("e", range(8), max_tokens=0, is_embedding=True)
    h.add(e)
    out = h.step()
    assert out.new[0].num_scheduled_tokens == 8
    end = h.finish_of("e")
    assert end.finish_reason == "stop" and end.new_token_ids == [] and e.output_token_ids == []
    h.add(request("lost", range(4), max_tokens=0, is_embedding=True))
    h.plan()
    h.finish_step(withhold=["lost"])
    assert h.finish_of("lost").finish_reason == "error"
    h.run_to_idle()


def test_embedding_requests_are_never_split_across_steps(kv: bool) -> None:
    h = Harness.build(kv, max_num_batched_tokens=8)
    h.add(request("big", range(12), max_tokens=0, is_embedding=True))
    h.step()
    big = h.finish_of("big")
    assert big.finish_reason == "ignored" and "token budget" in big.finish_message
    h.add(request("g", range(4), max_tokens=3))
    h.step()  # g's prompt
    h.add(request("e", range(8), max_tokens=0, is_embedding=True))  # shares g's first block
    out = h.step()  # g decodes one token: 7 left, too few for e, which waits whole
    assert [n.request_id for n in out.new] == [] and h.finish_of("e") is None
    while h.finish_of("e") is None:
        out = h.step()
        for n in out.new:
            if n.request_id == "e":  # whole, reading no cached block, declaring none written
                assert (n.num_computed_tokens, n.num_scheduled_tokens) == (0, 8)
                assert n.claimed == [] and n.written == []
    h.run_to_idle()


def test_duplicate_live_request_ids_are_refused(kv: bool) -> None:
    sched = Scheduler(config(kv=kv))
    sched.add_request(Request("r", [1, 2], max_tokens=1))
    with pytest.raises(ValueError, match="already live"):
        sched.add_request(Request("r", [1, 2], max_tokens=1))
    (update,) = sched.update_from_output(sched.schedule(), ModelResult(sampled={"r": 3}))
    assert update.finish_reason == "length" and update.new_token_ids == [3]
