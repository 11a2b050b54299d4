"""Random arrivals, steps, faults, aborts, resets and drains on a tiny pool, checked each step,
under each policy (fcfs, priority, and fair between three tenants, with one tenant's bursts).

The fake worker holds the truth about every block's content, so any stale claim the ledger let
through fails at once, and so does any refusal no injected fault explains; between steps every
cached hash must name what its block holds; the invariant checker runs after every operation;
at the end the ledger is run to idle and must be empty.

Why this file is longer than the project's ~300 lines: it is one hypothesis state machine. Its
rules, invariants and the model state they share (the harness, the arrivals, what was aborted
or drained) only make sense together, and hypothesis needs them on one class; the variants at
the end are that machine under each configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from scheduler_svc.core import Request, RequestStatus, Scheduler, SchedulerOutput
from scheduler_svc.core.block_hash import extend_chain, request_extra_keys
from scheduler_svc.core.kv_block import KVBlock
from scheduler_svc.core.kv_cache_interface import CacheLookup
from scheduler_svc.core.speculative import SpecConfig
from tests.core.fakes import FakeWorker
from tests.core.harness import Harness, config

PREFIXES = [[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [7] * 6]
EOS = 0


def next_token(rid: str, seen: list[int]) -> int:
    # a small vocabulary, so generated blocks repeat and get shared too
    return (len(seen) * 3 + seen[-1]) % 11


@dataclass(frozen=True)
class Arrival:
    prefix: list[int]
    suffix: list[int]
    salt: str | None
    max_tokens: int
    min_tokens: int
    priority: int
    tenant: str
    eos: bool
    skip_cache: bool
    embedding: bool

    def request(self, rid: str) -> Request:
        return Request(
            request_id=rid,
            prompt_token_ids=self.prefix + self.suffix,
            max_tokens=self.max_tokens,
            eos_token_ids=frozenset({EOS}) if self.eos else frozenset(),
            min_tokens=self.min_tokens,
            priority=self.priority,
            tenant=self.tenant,
            cache_salt=self.salt,
            skip_prefix_cache=self.skip_cache,
            is_embedding=self.embedding,
        )


ARRIVALS = st.builds(
    Arrival,
    prefix=st.sampled_from(PREFIXES),
    suffix=st.lists(st.integers(0, 10), max_size=6),
    salt=st.sampled_from([None, None, None, "s"]),
    max_tokens=st.integers(0, 6),
    min_tokens=st.integers(0, 2),
    priority=st.integers(0, 2),
    tenant=st.sampled_from(["", "a", "b"]),
    eos=st.booleans(),
    skip_cache=st.sampled_from([False, False, False, True]),
    embedding=st.sampled_from([False, False, False, True]),
)


def scheduled_ids(out: SchedulerOutput) -> list[str]:
    return [x.request_id for x in out.new] + [x.request_id for x in out.cont]


class LedgerMachine(RuleBasedStateMachine):
    kv = True
    # Plans in flight before the oldest one's result is applied: 1 is lockstep; 2 is async
    # scheduling (the next plan is made while the worker runs the previous one); more is
    # --num-scheduler-steps (a bundle of decode steps planned at once, and the next bundle
    # planned while the worker runs it).
    depth = 1
    # Bundles apply results as the scheduler's link does: the oldest bundle's results back to
    # back (down to half the depth), then plans one by one up to the depth again.
    burst = False
    # Speculative decoding: drafts from n-grams of one token or more, so that the small
    # vocabulary's repeats draft often and are kept or rejected in every mix.
    spec: SpecConfig | None = None

    @property
    def ahead(self) -> bool:
        return self.depth > 1

    def __init__(self) -> None:
        super().__init__()
        self.h: Harness | None = None
        self.added: list[Request] = []
        self.errors_injected: set[str] = set()  # requests the test made the worker fail
        self.steps = 0
        self.cached_at_last_check: dict[int, int] = {}  # block id -> generation
        self.shadow_lookups: list[CacheLookup] = []
        self.epoch_at_last_check = 0

    @initialize(
        num_blocks=st.integers(3, 16),
        block_size=st.sampled_from([1, 2, 4]),
        max_num_seqs=st.integers(1, 4),
        budget=st.integers(1, 24),
        chunked=st.booleans(),
        caching=st.sampled_from([True, True, True, False]),
        policy=st.sampled_from(["fcfs", "priority", "fair"]),
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
            scheduling_policy=policy,
            speculative=self.spec,
        )
        late = self.ahead or self.spec is not None  # kept drafts: their blocks declared next step
        worker = FakeWorker(block_size, kv=self.kv, next_token=next_token, late=late)
        self.h = Harness(Scheduler(cfg), worker)

    @rule(arrival=ARRIVALS)
    def add(self, arrival: Arrival) -> None:
        r = arrival.request(f"r{len(self.added)}")
        self.added.append(r)
        self.h.add(r)

    @precondition(lambda self: self.added)
    @rule(data=st.data())
    def add_follow_ups(self, data: st.DataObject) -> None:
        """Next turns of earlier conversations: their lookups at arrival hit cached blocks,
        which the steps before their admission may evict or remove (a newcomer queued ahead
        of them takes blocks first)."""
        if data.draw(st.booleans(), "a newcomer first"):
            self.add(data.draw(ARRIVALS, "newcomer"))
        for _ in range(data.draw(st.integers(1, 3), "follow-ups")):
            earlier = data.draw(st.sampled_from(self.added), "earlier")
            history = (earlier.prompt_token_ids + earlier.output_token_ids)[:16]
            arrival = data.draw(ARRIVALS, "turn")
            self.add(replace(arrival, prefix=history, salt=earlier.cache_salt, embedding=False))

    @rule(data=st.data())
    def add_burst(self, data: st.DataObject) -> None:
        """One tenant's burst, then another tenant's request: under the fair policy the burst
        holds the seats and the blocks, and the newcomer takes a seat from it."""
        burst = data.draw(st.sampled_from(["", "a", "b"]), "burst tenant")
        for _ in range(data.draw(st.integers(2, 5), "burst size")):
            arrival = data.draw(ARRIVALS, "burst")
            long = data.draw(st.integers(4, 6), "long")  # still running when the newcomer comes
            self.add(replace(arrival, tenant=burst, max_tokens=long, eos=False, embedding=False))
        self.step()
        other = data.draw(st.sampled_from(["", "a", "b"]).filter(lambda t: t != burst), "other")
        self.add(replace(data.draw(ARRIVALS, "newcomer"), tenant=other))
        self.step()  # a pass that stops at the newcomer for want of a seat or a block ...
        self.step()  # ... and the step that takes one for it from the burst

    @rule()
    def step(self) -> None:
        self._plan()
        if self._result_due():
            self.h.finish_step()
            while self.burst and len(self.h.pending) > self.depth // 2:
                self.h.finish_step()
        self.steps += 1

    def _result_due(self) -> bool:
        """Lockstep: the plan just made. Ahead: the oldest, once `depth` plans are out."""
        return len(self.h.pending) >= self.depth or self.h.last.is_empty

    @rule(data=st.data())
    def step_with_faults(self, data: st.DataObject) -> None:
        self._maybe_corrupt(data)
        out = self._plan()
        self._finish_with_faults(data, out)

    @rule(data=st.data())
    def step_with_events_in_flight(self, data: st.DataObject) -> None:
        """Arrivals and aborts while the worker runs the plan: a new lookup may see blocks not
        written yet, and an aborted request's results must be ignored."""
        self._maybe_corrupt(data)
        out = self._plan()
        events = st.lists(st.sampled_from(["add", "abort"]), min_size=1, max_size=3)
        for event in data.draw(events, "events in flight"):
            if event == "add":
                self.add(data.draw(ARRIVALS, "arrival in flight"))
            elif self.h.sched.requests:
                live = sorted(self.h.sched.requests)
                in_plan = [rid for rid in scheduled_ids(out) if rid in self.h.sched.requests]
                rid = data.draw(st.sampled_from(in_plan + live), "abort in flight")
                assert self.h.sched.abort_request(rid)
        self._finish_with_faults(data, out)

    def _plan(self) -> SchedulerOutput:
        out = self.h.plan()
        sched = self.h.sched
        if sched.waiting:  # the pass stopped at the head: what it learned is not kept
            head = sched.waiting.peek().request_id
            assert sched.tracker.peek_lookup(head) is None, f"{head} kept a failed lookup"
        return out

    def _maybe_corrupt(self, data: st.DataObject) -> None:
        h = self.h
        if self.kv and data.draw(st.booleans(), "corrupt a record"):
            cached = sorted(b.block_id for b in h.kv.pool.cached.values())
            if cached:  # the worker's provenance record for this block disagrees
                h.worker.corrupt(data.draw(st.sampled_from(cached), "corrupt"))

    def _finish_with_faults(self, data: st.DataObject, out: SchedulerOutput) -> None:
        h = self.h
        if not self._result_due():
            return
        out = h.pending[0] if h.pending else out
        scheduled = scheduled_ids(out)
        errored = {}
        if scheduled and data.draw(st.booleans(), "error one"):
            errored[data.draw(st.sampled_from(scheduled), "errored")] = "boom"
            self.errors_injected |= set(errored)
        deferred = []
        if scheduled and data.draw(st.booleans(), "defer one"):  # its grammar still compiles
            deferred = [data.draw(st.sampled_from(scheduled), "deferred")]
        drop = self._draw_drop(data) if self.kv else []
        h.finish_step(errored=errored, drop_blocks=drop, deferred=deferred)
        self.steps += 1

    def _draw_drop(self, data: st.DataObject) -> list[int]:
        h = self.h
        held = {b for t in h.worker.tables.values() for b in t}
        droppable = sorted(set(h.worker.truth) - held)
        hoped_for = sorted(set(droppable) & self._named_by_waiting_lookups())
        if hoped_for and data.draw(st.booleans(), "drop what a waiting request hopes to hit"):
            droppable = hoped_for
        if not droppable:
            return []
        return data.draw(st.lists(st.sampled_from(droppable), unique=True, max_size=2), "drop")

    def _named_by_waiting_lookups(self) -> set[int]:
        tracker = self.h.sched.tracker
        lookups = [tracker.peek_lookup(r.request_id) for r in self.h.sched.waiting]
        return {b.block_id for lookup in lookups if lookup is not None for b in lookup.blocks}

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
        self.h.pending.clear()  # a lost worker's plans in flight are gone with it
        for r in drained:
            assert r.status is RequestStatus.WAITING and r.num_computed_tokens == 0
            self.h.add(r)

    @precondition(lambda self: self.h is not None and len(self.h.sched.waiting) > 0)
    @rule(data=st.data())
    def recheck_a_waiting_lookup(self, data: st.DataObject) -> None:
        """The lookup the tracker hands out is true now: a kept one that a removal made stale
        would be caught here even if the scheduler's own pass happened not to use it."""
        sched = self.h.sched
        request = data.draw(st.sampled_from(list(sched.waiting)), "waiting")
        got = [b.block_id for b in sched.tracker.lookup(request).blocks]
        assert got == self._fresh_walk(request), f"{request.request_id}: an untrue lookup kept"

    def _fresh_walk(self, request: Request) -> list[int]:
        sched = self.h.sched
        if not sched.config.caches_prefixes or request.skip_prefix_cache:
            return []
        size, tokens = sched.config.block_size, request.all_token_ids
        max_blocks = max(len(tokens) - 1, 0) // size
        keys = request_extra_keys(request.cache_salt)
        chain = extend_chain([], tokens, size, max_blocks, keys)
        return [b.block_id for b in sched.kv.find_cached_prefix(tokens, chain, max_blocks).blocks]

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
            self.h.check_cache()
            stats = self.h.sched.stats
            assert stats.orphans == 0 and stats.table_orphans == 0

    @invariant()
    def removals_move_the_epoch(self) -> None:
        """A block that left the cache since the last check moved the removal epoch: that is
        the only way a lookup taken earlier learns it may be untrue."""
        if self.h is None or not self.kv:
            return
        pool = self.h.kv.pool
        last, blocks = self.cached_at_last_check, pool.blocks
        removed = [block_id for block_id, gen in last.items() if blocks[block_id].generation != gen]
        assert not removed or pool.removal_epoch != self.epoch_at_last_check, (
            f"blocks {removed} left the cache, but the removal epoch did not move"
        )
        self.cached_at_last_check = {b.block_id: b.generation for b in pool.cached.values()}
        self.epoch_at_last_check = pool.removal_epoch

    @invariant()
    def stale_lookups_are_known(self) -> None:
        """A lookup whose blocks changed since it was taken is reported stale, whatever
        removed them: the waiting requests' lookups, and one the test took itself over every
        cached chain at the last check. Checked on copies: the ledger's timeline is untouched."""
        if self.h is None or not self.kv:
            return
        sched = self.h.sched
        waiting = [sched.tracker.peek_lookup(r.request_id) for r in sched.waiting]
        for lookup in [*self.shadow_lookups, *(x for x in waiting if x is not None)]:
            pairs = zip(lookup.blocks, lookup.generations, strict=True)
            changed = [block.block_id for block, gen in pairs if block.generation != gen]
            assert not changed or sched.kv.stale_source(replace(lookup)) is not None, (
                f"blocks {changed} changed under a lookup of {lookup.num_tokens} tokens, "
                "and stale_source() does not report it"
            )
        self.shadow_lookups = [self._lookup_of_chain(leaf) for leaf in self._cached_leaves()]

    def _cached_leaves(self) -> list[KVBlock]:
        return [b for b in self.h.kv.pool.cached.values() if not b.children]

    def _lookup_of_chain(self, leaf: KVBlock) -> CacheLookup:
        path = [leaf]
        while path[-1].parent is not None:
            path.append(path[-1].parent)
        path.reverse()
        tokens = [t for block in path for t in block.token_ids]
        chain = [block.block_hash for block in path if block.block_hash is not None]
        lookup = self.h.kv.find_cached_prefix(tokens, chain, len(path))
        assert lookup.blocks == path, "a cached chain is not found by a walk over its tokens"
        return lookup

    def teardown(self) -> None:
        if self.h is None:
            return
        h = self.h
        while h.in_flight:  # rules stopped between plan and result (or planned ahead)
            h.finish_step()
        h.run_to_idle(max_steps=2000)
        snap = h.sched.snapshot()
        assert snap.blocks_in_use == 0 and snap.tracker_entries == 0
        assert snap.num_running == snap.num_waiting == 0 and h.sched.kv.num_tables == 0
        assert snap.prefix_cache_hits <= snap.prefix_cache_queries
        for r in self.added:
            assert r.status is RequestStatus.FINISHED, f"{r.request_id} never finished"
            end = h.finish_of(r.request_id)
            if r.finish_reason.value != "abort":
                assert end is not None and end.finish_reason == r.finish_reason
            assert r.num_output_tokens <= max(r.max_tokens, 0)
            if r.finish_reason.value == "error":  # e.g. "the worker returned no token"
                assert r.request_id in self.errors_injected, (r.request_id, r.finish_message)
            if r.finish_reason.value in ("stop", "length") and not r.is_embedding:
                # recomputation after preemption, faults and drains never changes the output
                expected = list(r.prompt_token_ids)
                for _ in r.output_token_ids:
                    expected.append(next_token(r.request_id, expected))
                assert r.output_token_ids == expected[r.num_prompt_tokens :]
        # each request ended once: the scheduler streamed one end for each, but for aborts
        ends = sorted(u.request_id for u in h.updates if u.finish_reason is not None)
        assert ends == sorted(r.request_id for r in self.added if r.finish_reason != "abort")


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


