"""Speculative decoding in the ledger (core/speculative.py): drafting, the budget drafts take,
the worker's verdict applied, and the slots of rejected drafts given back. The fake worker
writes every drafted token as it is, so a block holding a rejected draft that the ledger
published or let a request claim fails the test at once; tests/core/test_stateful.py drives the
same with random arrivals, faults and plans ahead (LedgerSpeculative*)."""

from __future__ import annotations

from scheduler_svc.core import FinishReason, Scheduler
from scheduler_svc.core.speculative import (
    MAX_BACKOFF_STEPS,
    DraftState,
    NgramIndex,
    SpecConfig,
    propose,
    settle,
)
from tests.core.fakes import FakeWorker
from tests.core.harness import Harness, config, request

NGRAM = SpecConfig(num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=4)
PERIOD = [11, 12, 13, 14, 15]


def repeats(rid: str, seen: list[int]) -> int:
    """A model that repeats its text with period 5: every n-gram draft is right."""
    return seen[-len(PERIOD)]


def drifts(rid: str, seen: list[int]) -> int:
    """Follows the period, but every seventh token breaks from it: drafts partly kept."""
    return 20 if len(seen) % 7 == 0 else seen[-len(PERIOD)]


def harness(spec: SpecConfig | None, next_token=repeats, **overrides: object) -> Harness:  # noqa: ANN001
    cfg = config(**{"speculative": spec, "num_blocks": 32, **overrides})
    return Harness(Scheduler(cfg), FakeWorker(cfg.block_size, next_token=next_token, late=True))


def run(spec: SpecConfig | None, *requests, next_token=repeats, **overrides) -> Harness:  # noqa: ANN001, ANN002, ANN003
    h = harness(spec, next_token, **overrides)
    h.add(*requests)
    steps = 0
    while h.sched.requests or h.sched._dropped:
        h.step()
        h.check_cache()
        steps += 1
        assert steps < 500
    snap = h.sched.snapshot()
    assert (snap.blocks_in_use, snap.tracker_entries) == (0, 0)
    h.steps = steps  # type: ignore[attr-defined]
    return h


def prompt() -> list[int]:
    return PERIOD * 2


# -- drafting -------------------------------------------------------------------------------


def test_the_index_finds_the_longest_earlier_match_and_the_latest_among_equals():
    tokens = [1, 2, 3, 9, 2, 3, 7, 1, 2, 3]
    index = NgramIndex(2)
    end, matched = index.best_match(tokens, max_match=5)
    assert (end, matched) == (3, 3)  # [1, 2, 3] at 0-2 beats [2, 3] at 4-5
    index = NgramIndex(2)
    assert index.best_match([5, 6, 1, 5, 6, 2, 5, 6], max_match=2) == (5, 2)  # the latest


def test_ngram_drafts_the_tokens_that_followed_the_match():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    state = DraftState(NgramIndex(2))
    assert propose(NGRAM, state, tokens, limit=8) == [3, 4, 5, 6]
    assert propose(NGRAM, state, tokens, limit=2) == [3, 4]
    assert propose(NGRAM, DraftState(NgramIndex(2)), [1, 2, 3, 4], limit=8) == []


def test_suffix_drafts_grow_with_the_match():
    spec = SpecConfig(method="suffix", num_speculative_tokens=8, prompt_lookup_min=1)
    text = [40, 41, 42, 43, 44, 45, 46, 47, 48]
    short = [7, *text, 40]  # the tail matches one token
    long = [7, *text, 40, 41, 42, 43]  # four
    assert propose(spec, DraftState(NgramIndex(1)), short, limit=8) == [41]
    assert propose(spec, DraftState(NgramIndex(1)), long, limit=8) == [44, 45, 46, 47]


def test_a_fully_rejected_draft_backs_off_twice_as_long_each_time():
    state = DraftState(NgramIndex(2))
    waits = []
    for _ in range(6):
        settle(state, num_drafted=3, num_accepted=0)
        waits.append(state.wait)
    assert waits == [1, 2, 4, 8, 16, MAX_BACKOFF_STEPS]
    tokens = [1, 2, 3, 1, 2]
    assert all(propose(NGRAM, state, tokens, 4) == [] for _ in range(MAX_BACKOFF_STEPS))
    assert propose(NGRAM, state, tokens, 4) == [3, 1, 2]
    settle(state, num_drafted=3, num_accepted=1)
    assert state.backoff == 0


# -- the ledger -----------------------------------------------------------------------------


