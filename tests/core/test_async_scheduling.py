"""Async scheduling: the next plan is made while the worker runs the previous one, so a decode
step is planned on a token the scheduler does not know yet (a placeholder). Each rule the
ledger keeps with two plans in flight, on small exact cases; tests/core/test_stateful.py drives
the same with random arrivals, aborts, faults and worker loss (LedgerAhead*)."""

from __future__ import annotations

from scheduler_svc.core import FinishReason, Scheduler
from tests.core.fakes import FakeWorker
from tests.core.harness import Harness, config, has_unfinished, request


def ahead(**overrides: object) -> Harness:
    cfg = config(**overrides)
    return Harness(Scheduler(cfg), FakeWorker(cfg.block_size, late=True))


def lockstep_outputs(*requests, **overrides) -> dict[str, list[int]]:  # noqa: ANN002, ANN003
    h = Harness.build(**overrides)
    h.add(*requests)
    h.run_to_idle()
    return {r.request_id: h.outputs(r.request_id) for r in requests}


def drain(h: Harness) -> None:
    while h.in_flight:
        h.finish_step()
    h.run_to_idle()
    snap = h.sched.snapshot()
    assert snap.blocks_in_use == 0 and snap.tracker_entries == 0


def test_a_decode_step_is_planned_on_the_token_still_being_sampled():
    h = ahead()
    h.add(request("r", range(6), max_tokens=5))
    first = h.plan()  # prefill: samples token 6
    second = h.plan()  # planned before the first result: position 6, token unknown here
    [cont] = second.cont
    assert (cont.num_computed_tokens, cont.num_scheduled_tokens, cont.samples) == (6, 1, True)
    r = h.sched.requests["r"]
    assert (r.num_tokens, r.num_computed_tokens, r.num_placeholders) == (6, 7, 2)
    assert first.new[0].samples
    while has_unfinished(h.sched) or h.in_flight:
        if len(h.pending) < 2:
            h.plan()
        h.finish_step()
    assert h.outputs("r") == lockstep_outputs(request("r", range(6), max_tokens=5))["r"]


def test_a_block_a_placeholder_fills_is_declared_once_its_token_is_known():
    h = ahead(block_size=4)
    h.add(request("r", range(7), max_tokens=4))
    first = h.plan()  # positions 0-6: block 0 full
    assert [b for b, _ in first.new[0].written] == [h.table("r")[0]]
    second = h.plan()  # position 7 on the placeholder: fills block 1, whose token is unknown
    assert second.cont[0].written == []
    h.finish_step()  # token 7 known
    third = h.plan()  # declares block 1 now; the worker wrote it in the second step
    assert [b for b, _ in third.cont[0].written] == [h.table("r")[1]]
    drain(h)


def test_no_step_is_planned_past_max_tokens():
    h = ahead()
    h.add(request("r", range(6), max_tokens=1))
    h.plan()
    assert h.plan().is_empty, "max_tokens 1: the first sampled token ends the request"
    drain(h)
    assert len(h.outputs("r")) == 1


def test_an_eos_while_a_step_is_in_flight_discards_that_steps_token():
    h = Harness(Scheduler(config()), FakeWorker(4, late=True, next_token=lambda rid, t: 7))
    h.add(request("r", range(6), max_tokens=5, eos_token_ids=frozenset({7})))
    h.plan()
    h.plan()  # a second decode step, on a token that will be EOS
    h.finish_step()
    assert h.finish_of("r").finish_reason is FinishReason.STOP
    third = h.plan()
    assert "r" in third.dropped_request_ids
    h.finish_step()  # the void step's token is ignored
    assert h.outputs("r") == [7]
    drain(h)


def test_an_abort_with_two_plans_in_flight_frees_everything_and_streams_nothing_more():
    h = ahead()
    h.add(request("r", range(6), max_tokens=8))
    h.plan()
    h.plan()
    assert h.sched.abort_request("r")
    h.finish_step()
    h.finish_step()
    assert h.outputs("r") == []
    drain(h)


