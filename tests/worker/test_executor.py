"""The worker's executor: per-request state from plan deltas (prefill, chunks, decode, reset,
preemption) and the sampling parameters each chunk carries."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from kvledger.structured import StructuredSpec
from protos import frontend_pb2, worker_pb2
from tests.worker.executor_plans import LimitedRunner, RecordingRunner, bh, new_request
from tests.worker.helpers import wire_step
from worker.executor import Executor
from worker.sample.constraints import Constraint


def test_prefill_then_decode_follows_plan_deltas():
    runner = RecordingRunner()
    ex = Executor(runner)
    plan = worker_pb2.Plan(
        step_id=1,
        new_requests=[new_request("a", list(range(6)), [7, 8], 0, 6, written=[bh(7, b"h0")])],
    )
    result = wire_step(ex, plan)
    assert [(s.request_id, s.token_id) for s in result.sampled] == [("a", 6)]
    assert [(b.block_id, b.hash) for b in result.stored] == [(7, b"h0")]
    assert runner.calls[0][0].token_ids == list(range(6))
    plan = worker_pb2.Plan(
        step_id=2,
        continuing=[
            worker_pb2.ContinueRequest(
                request_id="a", new_block_ids=[], num_computed_tokens=6, num_scheduled_tokens=1
            )
        ],
    )
    result = wire_step(ex, plan)
    chunk = runner.calls[1][0]
    assert (chunk.token_ids, chunk.start_pos, chunk.block_table) == ([6], 6, [7, 8])
    assert [s.token_id for s in result.sampled] == [7]
    wire_step(ex, worker_pb2.Plan(step_id=3, dropped_request_ids=["a"]))
    assert ex.seqs == {}


def test_chunked_prefill_samples_only_at_the_end_of_the_prompt():
    runner = RecordingRunner()
    ex = Executor(runner)
    result = wire_step(
        ex, worker_pb2.Plan(new_requests=[new_request("a", list(range(10)), [1, 2], 0, 4)])
    )
    assert not result.sampled and runner.calls[0][0].sample is False
    result = wire_step(
        ex,
        worker_pb2.Plan(
            continuing=[
                worker_pb2.ContinueRequest(
                    request_id="a", num_computed_tokens=4, num_scheduled_tokens=6
                )
            ]
        ),
    )
    assert [s.token_id for s in result.sampled] == [10]


def test_reset_forgets_everything():
    ex = Executor(RecordingRunner())
    wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[new_request("a", list(range(4)), [3], 0, 4, written=[bh(3, b"x")])]
        ),
    )
    ex.reset()
    assert ex.seqs == {} and ex.provenance.recorded() == {}


def test_sampling_params_reach_the_chunk():
    runner = LimitedRunner()
    ex = Executor(runner)
    sp = frontend_pb2.SamplingParams(
        temperature=0.7,
        top_k=5,
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.2,
        seed=11,
        logprobs=2,
    )
    req = new_request("a", [1, 2, 3], [0], 0, 3)
    req.sampling.CopyFrom(sp)
    result = wire_step(ex, worker_pb2.Plan(new_requests=[req]))
    c = runner.calls[0][0].sampling
    assert (c.temperature, c.top_k, c.top_p, c.seed, c.logprobs) == (
        pytest.approx(0.7),
        5,
        1.0,
        11,
        2,
    )
    assert (c.min_p, c.presence_penalty, c.frequency_penalty, c.repetition_penalty) == (
        pytest.approx(0.1),
        0.5,
        0.25,
        pytest.approx(1.2),
    )
    lp = result.sampled[0].logprob
    assert (lp.token_id, lp.logprob) == (3, -0.5)
    assert [(t.token_id, t.logprob) for t in lp.top] == [(3, -0.5), (1, -2.0)]
    # proto3 zeros mean "off": an unset top_p / repetition_penalty must not filter everything
    plain = new_request("p", [1], [1], 0, 1)
    wire_step(ex, worker_pb2.Plan(new_requests=[plain]))
    c = runner.calls[1][0].sampling
    assert (c.top_p, c.repetition_penalty, c.seed) == (1.0, 1.0, None)


def test_prompt_and_output_stay_apart_across_preemption():
    runner = LimitedRunner()
    ex = Executor(runner)
    wire_step(ex, worker_pb2.Plan(new_requests=[new_request("a", [1, 2, 3, 4], [0, 1], 0, 4)]))
    cont = worker_pb2.ContinueRequest(request_id="a", num_computed_tokens=4, num_scheduled_tokens=1)
    wire_step(ex, worker_pb2.Plan(continuing=[cont]))
    assert ex.seqs["a"].token_ids == [1, 2, 3, 4, 4, 5]
    # Preempted, then back with every token to date: 4 prompt tokens, 2 outputs.
    back = new_request("a", [1, 2, 3, 4, 4, 5], [6, 7], 0, 6)
    back.num_prompt_tokens = 4
    wire_step(ex, worker_pb2.Plan(dropped_request_ids=["a"], new_requests=[back]))
    chunk = runner.calls[-1][0]
    assert chunk.num_prompt_tokens == 4
    assert list(chunk.all_token_ids[:4]) == [1, 2, 3, 4]
    assert list(chunk.all_token_ids[4 : chunk.end_pos]) == [4, 5]


class CompilingRunner(RecordingRunner):
    """A runner whose grammars compile when the test says: each spec's compile is a Future
    the test completes (the real engine's compile thread at the edge of this unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.compiles: dict[str, Future] = {}

    def constraint(self, spec: StructuredSpec) -> Constraint:
        template = self.compiles.setdefault(spec.spec, Future())
        return Constraint(template, frozenset({0}))


def _structured(rid: str, tokens: list[int], blocks: list[int], regex: str, written=()):
    req = new_request(rid, tokens, blocks, 0, len(tokens), written=written)
    req.sampling.structured.CopyFrom(frontend_pb2.StructuredOutput(kind="regex", spec=regex))
    return req


def test_a_request_whose_grammar_still_compiles_is_deferred_while_others_run():
    """Beside a decoding request, a new structured request whose compile is not done is left
    out of the step (the other request's token does not wait for the compile): reported
    deferred, its blocks not declared written, and voided until a plan drops it. Placed again
    once compiled, it runs."""
    runner = CompilingRunner()
    ex = Executor(runner)
    wire_step(ex, worker_pb2.Plan(step_id=1, new_requests=[new_request("a", [1, 2], [0], 0, 2)]))
    cont = worker_pb2.ContinueRequest(
        request_id="a", new_block_ids=[], num_computed_tokens=2, num_scheduled_tokens=1
    )
    plan = worker_pb2.Plan(
        step_id=2,
        continuing=[cont],
        new_requests=[_structured("j", list(range(16)), [1], "x+", written=[bh(1, b"j0")])],
    )
    result = wire_step(ex, plan)
    assert list(result.deferred_request_ids) == ["j"]
    assert [s.request_id for s in result.sampled] == ["a"]
    assert [c.request_id for c in runner.calls[-1]] == ["a"]
    assert list(result.stored) == [] and not result.errors
    assert "j" in ex.voided and "j" not in ex.seqs
    runner.compiles["x+"].set_result(object())
    cont.num_computed_tokens = 3
    plan = worker_pb2.Plan(
        step_id=3,
        dropped_request_ids=["j"],
        continuing=[cont],
        new_requests=[_structured("j", list(range(16)), [1], "x+", written=[bh(1, b"j0")])],
    )
    result = wire_step(ex, plan)
    assert not result.deferred_request_ids
    assert sorted(s.request_id for s in result.sampled) == ["a", "j"]
    assert [(b.block_id, b.hash) for b in result.stored] == [(1, b"j0")]


def test_requests_whose_grammar_compiles_run_when_nothing_else_would_wait():
    """Alone on the worker, a structured request is not deferred: its step waits for the
    compile, and no other request waits on this worker meanwhile."""
    runner = CompilingRunner()
    ex = Executor(runner)
    result = wire_step(
        ex, worker_pb2.Plan(step_id=1, new_requests=[_structured("j", [1, 2], [0], "y")])
    )
    assert not result.deferred_request_ids
    assert [s.request_id for s in result.sampled] == ["j"]


def test_a_tensor_parallel_groups_executor_never_defers():
    """Every rank of a group runs the executor on the same plan and must build the same batch;
    each would see its compile finish at its own moment, so a group waits for compiles."""
    runner = CompilingRunner()
    ex = Executor(runner, defer_compiles=False)
    plan = worker_pb2.Plan(
        step_id=1,
        new_requests=[new_request("a", [1, 2], [0], 0, 2), _structured("j", [3, 4], [1], "z")],
    )
    result = wire_step(ex, plan)
    assert not result.deferred_request_ids
    assert sorted(s.request_id for s in result.sampled) == ["a", "j"]
