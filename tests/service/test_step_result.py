"""A step's result travels whole (scheduler_svc/wire.py): what the worker sent with a token
(its logprob) or an embedding rides through the core as the update's opaque payload and comes
out with exactly that update. Plain messages and a real ledger; no gRPC server, no loop."""

from __future__ import annotations

import logging
import math

from protos import frontend_pb2, worker_pb2
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.request import Request
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.live import LiveRequest
from scheduler_svc.wire import delivery_from, model_result_from, response_from


def ledger(kv_cache: bool = True) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            num_blocks=16,
            block_size=4,
            max_num_seqs=4,
            max_num_batched_tokens=64,
            max_model_len=64,
            kv_cache=kv_cache,
            enable_prefix_caching=kv_cache,
            debug_invariants=True,
        )
    )


def live(rid: str, logprobs: int = -1, embedding: bool = False) -> LiveRequest:
    core = Request(
        request_id=rid,
        prompt_token_ids=[1, 2, 3],
        max_tokens=0 if embedding else 4,
        is_embedding=embedding,
    )
    return LiveRequest(
        core=core, model="m", sampling=frontend_pb2.SamplingParams(logprobs=logprobs)
    )


def step(sched: Scheduler, lives: list[LiveRequest], result: worker_pb2.StepResult) -> dict:
    by_id = {lv.request_id: lv for lv in lives}
    out = sched.schedule()
    updates = sched.update_from_output(out, model_result_from(result))
    return {u.request_id: delivery_from(u, by_id[u.request_id]) for u in updates}


def test_each_token_comes_out_with_the_logprob_the_worker_sent_with_it():
    sched, a, b = ledger(), live("a", logprobs=2), live("b", logprobs=0)
    sched.add_request(a.core)
    sched.add_request(b.core)
    result = worker_pb2.StepResult()
    result.sampled.add(request_id="a", token_id=7).logprob.CopyFrom(
        frontend_pb2.TokenLogprob(token_id=7, logprob=-0.5)
    )
    result.sampled.add(request_id="b", token_id=8).logprob.CopyFrom(
        frontend_pb2.TokenLogprob(token_id=8, logprob=-1.5)
    )
    got = step(sched, [a, b], result)
    assert [(lp.token_id, lp.logprob) for lp in got["a"].logprobs] == [(7, -0.5)]
    assert [(lp.token_id, lp.logprob) for lp in got["b"].logprobs] == [(8, -1.5)]
    response = response_from(got["a"])
    assert list(response.token_ids) == [7] and response.logprobs[0].logprob == -0.5


def test_a_request_that_asked_for_no_logprobs_gets_none():
    sched, a = ledger(), live("a")
    sched.add_request(a.core)
    result = worker_pb2.StepResult()
    result.sampled.add(request_id="a", token_id=7)
    assert step(sched, [a], result)["a"].logprobs == []


def test_a_token_that_came_without_its_logprob_gets_nan_and_a_warning(caplog):
    sched, a = ledger(), live("a", logprobs=0)
    sched.add_request(a.core)
    result = worker_pb2.StepResult()
    result.sampled.add(request_id="a", token_id=7)  # the worker sent no logprob: a bug
    with caplog.at_level(logging.WARNING):
        (entry,) = step(sched, [a], result)["a"].logprobs
    assert entry.token_id == 7 and math.isnan(entry.logprob)
    assert "request a: no logprob for token 7" in caplog.text


def test_a_logprob_for_another_token_is_not_paired_with_this_one(caplog):
    sched, a = ledger(), live("a", logprobs=0)
    sched.add_request(a.core)
    result = worker_pb2.StepResult()
    result.sampled.add(request_id="a", token_id=7).logprob.CopyFrom(
        frontend_pb2.TokenLogprob(token_id=9, logprob=-0.1)
    )
    with caplog.at_level(logging.WARNING):
        (entry,) = step(sched, [a], result)["a"].logprobs
    assert entry.token_id == 7 and math.isnan(entry.logprob)


def test_an_embedding_comes_out_with_its_request_s_final_update():
    sched, e = ledger(kv_cache=False), live("e", embedding=True)
    sched.add_request(e.core)
    result = worker_pb2.StepResult()
    result.embeddings.add(request_id="e", values=[0.5, -0.25])
    delivery = step(sched, [e], result)["e"]
    assert delivery.update.finish_reason is not None
    assert delivery.update.finish_reason.value == "stop"
    assert delivery.embedding == [0.5, -0.25]
    assert delivery.logprobs == []


def test_a_step_without_the_embedding_ends_the_request_without_one():
    sched, e = ledger(kv_cache=False), live("e", embedding=True)
    sched.add_request(e.core)
    delivery = step(sched, [e], worker_pb2.StepResult())["e"]
    assert delivery.update.finish_reason.value == "error" and delivery.embedding is None
