"""The executor's failures: a bad request, NaN logits or a failed step end exactly the requests
they touch, forget only what may have been written, and void what was planned ahead of them."""

from __future__ import annotations

from protos import worker_pb2
from tests.worker.executor_plans import (
    FailingRunner,
    LimitedRunner,
    RecordingRunner,
    bh,
    cont,
    new_request,
)
from tests.worker.helpers import wire_step
from worker.executor import Executor
from worker.runner.batch import BatchLimits


def test_a_bad_request_fails_alone_and_its_readers_are_recomputed():
    runner = LimitedRunner()
    ex = Executor(runner)
    result = wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[
                new_request("ok", [1, 2, 3], [0], 0, 3),
                new_request("bad", [1, 2, 3, 100], [3], 0, 4, written=[bh(3, b"x")]),
                new_request("reader", [1, 2, 3, 100, 7], [3, 6], 4, 1, claimed=[bh(3, b"x")]),
                new_request("long", [1] * 65, list(range(7, 16)) + [1] * 8, 0, 65),
            ]
        ),
    )
    errors = {e.request_id: e.message for e in result.errors}
    assert sorted(errors) == ["bad", "long"]
    assert "vocabulary" in errors["bad"] and "max_model_len" in errors["long"]
    assert list(result.stale_request_ids) == ["reader"], "it would read a block never written"
    assert 3 in result.removed_block_ids
    assert [s.request_id for s in result.sampled] == ["ok"]
    assert [c.request_id for c in runner.calls[0]] == ["ok"]
    assert not result.stored and ex.provenance.recorded() == {}
    assert set(ex.seqs) == {"ok"}


def test_nan_logits_end_that_request_only():
    ex = Executor(LimitedRunner(fail=frozenset({"b"})))
    result = wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[
                new_request("a", [1, 2, 3, 4], [1], 0, 4, written=[bh(1, b"a")]),
                new_request("b", [5, 6, 7, 8], [2], 0, 4, written=[bh(2, b"b")]),
            ]
        ),
    )
    assert [(e.request_id, "NaN" in e.message) for e in result.errors] == [("b", True)]
    assert [s.request_id for s in result.sampled] == ["a"]
    assert [b.block_id for b in result.stored] == [1]
    assert "b" not in ex.seqs


def test_embedding_request_on_a_generating_stand_in_fails_alone():
    ex = Executor(RecordingRunner())
    req = new_request("e", [1, 2], [], 0, 2)
    req.embed.CopyFrom(worker_pb2.EmbedParams(normalize=True))
    result = wire_step(ex, worker_pb2.Plan(new_requests=[req, new_request("g", [1, 2], [0], 0, 2)]))
    assert [(e.request_id, "embeddings" in e.message) for e in result.errors] == [("e", True)]
    assert [s.request_id for s in result.sampled] == ["g"]


def test_a_failed_step_errors_its_requests_and_forgets_only_what_it_may_have_written():
    ex = Executor(RecordingRunner())
    wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[new_request("a", list(range(5)), [3, 4], 0, 5, written=[bh(3, b"x")])]
        ),
    )
    assert ex.provenance.recorded() == {3: b"x"}
    ex.provenance.record([(6, b"old")])  # a freed block, recycled below for b
    ex.runner = FailingRunner()
    plan = worker_pb2.Plan(
        step_id=9,
        continuing=[
            worker_pb2.ContinueRequest(
                request_id="a",
                num_computed_tokens=5,
                num_scheduled_tokens=3,
                written=[bh(4, b"y")],
            )
        ],
        # b hits a's cached block 3 and computes the rest into block 6
        new_requests=[
            new_request("b", [0, 1, 2, 3, 9], [3, 6], 4, 1, claimed=[bh(3, b"x")]),
        ],
    )
    result = wire_step(ex, plan)
    assert result.step_id == 9
    assert sorted(e.request_id for e in result.errors) == ["a", "b"]
    assert "out of memory" in result.errors[0].message
    assert not result.stale_request_ids and not result.removed_block_ids
    # block 3 was written in an earlier step and only read in this one: the scheduler still
    # caches it, so the worker keeps vouching for it; 4 and 6 were being written
    assert ex.seqs == {} and ex.provenance.recorded() == {3: b"x"}


def test_a_failed_step_keeps_its_refusals_stale():
    ex = Executor(FailingRunner())
    ex.provenance.record([(2, b"other")])
    plan = worker_pb2.Plan(
        new_requests=[
            new_request("stale", [1, 2, 3, 4, 5], [2, 7], 4, 1, claimed=[bh(2, b"mine")]),
            new_request("ok", [1, 2], [8], 0, 2),
        ]
    )
    result = wire_step(ex, plan)
    assert list(result.stale_request_ids) == ["stale"]
    assert list(result.removed_block_ids) == [2]
    assert [e.request_id for e in result.errors] == ["ok"]
    assert ex.seqs == {} and ex.provenance.recorded() == {}


def test_async_scheduling_a_refused_requests_planned_ahead_step_is_void():
    """The plan after a refusal was made before the scheduler heard of it: the worker skips
    that request's continuation (no error, no token, no provenance recorded for what it
    declares), runs the rest, and forgets the void once a plan drops the request."""
    runner = RecordingRunner()
    ex = Executor(runner)
    wire_step(ex, worker_pb2.Plan(new_requests=[new_request("a", list(range(4)), [1], 0, 4)]))
    refused = wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[new_request("b", list(range(8)), [5, 6], 4, 4, claimed=[bh(5, b"never")])]
        ),
    )
    assert list(refused.stale_request_ids) == ["b"]
    ahead = wire_step(
        ex, worker_pb2.Plan(continuing=[cont("b", 8, written=[bh(6, b"h6")]), cont("a", 4)])
    )
    assert list(ahead.errors) == [] and [s.request_id for s in ahead.sampled] == ["a"]
    assert 6 not in ex.provenance.recorded() and list(ahead.stored) == []
    wire_step(ex, worker_pb2.Plan(dropped_request_ids=["b"]))
    assert "b" not in ex.voided


def test_async_scheduling_an_errored_requests_planned_ahead_step_is_void():
    limits = BatchLimits(block_size=16, num_blocks=8, vocab_size=1000, max_model_len=64)
    ex = Executor(RecordingRunner(limits))
    bad = new_request("x", [0, 99999], [1], 0, 2)  # outside the vocabulary: fails alone
    first = wire_step(ex, worker_pb2.Plan(new_requests=[bad]))
    assert [e.request_id for e in first.errors] == ["x"]
    ahead = wire_step(ex, worker_pb2.Plan(continuing=[cont("x", 2)]))
    assert list(ahead.errors) == [] and list(ahead.sampled) == []


def test_a_continuation_of_a_request_the_worker_never_held_still_fails_the_step():
    """Only requests the worker failed or refused are void: anything else is a bug, loudly."""
    ex = Executor(RecordingRunner())
    result = wire_step(ex, worker_pb2.Plan(continuing=[cont("ghost", 3)]))
    assert [e.request_id for e in result.errors] == ["ghost"]