class LedgerAheadWithKV(LedgerMachine):
    kv = True
    depth = 2


class LedgerAheadWithoutKV(LedgerMachine):
    kv = False
    depth = 2


class LedgerBundlesWithKV(LedgerMachine):
    kv = True
    depth = 5
    burst = True


class LedgerBundlesWithoutKV(LedgerMachine):
    kv = False
    depth = 5
    burst = True


SPEC = SpecConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)


class LedgerSpeculativeWithKV(LedgerMachine):
    kv = True
    spec = SPEC


class LedgerSpeculativeWithoutKV(LedgerMachine):
    kv = False
    spec = SPEC


class LedgerSpeculativeAheadWithKV(LedgerMachine):
    kv = True
    depth = 2
    spec = SPEC


class LedgerSpeculativeBundlesWithKV(LedgerMachine):
    kv = True
    depth = 5
    burst = True
    spec = SpecConfig(method="suffix", num_speculative_tokens=4, prompt_lookup_min=1)


TestLedgerSpeculativeWithKV = LedgerSpeculativeWithKV.TestCase
TestLedgerSpeculativeWithKV.settings = settings(SETTINGS, max_examples=200)
TestLedgerSpeculativeWithoutKV = LedgerSpeculativeWithoutKV.TestCase
TestLedgerSpeculativeWithoutKV.settings = settings(SETTINGS, max_examples=40)
TestLedgerSpeculativeAheadWithKV = LedgerSpeculativeAheadWithKV.TestCase
TestLedgerSpeculativeAheadWithKV.settings = settings(SETTINGS, max_examples=150)
TestLedgerSpeculativeBundlesWithKV = LedgerSpeculativeBundlesWithKV.TestCase
TestLedgerSpeculativeBundlesWithKV.settings = settings(SETTINGS, max_examples=100)
TestLedgerAheadWithKV = LedgerAheadWithKV.TestCase
TestLedgerAheadWithKV.settings = settings(SETTINGS, max_examples=250)
TestLedgerAheadWithoutKV = LedgerAheadWithoutKV.TestCase
TestLedgerAheadWithoutKV.settings = settings(SETTINGS, max_examples=80)
TestLedgerBundlesWithKV = LedgerBundlesWithKV.TestCase
TestLedgerBundlesWithKV.settings = settings(SETTINGS, max_examples=150)
TestLedgerBundlesWithoutKV = LedgerBundlesWithoutKV.TestCase
TestLedgerBundlesWithoutKV.settings = settings(SETTINGS, max_examples=60)
TestLedgerWithKV = LedgerWithKV.TestCase
TestLedgerWithKV.settings = SETTINGS
TestLedgerWithoutKV = LedgerWithoutKV.TestCase
TestLedgerWithoutKV.settings = settings(SETTINGS, max_examples=120)
