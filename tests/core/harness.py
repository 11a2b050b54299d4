"""A scheduler and its fake worker stepped together, with the small builders the core tests
share (a tiny config, a request) and views of the ledger for exact assertions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler_svc.core import (
    Request,
    RequestUpdate,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from scheduler_svc.core.kv_cache_manager import KVCacheManager
from scheduler_svc.core.output import BlockHashPair
from tests.core.fakes import FakeWorker, plan_ids, written_by


def config(kv: bool = True, **overrides: object) -> SchedulerConfig:
    values: dict[str, object] = dict(
        num_blocks=8,
        block_size=4,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=64,
        kv_cache=kv,
        debug_invariants=True,
    )
    values.update(overrides)
    return SchedulerConfig(**values)  # type: ignore[arg-type]


def request(rid: str, prompt: Iterable[int], max_tokens: int = 4, **kw: object) -> Request:
    return Request(request_id=rid, prompt_token_ids=list(prompt), max_tokens=max_tokens, **kw)


def has_unfinished(sched: Scheduler) -> bool:
    """True while schedule() has anything to do or to report: a live request, a finish not
    reported yet, or a request the worker must still be told to drop. Only tests ask this (the
    engine plans every step and sends a plan only when it is not empty), so it reads the
    scheduler's pending lists here rather than living on the scheduler."""
    return bool(sched.requests or sched._finished_pending or sched._dropped)


@dataclass
class Harness:
    """A scheduler and its fake worker, stepped together."""

    sched: Scheduler
    worker: FakeWorker
    updates: list[RequestUpdate] = field(default_factory=list)
    last: SchedulerOutput | None = None
    pending: list[SchedulerOutput] = field(default_factory=list)  # planned, not applied yet
    # per pending plan (by id): writes that failed after it was planned (see FakeWorker.run)
    excused: dict[int, frozenset[BlockHashPair]] = field(default_factory=dict)

    @classmethod
    def build(cls, kv: bool = True, **overrides: object) -> Harness:
        cfg = config(kv=kv, **overrides)
        return cls(Scheduler(cfg), FakeWorker(cfg.block_size, kv=kv))

    def add(self, *requests: Request) -> None:
        for r in requests:
            self.worker.requests[r.request_id] = r
            self.sched.add_request(r)

    @property
    def in_flight(self) -> bool:
        self._prune()
        return bool(self.pending)

    def _prune(self) -> None:
        """Forgets plans a test applied itself (update_from_output called directly)."""
        live = self.sched._in_flight  # an empty plan is never sent: nothing to run or apply
        self.pending = [o for o in self.pending if any(o is x for x in live)]

    def plan(self) -> SchedulerOutput:
        self._prune()
        self.last = self.sched.schedule()
        self.pending.append(self.last)
        self.updates.extend(self.last.finished)
        return self.last

    def finish_step(self, **inject: object) -> list[RequestUpdate]:
        """The worker runs the oldest plan in flight; its result is applied."""
        self._prune()
        if not self.pending:
            return []
        out = self.pending.pop(0)
        excused = self.excused.pop(id(out), frozenset())
        result = self.worker.run(out, excused=excused, **inject)  # type: ignore[arg-type]
        voided = (
            set(result.errored) | set(result.stale_request_ids) | set(result.deferred_request_ids)
        )
        failed = written_by(out, voided)
        removed = set(result.removed_block_ids)
        for later in self.pending:  # planned before this failure or removal was reported
            claims = {pair for new in later.new for pair in new.claimed if pair[0] in removed}
            self.excused[id(later)] = self.excused.get(id(later), frozenset()) | failed | claims
            # The worker skips a failed request in the plans after this one until a plan
            # drops it, so what it declares there is never written either: a later plan's
            # claim on such a block was made before the failure was known.
            voided -= set(later.dropped_request_ids)
            failed = failed | written_by(later, voided)
        updates = self.sched.update_from_output(out, result)
        self.updates.extend(updates)
        return updates

    def check_cache(self) -> None:
        """The worker holds what every cached hash names, except blocks that plans still in
        flight declare (the worker has not run them yet)."""
        if isinstance(self.sched.kv, KVCacheManager):
            ahead = {b for out in self.pending for b in written_by(out, plan_ids(out))}
            cached = self.kv.pool.cached.items()
            self.worker.check_cache(
                (b.block_id, h) for h, b in cached if (b.block_id, h) not in ahead
            )

    def step(self, **inject: object) -> SchedulerOutput:
        out = self.plan()
        self.finish_step(**inject)
        return out

    def run_to_idle(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if not has_unfinished(self.sched):
                return
            self.step()
        waiting = [(r.request_id, r.num_tokens, r.status) for r in self.sched.waiting]
        running = [(r.request_id, r.num_tokens, r.num_computed_tokens) for r in self.sched.running]
        raise AssertionError(
            f"the scheduler did not reach idle: waiting {waiting}, running {running}, "
            f"{self.sched.snapshot()}, config {self.sched.config}"
        )

    # -- views for exact assertions -------------------------------------------------------

    @property
    def kv(self) -> KVCacheManager:
        assert isinstance(self.sched.kv, KVCacheManager)
        return self.sched.kv

    def has_table(self, rid: str) -> bool:
        """Whether the ledger holds a block table for the request (the no-cache manager never
        does)."""
        return isinstance(self.sched.kv, KVCacheManager) and rid in self.sched.kv.tables

    def table(self, rid: str) -> list[int]:
        return self.sched.kv.block_ids(rid) if self.has_table(rid) else []

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.kv.pool.free_queue]

    def refs(self) -> list[int]:
        return [b.ref_cnt for b in self.kv.pool.blocks]

    def cached(self) -> list[int]:
        return sorted(b.block_id for b in self.kv.pool.cached.values())

    def removal_sources(self, block_ids: Iterable[int]) -> list[str | None]:
        """Why each block last lost its hash."""
        return [self.kv.pool.blocks[b].removal_source for b in block_ids]

    def outputs(self, rid: str) -> list[int]:
        return [t for u in self.updates if u.request_id == rid for t in u.new_token_ids]

    def finish_of(self, rid: str) -> RequestUpdate | None:
        ends = [u for u in self.updates if u.request_id == rid and u.finish_reason is not None]
        assert len(ends) <= 1, f"{rid} finished {len(ends)} times"
        return ends[0] if ends else None