def test_a_request_failed_in_one_plan_is_void_in_the_next_and_uncaches_its_declarations():
    h = ahead(block_size=4)
    h.add(request("r", range(7), max_tokens=6))
    h.plan()
    h.finish_step()
    mid = h.plan()  # position 7: fills and declares block 1
    [(block, _)] = mid.cont[0].written
    assert block in h.cached()
    later = h.plan()  # position 8, on a placeholder
    h.finish_step(errored={"r": "boom"})  # the worker fails r: `later` is void for it
    assert block not in h.cached(), "a block whose write failed stays cached"
    assert later.cont, "the void step is still in flight"
    h.finish_step()  # the worker skips r's continuation; nothing is applied
    assert h.finish_of("r").finish_reason is FinishReason.ERROR
    drain(h)


def test_a_refused_claim_with_its_decode_step_planned_ahead_recomputes_exactly():
    h = ahead(block_size=2)
    h.add(request("a", range(6), max_tokens=3))
    h.run_to_idle()
    h.add(request("b", [*range(6), 9], max_tokens=3))
    h.plan()  # b claims a's blocks
    h.worker.corrupt(h.table("b")[0])
    h.plan()  # b's decode step on its placeholder
    h.finish_step()  # b refused (stale): requeued
    h.plan()  # b admitted again, while the void step is still in flight
    h.finish_step()  # the void step: nothing for b
    drain(h)
    assert h.finish_of("b").finish_reason is FinishReason.LENGTH
    assert h.outputs("b") == lockstep_outputs(request("b", [*range(6), 9], max_tokens=3))["b"]
    assert h.sched.stats.stale_entries["worker_report"] == 1


def test_a_claim_on_a_failed_requests_later_declaration_is_refused_and_recomputed():
    """A request fails in the oldest plan, which declared nothing (half a block); the next
    plan in flight declares its first block, and a plan made before the failure was known lets
    another request claim it. The worker skips the failed request there, so the block is never
    written: its hash must go, the claim must be refused (not read), and the claimant
    recomputes to the same output."""
    h = ahead(block_size=4, max_num_batched_tokens=2)
    h.add(request("r", range(4), max_tokens=3))
    first = h.plan()  # r: tokens 0-1, no full block
    assert first.new[0].written == []
    second = h.plan()  # r: tokens 2-3, block 0 declared here
    [(block, _)] = second.cont[0].written
    h.add(request("s", [*range(4), 9], max_tokens=3))
    third = h.plan()  # s claims block 0, still in flight
    assert [b for b, _ in third.new[0].claimed] == [block]
    h.finish_step(errored={"r": "boom"})  # r fails: `second` is void for it
    assert block not in h.cached(), "a later plan's declaration of a failed request stays cached"
    h.finish_step()  # the worker skips r: block 0 is never written
    h.finish_step()  # s's claim on it is refused: s goes back to recompute
    assert h.sched.stats.stale_entries["worker_report"] == 1
    drain(h)
    assert h.finish_of("r").finish_reason is FinishReason.ERROR
    assert h.finish_of("s").finish_reason is FinishReason.LENGTH
    assert h.outputs("s") == lockstep_outputs(request("s", [*range(4), 9], max_tokens=3))["s"]


def test_bundles_a_turn_of_an_aborted_request_claims_blocks_its_failed_write_voids():
    """The example hypothesis found (LedgerBundlesWithKV): five plans in flight; r0 aborted
    with its writes in flight, a follow-up turn claims them, then r0's first plan fails."""
    h = ahead(
        num_blocks=6, block_size=1, max_num_seqs=2, max_num_batched_tokens=3, max_model_len=24
    )
    h.add(request("r0", [1, 2, 3, 4, 0], max_tokens=4), request("r1", [0], max_tokens=4))
    h.plan()
    h.add(request("r2", [], max_tokens=0))
    h.plan()
    h.plan()
    assert h.sched.abort_request("r0")
    h.add(request("r3", [], max_tokens=0), request("r4", [1, 2, 3, 4, 0], max_tokens=1))
    h.plan()  # r4 claims r0's blocks, whose writes are still in flight
    h.plan()
    h.finish_step(errored={"r0": "boom"})
    h.plan()
    while len(h.pending) > 2:
        h.finish_step()  # the plan in which r4's claim is refused: explained, not stale
    drain(h)
    assert h.outputs("r4") == lockstep_outputs(request("r4", [1, 2, 3, 4, 0], max_tokens=1))["r4"]
