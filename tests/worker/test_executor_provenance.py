"""The executor's provenance check: a claimed block is read only when its recorded hash is the
claim's, a reused block loses its record before it is overwritten, and a block written in the
same step may be claimed under the hash it is written with."""

from __future__ import annotations

from protos import worker_pb2
from tests.worker.executor_plans import (
    LimitedRunner,
    RecordingRunner,
    bh,
    new_request,
)
from tests.worker.helpers import wire_step
from worker.executor import Executor


def test_claimed_block_with_matching_provenance_is_read():
    ex = Executor(RecordingRunner())
    wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[new_request("a", list(range(4)), [3], 0, 4, written=[bh(3, b"x")])]
        ),
    )
    result = wire_step(
        ex,
        worker_pb2.Plan(
            dropped_request_ids=["a"],
            new_requests=[new_request("b", list(range(6)), [3, 4], 4, 2, claimed=[bh(3, b"x")])],
        ),
    )
    assert not result.stale_request_ids and not result.removed_block_ids
    assert [s.request_id for s in result.sampled] == ["b"]
    assert ex.counters.stale_block_hits == 0


def test_claimed_block_with_other_content_is_refused_and_reported():
    runner = RecordingRunner()
    ex = Executor(runner)
    wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[new_request("a", list(range(4)), [3], 0, 4, written=[bh(3, b"x")])]
        ),
    )
    result = wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[new_request("b", list(range(6)), [3, 4], 4, 2, claimed=[bh(3, b"y")])]
        ),
    )
    assert list(result.stale_request_ids) == ["b"]
    assert list(result.removed_block_ids) == [3]
    assert not result.sampled and "b" not in ex.seqs
    assert len(runner.calls) == 1, "the refused request never reached the model"
    assert ex.counters.stale_block_hits == 1
    assert 3 not in ex.provenance.recorded()


def test_reused_block_loses_its_provenance_before_it_is_overwritten():
    ex = Executor(RecordingRunner())
    wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[new_request("a", list(range(4)), [3], 0, 4, written=[bh(3, b"x")])]
        ),
    )
    # Block 3 handed to another request as a fresh block: its old content is going away.
    wire_step(
        ex,
        worker_pb2.Plan(
            dropped_request_ids=["a"], new_requests=[new_request("c", [9, 9], [3], 0, 2)]
        ),
    )
    assert 3 not in ex.provenance.recorded()
    result = wire_step(
        ex,
        worker_pb2.Plan(
            dropped_request_ids=["c"],
            new_requests=[new_request("b", list(range(6)), [3, 4], 4, 2, claimed=[bh(3, b"x")])],
        ),
    )
    assert list(result.stale_request_ids) == ["b"]


def test_a_block_written_in_the_same_step_may_be_claimed():
    runner = LimitedRunner()
    ex = Executor(runner)
    result = wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[
                new_request("a", list(range(6)), [3, 4], 0, 6, written=[bh(3, b"x")]),
                new_request("b", list(range(4)) + [9, 9], [3, 5], 4, 2, claimed=[bh(3, b"x")]),
            ]
        ),
    )
    assert not result.stale_request_ids and not result.errors
    assert [s.request_id for s in result.sampled] == ["a", "b"]
    assert [c.request_id for c in runner.calls[0]] == ["a", "b"], "one forward pass"
    assert ex.provenance.recorded() == {3: b"x"}


def test_a_same_step_claim_with_another_hash_is_stale():
    ex = Executor(LimitedRunner())
    result = wire_step(
        ex,
        worker_pb2.Plan(
            new_requests=[
                new_request("a", list(range(6)), [3, 4], 0, 6, written=[bh(3, b"x")]),
                new_request("b", list(range(6)), [3, 5], 4, 2, claimed=[bh(3, b"y")]),
            ]
        ),
    )
    assert list(result.stale_request_ids) == ["b"]
    assert [s.request_id for s in result.sampled] == ["a"]
