"""Random arrivals, steps, faults, aborts, resets and drains on a tiny pool, checked each step.

The fake worker holds the truth about every block's content, so any stale claim the ledger let
through fails at once; the invariant checker runs after every operation; at the end the ledger
is run to idle and must be empty.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from scheduler_svc.core import Request, RequestStatus, Scheduler
from scheduler_svc.core.block_hash import extend_chain, request_extra_keys
from tests.core.fakes import FakeWorker, Harness, config

PREFIXES = [[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [7] * 6]
EOS = 0


def next_token(rid: str, seen: list[int]) -> int:
    # a small vocabulary, so generated blocks repeat and get shared too
    return (len(seen) * 3 + seen[-1]) % 11


class LedgerMachine(RuleBasedStateMachine):
    kv = True

    def __init__(self) -> None:
        super().__init__()
        self.h: Harness | None = None
        self.added: list[Request] = []
        self.steps = 0

    @initialize(
        num_blocks=st.integers(3, 16),
        block_size=st.sampled_from([1, 2, 4]),
        max_num_seqs=st.integers(1, 4),
        budget=st.integers(1, 24),
        chunked=st.booleans(),
        caching=st.sampled_from([True, True, True, False]),
        policy=st.sampled_from(["fcfs", "priority"]),
    )
    def setup(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        budget: int,
        chunked: bool,
        caching: bool,
        policy: str,
    ) -> None:
        max_model_len = 24
        cfg = config(
            kv=self.kv,
            num_blocks=num_blocks,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget if chunked else max(budget, max_model_len),
            max_model_len=max_model_len,
            enable_prefix_caching=caching,
            enable_chunked_prefill=chunked,
            policy=policy,
        )
        self.h = Harness(Scheduler(cfg), FakeWorker(block_size, kv=self.kv, next_token=next_token))

    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(0, 10), max_size=6),
        salt=st.sampled_from([None, None, None, "s"]),
        max_tokens=st.integers(0, 6),
        min_tokens=st.integers(0, 2),
        priority=st.integers(0, 2),
        eos=st.booleans(),
        skip_cache=st.sampled_from([False, False, False, True]),
        embedding=st.sampled_from([False, False, False, True]),
    )
    def add(
        self,
        prefix: list[int],
        suffix: list[int],
        salt: str | None,
        max_tokens: int,
        min_tokens: int,
        priority: int,
        eos: bool,
        skip_cache: bool,
        embedding: bool,
    ) -> None:
        r = Request(
            request_id=f"r{len(self.added)}",
            prompt_token_ids=prefix + suffix,
            max_tokens=max_tokens,
            eos_token_ids=frozenset({EOS}) if eos else frozenset(),
            min_tokens=min_tokens,
            priority=priority,
            cache_salt=salt,
            skip_prefix_cache=skip_cache,
            is_embedding=embedding,
        )
        self.added.append(r)
        self.h.add(r)

    @rule()
    def step(self) -> None:
        self.h.step()
        self.steps += 1

    @rule(data=st.data())
    def step_with_faults(self, data: st.DataObject) -> None:
        h = self.h
        if self.kv and data.draw(st.booleans(), "corrupt a record"):
            cached = sorted(b.block_id for b in h.kv.pool.cached.values())
            if cached:  # the worker's provenance record for this block disagrees
                h.worker.declared[data.draw(st.sampled_from(cached), "corrupt")] = b"?" * 32
        out = h.plan()
        scheduled = [x.request_id for x in out.new] + [x.request_id for x in out.cont]
        errored = {}
        if scheduled and data.draw(st.booleans(), "error one"):
            errored[data.draw(st.sampled_from(scheduled), "errored")] = "boom"
        drop: list[int] = []
        if self.kv:
            held = {b for t in h.worker.tables.values() for b in t}
            droppable = sorted(set(h.worker.truth) - held)
            drop = data.draw(
                st.lists(st.sampled_from(droppable), unique=True, max_size=2)
                if droppable
                else st.just([]),
                "drop",
            )
        h.finish_step(errored=errored, drop_blocks=drop)
        self.steps += 1

    @precondition(lambda self: self.added)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from([r.request_id for r in self.added] + ["nobody"]))
        live = rid in self.h.sched.requests
        assert self.h.sched.abort_request(rid) is live

    @rule()
    def reset_prefix_cache(self) -> None:
        idle = self.h.sched.snapshot().blocks_in_use == 0
        assert self.h.sched.reset_prefix_cache() is (idle or not self.kv)

    @rule()
    def lose_the_worker(self) -> None:
        drained = self.h.sched.drain()
        assert [r.arrival_index for r in drained] == sorted(r.arrival_index for r in drained)
        self.h.worker.restart()
        for r in drained:
            assert r.status is RequestStatus.WAITING and r.num_computed_tokens == 0
            self.h.add(r)

    @rule(tokens=st.lists(st.integers(0, 10), max_size=10), salt=st.sampled_from([None, "s"]))
    def probe_for_routing(self, tokens: list[int], salt: str | None) -> None:
        before = self.h.sched.snapshot()
        hit = self.h.sched.cached_prefix_tokens(tokens, salt)
        size = self.h.sched.config.block_size
        assert 0 <= hit < max(len(tokens), 1) and hit % size == 0
        assert self.h.sched.snapshot() == before
        if tokens and self.h.sched.config.caches_prefixes:  # the same as a full walk
            max_blocks = (len(tokens) - 1) // size
            chain = extend_chain([], tokens, size, max_blocks, request_extra_keys(salt))
            full = self.h.sched.kv.find_cached_prefix(tokens, chain, max_blocks)
            assert hit == full.num_tokens

    @invariant()
    def ledger_is_consistent(self) -> None:
        if self.h is not None:
            self.h.sched.check_invariants()
            stats = self.h.sched.stats
            assert stats.orphans == 0 and stats.table_orphans == 0

    def teardown(self) -> None:
        if self.h is None:
            return
        h = self.h
        h.run_to_idle(max_steps=2000)
        snap = h.sched.snapshot()
        assert snap.blocks_in_use == 0 and snap.tracker_entries == 0
        assert snap.num_running == snap.num_waiting == 0 and h.sched.kv.num_tables == 0
        assert snap.prefix_cache_hits <= snap.prefix_cache_queries
        for r in self.added:
            assert r.is_finished, f"{r.request_id} never finished"
            end = h.finish_of(r.request_id)
            if r.finish_reason.value != "abort":
                assert end is not None and end.finish_reason == r.finish_reason
            assert r.num_output_tokens <= max(r.max_tokens, 0)
            if r.finish_reason.value in ("stop", "length") and not r.is_embedding:
                # recomputation after preemption, faults and drains never changes the output
                expected = list(r.prompt_token_ids)
                for _ in r.output_token_ids:
                    expected.append(next_token(r.request_id, expected))
                assert r.output_token_ids == expected[r.num_prompt_tokens :]
        assert sum(snap.requests_finished.values()) == len(self.added)


# about 4,000 rule steps (and more scheduler steps) with the KV manager, 1,500 without
# On a failure, shrink one bug only and skip the explain phase: a broken ledger then fails in
# well under a minute instead of several.
SETTINGS = settings(
    max_examples=350,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


class LedgerWithKV(LedgerMachine):
    kv = True


class LedgerWithoutKV(LedgerMachine):
    kv = False


TestLedgerWithKV = LedgerWithKV.TestCase
TestLedgerWithKV.settings = SETTINGS
TestLedgerWithoutKV = LedgerWithoutKV.TestCase
TestLedgerWithoutKV.settings = settings(SETTINGS, max_examples=120)
