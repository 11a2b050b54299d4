"""The worker's executor: per-request state from plan deltas and the provenance check."""

from __future__ import annotations

import pytest

from protos import frontend_pb2, worker_pb2
from tests.worker.helpers import wire_step
from worker.batch import BatchLimits, SeqChunk
from worker.executor import Executor
from worker.pooling import EmbedItem
from worker.sampler import Sample, TokenLogprobs

# Wide enough for every plan below that is not about limits.
WIDE = BatchLimits(block_size=16, num_blocks=16, vocab_size=1000, max_model_len=256)


class RecordingRunner:
    """Stands in for the model at the edge of this unit: returns len(context) as the token. A
    complete `Runner` that generates and computes no embeddings."""

    kind = "generate"
    embedding_size = 0

    def __init__(self, limits: BatchLimits = WIDE) -> None:
        self.limits = limits
        self.calls: list[list[SeqChunk]] = []

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        self.calls.append(chunks)
        return [Sample(c.end_pos) if c.sample else None for c in chunks]

    def embed(self, items: list[EmbedItem]) -> list[list[float]]:
        raise AssertionError("embedding_size 0: the executor never asks")


def bh(block_id: int, tag: bytes) -> worker_pb2.BlockHash:
    return worker_pb2.BlockHash(block_id=block_id, hash=tag)


def new_request(
    rid: str,
    tokens: list[int],
    blocks: list[int],
    computed: int,
    scheduled: int,
    claimed=(),
    written=(),
) -> worker_pb2.NewRequest:
    return worker_pb2.NewRequest(
        request_id=rid,
        token_ids=tokens,
        block_ids=blocks,
        num_computed_tokens=computed,
        num_scheduled_tokens=scheduled,
        num_prompt_tokens=len(tokens),
        claimed=list(claimed),
        written=list(written),
    )


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


# ---- same-step sharing, per-request failures ---------------------------------------------


class LimitedRunner(RecordingRunner):
    """With tight limits, which the executor checks each chunk against; can fail chosen
    requests' samples, and gives logprobs to those that ask."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        super().__init__(BatchLimits(block_size=4, num_blocks=16, vocab_size=100, max_model_len=64))
        self.fail = fail

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        samples = super().execute(chunks)
        return [
            None
            if s is None
            else Sample(error="the model produced NaN or infinite logits")
            if c.request_id in self.fail
            else Sample(
                s.token_id,
                TokenLogprobs(-0.5, [s.token_id, 1], [-0.5, -2.0])
                if c.sampling.logprobs >= 0
                else None,
            )
            for c, s in zip(chunks, samples, strict=True)
        ]


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


def test_embedding_request_on_a_generating_stand_in_fails_alone():
    ex = Executor(RecordingRunner())
    req = new_request("e", [1, 2], [], 0, 2)
    req.embed.CopyFrom(worker_pb2.EmbedParams(normalize=True))
    result = wire_step(ex, worker_pb2.Plan(new_requests=[req, new_request("g", [1, 2], [0], 0, 2)]))
    assert [(e.request_id, "embeddings" in e.message) for e in result.errors] == [("e", True)]
    assert [s.request_id for s in result.sampled] == ["g"]


class FailingRunner(RecordingRunner):
    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        raise RuntimeError("out of memory")


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


def _cont(rid: str, computed: int, written=()) -> worker_pb2.ContinueRequest:  # noqa: ANN001
    return worker_pb2.ContinueRequest(
        request_id=rid,
        num_computed_tokens=computed,
        num_scheduled_tokens=1,
        written=list(written),
    )


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
        ex, worker_pb2.Plan(continuing=[_cont("b", 8, written=[bh(6, b"h6")]), _cont("a", 4)])
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
    ahead = wire_step(ex, worker_pb2.Plan(continuing=[_cont("x", 2)]))
    assert list(ahead.errors) == [] and list(ahead.sampled) == []


def test_a_continuation_of_a_request_the_worker_never_held_still_fails_the_step():
    """Only requests the worker failed or refused are void: anything else is a bug, loudly."""
    ex = Executor(RecordingRunner())
    result = wire_step(ex, worker_pb2.Plan(continuing=[_cont("ghost", 3)]))
    assert [e.request_id for e in result.errors] == ["ghost"]