def test_kept_drafts_give_the_same_tokens_in_fewer_steps():
    off = run(None, request("r", prompt(), max_tokens=24))
    on = run(NGRAM, request("r", prompt(), max_tokens=24))
    assert on.outputs("r") == off.outputs("r") and len(off.outputs("r")) == 24
    assert on.steps < off.steps / 3  # type: ignore[attr-defined]
    snap = on.sched.snapshot()
    assert snap.spec_accepted_tokens == snap.spec_draft_tokens > 0
    assert snap.spec_accepted_per_position["0"] == snap.spec_drafts


def test_rejected_drafts_change_no_token_and_their_blocks_are_never_published():
    requests = [request(f"r{i}", [i, *prompt()], max_tokens=30) for i in range(3)]
    again = [request(r.request_id, r.prompt_token_ids, 30) for r in requests]
    off = run(None, *requests, next_token=drifts, block_size=2, num_blocks=128)
    on = run(NGRAM, *again, next_token=drifts, block_size=2, num_blocks=128)
    for r in requests:
        assert on.outputs(r.request_id) == off.outputs(r.request_id)
    snap = on.sched.snapshot()
    assert 0 < snap.spec_accepted_tokens < snap.spec_draft_tokens
    # a follow-up turn claims the cached text: every claim is checked against what the
    # fake worker really wrote (a block that held a rejected draft would fail)
    follow = request("f", [0, *prompt(), *on.outputs("r0")], max_tokens=4)
    h = on
    h.add(follow)
    while h.sched.requests or h.sched._dropped:
        h.step()
        h.check_cache()
    assert h.finish_of("f").num_cached_tokens > 0 and h.worker.claims_checked > 0


def test_drafts_stop_at_max_tokens_the_context_and_the_budget():
    h = run(NGRAM, request("r", prompt(), max_tokens=7))
    assert len(h.outputs("r")) == 7
    h = run(NGRAM, request("r", prompt(), max_tokens=40), max_model_len=16)
    assert len(prompt()) + len(h.outputs("r")) == 16
    h = harness(NGRAM, max_num_batched_tokens=3, enable_chunked_prefill=True)
    h.add(request("r", prompt(), max_tokens=10))
    while h.sched.requests:
        out = h.step()
        assert out.num_batched_tokens <= 3
        assert all(len(c.draft_token_ids) <= 2 for c in out.cont)


def test_a_stop_token_among_kept_drafts_ends_the_request_there():
    h = run(NGRAM, request("r", prompt(), max_tokens=20, stop_token_ids=frozenset({13})))
    assert h.outputs("r") == [11, 12, 13]
    assert h.finish_of("r").finish_reason is FinishReason.STOP


def test_a_draft_never_preempts_a_request():
    # two requests, one block to spare: drafts that need more are dropped, nobody is preempted
    h = harness(NGRAM, block_size=4)
    h.sched = Scheduler(config(speculative=NGRAM, num_blocks=7, block_size=4))
    h.add(request("a", prompt(), max_tokens=5), request("b", [9, *prompt()], max_tokens=5))
    while h.sched.requests or h.sched._dropped:
        h.step()
    assert h.sched.snapshot().preemptions == 0
    assert h.outputs("a") == [11, 12, 13, 14, 15]


def test_a_request_that_may_not_speculate_gets_no_draft():
    h = run(NGRAM, request("r", prompt(), max_tokens=10, may_speculate=False))
    assert h.sched.snapshot().spec_drafts == 0 and len(h.outputs("r")) == 10


def test_a_verdict_on_more_drafts_than_scheduled_fails_the_request_alone():
    h = harness(NGRAM)
    h.add(request("r", prompt(), max_tokens=10), request("s", [1, 2, 3, 4, 5], max_tokens=3))
    h.step()  # prefill
    out = h.plan()
    [drafted] = [c for c in out.cont if c.draft_token_ids]
    result = h.worker.run(out)
    result.accepted[drafted.request_id] = len(drafted.draft_token_ids) + 1
    h.pending.clear()
    h.updates.extend(h.sched.update_from_output(out, result))
    assert h.finish_of("r").finish_reason is FinishReason.ERROR
    while h.sched.requests or h.sched._dropped:
        h.step()
    assert h.finish_of("s").finish_reason is FinishReason.LENGTH
    assert h.sched.snapshot().blocks_in_use == 0


def test_no_draft_while_more_requests_run_than_disable_by_batch_size():
    spec = SpecConfig(num_speculative_tokens=4, prompt_lookup_min=2, disable_by_batch_size=2)
    h = harness(spec)
    h.add(*[request(f"r{i}", [i, *prompt()], max_tokens=4 + 8 * i) for i in range(3)])
    drafted_with = []
    while h.sched.requests or h.sched._dropped:
        out = h.step()
        if any(c.draft_token_ids for c in out.cont):
            drafted_with.append(len(out.cont) + len(out.new))
    assert drafted_with and max(drafted_with) <= 2
