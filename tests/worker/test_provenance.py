"""The provenance check on its own: what the worker vouches for, which claims it lets a request
read, and which declared writes it records once a plan ran (no runner, no wire)."""

from __future__ import annotations

from worker.link.step import ContinueSeq, EmbedParams, NewSeq, StepPlan
from worker.provenance import PlanWrites, Provenance
from worker.sample.sampling_params import GREEDY


def new(rid: str, claimed=(), written=(), embed: EmbedParams | None = None) -> NewSeq:  # noqa: ANN001
    return NewSeq(rid, [1, 2, 3], [0], 0, 3, 3, GREEDY, list(claimed), list(written), embed)


def cont(rid: str, written=()) -> ContinueSeq:  # noqa: ANN001
    return ContinueSeq(rid, [], 3, 1, list(written))


def test_a_claim_is_read_only_when_the_recorded_hash_is_the_declared_one():
    prov = Provenance()
    prov.record([(3, b"x")])
    step = PlanWrites.of(StepPlan(), voided=set())
    assert prov.verify("a", [(3, b"x")], step) == []
    assert prov.verify("b", [(3, b"y"), (4, b"z")], step) == [3, 4], "other content; never written"
    assert step.reads_from == {}


def test_forgotten_and_cleared_blocks_are_vouched_for_no_more():
    prov = Provenance()
    prov.record([(1, b"a"), (2, b"b"), (3, b"c")])
    prov.forget([2, 9])
    assert prov.recorded() == {1: b"a", 3: b"c"}
    prov.clear()
    assert prov.recorded() == {}
    assert prov.verify("r", [(1, b"a")], PlanWrites.of(StepPlan(), set())) == [1]


def test_a_block_written_in_the_same_plan_may_be_claimed_with_its_hash_only():
    plan = StepPlan(new=[new("w", written=[(5, b"h")])])
    step = PlanWrites.of(plan, voided=set())
    prov = Provenance()
    assert prov.verify("reader", [(5, b"h")], step) == []
    assert step.reads_from == {"reader": {"w"}}
    assert prov.verify("other", [(5, b"g")], step) == [5]
    assert "other" not in step.reads_from
    # A request's own declaration is no proof of what the block holds before this step.
    assert prov.verify("w", [(5, b"h")], step) == [5]


def test_void_continuations_and_embedding_requests_declare_no_pending_write():
    plan = StepPlan(
        new=[new("e", written=[(1, b"e")], embed=EmbedParams(True, 0))],
        cont=[cont("gone", written=[(2, b"g")]), cont("live", written=[(3, b"l")])],
    )
    assert PlanWrites.of(plan, voided={"gone"}).pending == {3: (b"l", "live")}


def test_readers_of_a_failed_writer_are_refused_in_turn():
    plan = StepPlan(
        new=[
            new("bad", written=[(1, b"a")]),
            new("r1", claimed=[(1, b"a")], written=[(2, b"b")]),
            new("r2", claimed=[(2, b"b")]),
            new("ok"),
        ]
    )
    step = PlanWrites.of(plan, voided=set())
    prov = Provenance()
    for item in plan.new[1:]:
        assert prov.verify(item.request_id, item.claimed, step) == []
    step.failed.add("bad")
    tables = {"r1": [1, 2], "r2": [1, 2, 7], "ok": [9]}
    assert step.unwritten_reads(tables) == {"r1": [1], "r2": [2]}
    assert step.failed == {"bad", "r1", "r2"}


def test_only_what_ran_and_wrote_kv_is_settled_as_written():
    plan = StepPlan(
        new=[
            new("ok", written=[(1, b"o")]),
            new("failed", written=[(2, b"f")]),
            new("emb", written=[(3, b"e")], embed=EmbedParams(True, 0)),
        ],
        cont=[cont("void", written=[(4, b"v")]), cont("more", written=[(5, b"m")])],
    )
    step = PlanWrites.of(plan, voided={"void"})
    step.void.add("void")
    step.failed.add("failed")
    step.no_kv.add("emb")
    written, unwritten = step.settle(plan)
    assert written == [(1, b"o"), (5, b"m")]
    assert unwritten == [3], "the scheduler believes the embedding pass wrote it"
