"""The worker's executor: per-request state from plan deltas and the provenance check."""

from __future__ import annotations

from protos import worker_pb2
from worker.batch import SeqChunk
from worker.executor import Executor


class RecordingRunner:
    """Stands in for the model at the edge of this unit: returns len(context) as the token."""

    def __init__(self) -> None:
        self.calls: list[list[SeqChunk]] = []

    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        self.calls.append(chunks)
        return [c.start_pos + len(c.token_ids) if c.sample else None for c in chunks]


def bh(block_id: int, tag: bytes) -> worker_pb2.BlockHash:
    return worker_pb2.BlockHash(block_id=block_id, hash=tag)


def new_request(rid: str, tokens: list[int], blocks: list[int], computed: int, scheduled: int,
                claimed=(), written=()) -> worker_pb2.NewRequest:
    return worker_pb2.NewRequest(request_id=rid, token_ids=tokens, block_ids=blocks,
                                 num_computed_tokens=computed, num_scheduled_tokens=scheduled,
                                 num_prompt_tokens=len(tokens), claimed=list(claimed),
                                 written=list(written))


def test_prefill_then_decode_follows_plan_deltas():
    runner = RecordingRunner()
    ex = Executor(runner)
    plan = worker_pb2.Plan(step_id=1, new_requests=[
        new_request("a", list(range(6)), [7, 8], 0, 6, written=[bh(7, b"h0")])])
    result = ex.step(plan)
    assert [(s.request_id, s.token_id) for s in result.sampled] == [("a", 6)]
    assert [(b.block_id, b.hash) for b in result.stored] == [(7, b"h0")]
    assert runner.calls[0][0].token_ids == list(range(6))
    plan = worker_pb2.Plan(step_id=2, continuing=[worker_pb2.ContinueRequest(
        request_id="a", new_block_ids=[], num_computed_tokens=6, num_scheduled_tokens=1)])
    result = ex.step(plan)
    chunk = runner.calls[1][0]
    assert (chunk.token_ids, chunk.start_pos, chunk.block_table) == ([6], 6, [7, 8])
    assert [s.token_id for s in result.sampled] == [7]
    ex.step(worker_pb2.Plan(step_id=3, dropped_request_ids=["a"]))
    assert ex.seqs == {}


def test_chunked_prefill_samples_only_at_the_end_of_the_prompt():
    runner = RecordingRunner()
    ex = Executor(runner)
    result = ex.step(worker_pb2.Plan(new_requests=[
        new_request("a", list(range(10)), [1, 2], 0, 4)]))
    assert not result.sampled and runner.calls[0][0].sample is False
    result = ex.step(worker_pb2.Plan(continuing=[worker_pb2.ContinueRequest(
        request_id="a", num_computed_tokens=4, num_scheduled_tokens=6)]))
    assert [s.token_id for s in result.sampled] == [10]


def test_claimed_block_with_matching_provenance_is_read():
    ex = Executor(RecordingRunner())
    ex.step(worker_pb2.Plan(new_requests=[
        new_request("a", list(range(4)), [3], 0, 4, written=[bh(3, b"x")])]))
    result = ex.step(worker_pb2.Plan(dropped_request_ids=["a"], new_requests=[
        new_request("b", list(range(6)), [3, 4], 4, 2, claimed=[bh(3, b"x")])]))
    assert not result.stale_request_ids and not result.removed_block_ids
    assert [s.request_id for s in result.sampled] == ["b"]
    assert ex.counters.stale_block_hits == 0


def test_claimed_block_with_other_content_is_refused_and_reported():
    runner = RecordingRunner()
    ex = Executor(runner)
    ex.step(worker_pb2.Plan(new_requests=[
        new_request("a", list(range(4)), [3], 0, 4, written=[bh(3, b"x")])]))
    result = ex.step(worker_pb2.Plan(new_requests=[
        new_request("b", list(range(6)), [3, 4], 4, 2, claimed=[bh(3, b"y")])]))
    assert list(result.stale_request_ids) == ["b"]
    assert list(result.removed_block_ids) == [3]
    assert not result.sampled and "b" not in ex.seqs
    assert len(runner.calls) == 1, "the refused request never reached the model"
    assert ex.counters.stale_block_hits == 1
    assert 3 not in ex.provenance


def test_reused_block_loses_its_provenance_before_it_is_overwritten():
    ex = Executor(RecordingRunner())
    ex.step(worker_pb2.Plan(new_requests=[
        new_request("a", list(range(4)), [3], 0, 4, written=[bh(3, b"x")])]))
    # Block 3 handed to another request as a fresh block: its old content is going away.
    ex.step(worker_pb2.Plan(dropped_request_ids=["a"], new_requests=[
        new_request("c", [9, 9], [3], 0, 2)]))
    assert 3 not in ex.provenance
    result = ex.step(worker_pb2.Plan(dropped_request_ids=["c"], new_requests=[
        new_request("b", list(range(6)), [3, 4], 4, 2, claimed=[bh(3, b"x")])]))
    assert list(result.stale_request_ids) == ["b"]


def test_reset_forgets_everything():
    ex = Executor(RecordingRunner())
    ex.step(worker_pb2.Plan(new_requests=[
        new_request("a", list(range(4)), [3], 0, 4, written=[bh(3, b"x")])]))
    ex.reset()
    assert ex.seqs == {} and ex.provenance == {}
