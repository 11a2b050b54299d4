"""The scheduler: one ledger per worker. Pure and synchronous; the engine drives it.

One step is schedule() -> the worker runs the plan -> update_from_output(). Requests are
scheduled with vLLM v1's unified rule: each gets the tokens it has not computed yet, as many as
the budget allows; num_computed_tokens advances at schedule time.

Why this file is longer than the project's ~300 lines: what is left here is one state machine.
Planning, preemption, result application and every way a request leaves all move the same
structures together (running, waiting, requests, running_per_tenant, the tracker, the block
tables, the drop list), and the invariants (core/invariants.py) hold only between the public
calls, not between the private steps that make them up. Split into files, these would be one
class spread over several, each part reaching into state the others own. The rules that stand
alone live beside it: arrival refusals (ignored.py), planning ahead of unknown tokens and lazy
commits (lookahead.py), the fair policy's seat-taking (fair.py), plan and update shapes
(output.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import chain as iter_chain

from scheduler_svc.core import ignored
from scheduler_svc.core.block_hash import BlockHasher, sha256_block_hash
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.fair import Stall, seat_for
from scheduler_svc.core.invariants import check_scheduler
from scheduler_svc.core.kv_cache_interface import CacheLookup, KVManager
from scheduler_svc.core.kv_cache_manager import KVCacheManager
from scheduler_svc.core.lookahead import may_plan_ahead, newly_committable
from scheduler_svc.core.no_kv_cache_manager import NoKVCacheManager
from scheduler_svc.core.output import (
    BlockHashPair,
    ModelResult,
    RequestUpdate,
    ScheduledCont,
    ScheduledNew,
    SchedulerOutput,
    declared_written,
    update_of,
)
from scheduler_svc.core.policy import make_waiting_queue, running_order
from scheduler_svc.core.request import FinishReason, Request, RequestStatus
from scheduler_svc.core.speculative import DraftState, NgramIndex, propose, settle
from scheduler_svc.core.stats import SchedulerSnapshot, SchedulerStats, bump
from scheduler_svc.core.stop_conditions import at_length, stop_reason
from scheduler_svc.core.tracker import ComputedBlocksTracker

RUNNING = RequestStatus.RUNNING


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, block_hasher: BlockHasher = sha256_block_hash
    ) -> None:
        self.config = config
        self.stats = SchedulerStats()
        if config.speculative is not None:  # each position's series exported from the start
            positions = range(config.speculative.num_speculative_tokens)
            self.stats.spec_accepted_per_position = {str(i): 0 for i in positions}
        self.kv: KVManager = (
            KVCacheManager(config, self.stats) if config.kv_cache else NoKVCacheManager()
        )
        self.tracker = ComputedBlocksTracker(config, self.kv, self.stats, block_hasher)
        # Running requests per tenant (status RUNNING), kept at each change of status; the
        # fair queue reads it.
        self.running_per_tenant: Counter[str] = Counter()
        self.waiting = make_waiting_queue(config.scheduling_policy, self.running_per_tenant)
        self.running: list[Request] = []  # kept in policy order: served first at the front
        self.requests: dict[str, Request] = {}  # every live (waiting or running) request
        self._order = running_order(config.scheduling_policy)
        # The head the last pass stopped at for want of a seat or a block (the fair policy
        # acts on it: core/fair.py).
        self._stall: Stall | None = None
        self._step_id = 0
        self._next_arrival = 0
        self._dropped: list[str] = []  # the worker must forget these with the next plan
        self._finished_pending: list[RequestUpdate] = []
        self._running_dirty = False  # some running request left during this update
        # Plans handed out and not yet answered, oldest first (two under async scheduling).
        self._in_flight: list[SchedulerOutput] = []
        capacity = self.kv.token_capacity
        self.max_len = (
            config.max_model_len if capacity is None else min(config.max_model_len, capacity)
        )

    # -- queries --------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def waiting_per_tenant(self) -> dict[str, int]:
        """Waiting requests per tenant (the fair policy shares the waiting cap by it)."""
        return self.waiting.per_tenant()

    def cached_prefix_tokens(self, token_ids: list[int], cache_salt: str | None) -> int:
        return self.tracker.cached_prefix_tokens(token_ids, cache_salt)

    def snapshot(self) -> SchedulerSnapshot:
        kv, stats = self.kv, self.stats
        return SchedulerSnapshot(
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
            stale_entries=dict(stats.stale_entries),
            entries_released=dict(stats.entries_released),
            orphans=stats.orphans,
            table_orphans=stats.table_orphans,
            evictions=stats.evictions,
            preemptions=stats.preemptions,
            tracker_entries=len(self.tracker),
            blocks_total=kv.num_blocks_total,
            blocks_in_use=kv.num_blocks_total - kv.num_free_blocks,
            blocks_cached=kv.num_cached_blocks,
            usage=kv.usage,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            grammar_deferrals=stats.grammar_deferrals,
            spec_drafts=stats.spec_drafts,
            spec_draft_tokens=stats.spec_draft_tokens,
            spec_accepted_tokens=stats.spec_accepted_tokens,
            spec_accepted_per_position=dict(stats.spec_accepted_per_position),
        )

    def check_invariants(self) -> None:
        check_scheduler(self)

    # -- arrivals and departures ----------------------------------------------------------

    def add_request(self, request: Request) -> None:
        rid = request.request_id
        if rid in self.requests:
            raise ValueError(f"request {rid!r} is already live in this scheduler")
        request.arrival_index = self._next_arrival
        self._next_arrival += 1
        request.reset_for_recompute(RequestStatus.WAITING)
        request.finish_reason, request.finish_message = None, ""
        why_ignored = ignored.why_ignored(request, self.config, self.kv.token_capacity)
        if why_ignored is not None:
            self._finish_at_arrival(request, FinishReason.IGNORED, why_ignored)
        elif request.output_token_ids and at_length(request, self.max_len):
            self._finish_at_arrival(request, FinishReason.LENGTH, "")  # resumed from elsewhere
        else:
            self.requests[rid] = request
            self.tracker.add(request)
            self.waiting.push(request)
        if self.config.debug_invariants:
            self.check_invariants()

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> bool:
        """Ends a live request from outside: its client gave up (ABORT), or the frontend saw
        it finish (STOP: a stop string the scheduler cannot see, since it holds no text)."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        release = "aborted" if reason is FinishReason.ABORT else "finished"
        self._finish(request, reason, "", release)
        if self.config.debug_invariants:
            self.check_invariants()
        return True

    def drain(self, source: str = "worker_lost") -> list[Request]:
        """The worker is gone: hand every live request back, reset to recompute elsewhere."""
        live = sorted(self.requests.values(), key=lambda r: r.arrival_index)
        for request in live:
            self.kv.free(request.request_id)
            self.tracker.remove(request.request_id, source)
            request.reset_for_recompute(RequestStatus.WAITING)
        self.kv.clear_cache(source)
        self.requests.clear()
        self.running = []
        self.running_per_tenant.clear()
        self.waiting = make_waiting_queue(self.config.scheduling_policy, self.running_per_tenant)
        self._stall = None
        self._dropped = []
        self._in_flight = []
        if self.config.debug_invariants:
            self.check_invariants()
        return live

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset_prefix_cache()

    # -- one step: plan -------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self._step_id += 1
        full_budget = self.config.max_num_batched_tokens
        cont: list[ScheduledCont] = []
        new: list[ScheduledNew] = []
        stall, self._stall = self._stall, None
        if stall is not None and self.config.scheduling_policy == "fair":
            self._take_seat_for(stall)
        budget, preempted = self._schedule_running(cont, full_budget)
        budget = self._schedule_waiting(new, budget, preempted)
        output = SchedulerOutput(
            step_id=self._step_id,
            new=new,
            cont=cont,
            dropped_request_ids=self._dropped,
            finished=self._finished_pending,
            num_batched_tokens=full_budget - budget,
        )
        self._dropped, self._finished_pending = [], []
        if not output.is_empty:
            self._in_flight.append(output)
        if self.config.debug_invariants:
            self.check_invariants()
        return output

    def _schedule_running(self, cont: list[ScheduledCont], budget: int) -> tuple[int, bool]:
        running, kv = self.running, self.kv
        chunked = self.config.enable_chunked_prefill
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            computed = request.num_computed_tokens
            end = request.num_tokens + request.num_placeholders
            num_new = end - computed
            if (
                request.num_drafts
                or num_new <= 0
                or not may_plan_ahead(request, self.max_len)
                or (request.num_placeholders and self._drafts_next(request))
            ):
                i += 1  # waits for the token of a step still in flight
                continue
            if num_new > budget:
                if not chunked:
                    i += 1
                    continue
                num_new = budget
            total = computed + num_new
            rid = request.request_id
            drafts = self._drafts(request, num_new, budget)
            new_block_ids = kv.allocate_slots(rid, total + len(drafts))
            if new_block_ids is None and drafts:
                drafts = []  # a draft never preempts anyone: the step goes on without it
                new_block_ids = kv.allocate_slots(rid, total)
            while new_block_ids is None:
                victim = running.pop()  # the back of the policy order
                self._requeue(victim, "preempted")
                self.stats.preemptions += 1
                preempted = True
                if victim is request:
                    break
                new_block_ids = kv.allocate_slots(rid, total)
            if new_block_ids is None:
                break  # it preempted itself; it was the last one left to serve
            written = self._commit_known(request, total)
            samples = total == end
            num_new += len(drafts)
            cont.append(
                ScheduledCont(
                    rid, new_block_ids, computed, num_new, written, samples, request.placement
                )
            )
            if drafts:
                cont[-1].draft_token_ids = drafts
                request.num_drafts = len(drafts)
                self.stats.spec_drafts += 1
                self.stats.spec_draft_tokens += len(drafts)
            request.num_computed_tokens = computed + num_new
            if samples and not request.is_embedding:
                request.num_placeholders += 1
            budget -= num_new
            i += 1
        return budget, preempted

    def _drafts(self, request: Request, num_new: int, budget: int) -> list[int]:
        """Tokens drafted to follow a decode step's token (core/speculative.py), within the
        token budget, max_tokens and the context. None without --speculative-config, for a
        prompt chunk, past disable_by_batch_size, or while a step that samples for the request
        is in flight (its token, which a draft would follow, is not known yet)."""
        spec = self.config.speculative
        if spec is None or num_new != 1 or not self._may_draft(request):
            return []
        if request.num_placeholders:  # planned ahead while backing off: a step of its wait
            if request.drafting is not None:
                request.drafting.tick()
            return []
        limit = min(
            budget - 1,
            request.max_tokens - request.num_output_tokens - 1,
            self.max_len - request.num_tokens - 1,
        )
        if limit < 1:
            return []
        if request.drafting is None:
            request.drafting = DraftState(NgramIndex(spec.min_match))
        return propose(spec, request.drafting, request.all_token_ids, limit)

    def _take_seat_for(self, stall: Stall) -> None:
        """Fair policy (core/fair.py): a head that found no seat or block in the last pass,
        and still would not, takes one from the tenant holding the most, if that tenant holds
        SEAT_MARGIN more. Admission stays open in this step: the room is freed for the head."""
        if not self.waiting:
            return
        head = self.waiting.peek()
        if not stall.persists(head, len(self.running), self.kv.num_free_blocks):
            return  # another head, or room came back since: the pass decides afresh
        victim = seat_for(head, self.running, self.running_per_tenant)
        if victim is not None:
            self.running.pop()
            self._requeue(victim, "preempted")
            self.stats.preemptions += 1

    def _stall_at(self, request_id: str) -> Stall:
        return Stall(request_id, len(self.running), self.kv.num_free_blocks)

    def _schedule_waiting(self, new: list[ScheduledNew], budget: int, preempted: bool) -> int:
        config, waiting, tracker = self.config, self.waiting, self.tracker
        while waiting:
            request = waiting.peek()
            rid = request.request_id
            if preempted:
                tracker.release_lookup(rid, "preempted_step")
                break
            if len(self.running) >= config.max_num_seqs:
                tracker.release_lookup(rid, "max_num_seqs")
                self._stall = self._stall_at(rid)
                break
            if budget <= 0:
                tracker.release_lookup(rid, "token_budget")
                break
            lookup = tracker.lookup(request)
            num_new = request.num_tokens - lookup.num_tokens
            if num_new > budget:
                # An embedding is one pass over the whole input: it is never split.
                if not config.enable_chunked_prefill or request.is_embedding:
                    tracker.release_lookup(rid, "token_budget")
                    break
                num_new = budget
            total = lookup.num_tokens + num_new
            if self.kv.allocate_for_admission(rid, lookup.blocks, total) is None:
                tracker.release_lookup(rid, "no_blocks")
                self._stall = self._stall_at(rid)
                break
            waiting.pop()
            new.append(self._admit(request, lookup, num_new))
            budget -= num_new
        if new:
            self.running = self._order(self.running)
        return budget

    def _admit(self, request: Request, lookup: CacheLookup, num_new: int) -> ScheduledNew:
        rid = request.request_id
        computed = lookup.num_tokens
        total = computed + num_new
        caching = self.config.caches_prefixes
        request.num_committed_tokens = computed  # the claimed blocks: committed already
        written = self._commit_known(request, total)
        samples = total == request.num_tokens
        scheduled = ScheduledNew(
            request_id=rid,
            token_ids=list(request.all_token_ids),
            block_ids=self.kv.block_ids(rid),
            num_computed_tokens=computed,
            num_scheduled_tokens=num_new,
            num_prompt_tokens=request.num_prompt_tokens,
            claimed=self.kv.claimed_pairs(rid, len(lookup.blocks)),
            written=written,
            samples=samples,
            placement=request.placement,
        )
        request.status = RUNNING
        self._count_running(request, 1)
        request.num_computed_tokens = total
        if samples and not request.is_embedding:
            request.num_placeholders += 1
        if not request.was_admitted:
            request.was_admitted = True
            request.num_cached_tokens = computed
        if caching and not request.skip_prefix_cache:
            self.stats.prefix_cache_queries += request.num_tokens
            self.stats.prefix_cache_hits += computed
        self.running.append(request)  # the pass puts running back in policy order at its end
        return scheduled

    def _commit_known(self, request: Request, total: int) -> list[BlockHashPair]:
        """Commits the full blocks of known tokens up to `total` computed ones (a block that a
        placeholder fills waits: core/lookahead.py)."""
        known = newly_committable(request, total, self.config.block_size)
        return self._commit(request, known) if known else []

    def _commit(self, request: Request, num_tokens: int) -> list[BlockHashPair]:
        num_full = num_tokens // self.config.block_size
        # An embedding pass writes no KV: its blocks hold nothing worth a hash or a claim.
        cache = self.config.caches_prefixes and not request.is_embedding
        chain = self.tracker.chain(request, num_full) if cache else []
        return self.kv.commit_full_blocks(
            request.request_id, request.all_token_ids, chain, num_full, cache=cache
        )

    # -- one step: results ----------------------------------------------------------------

    def update_from_output(
        self, output: SchedulerOutput, result: ModelResult
    ) -> list[RequestUpdate]:
        updates: list[RequestUpdate] = []
        self._in_flight = [o for o in self._in_flight if o is not output]
        if result.all_cleared:
            self._worker_restarted()
        if result.removed_block_ids:
            self.kv.remove_blocks(result.removed_block_ids, "worker_report")
        deferred = result.deferred_request_ids
        failed = set(result.errored) | set(result.stale_request_ids) | set(deferred)
        if failed:
            self._forget_unwritten(output, failed)
        for rid, message in result.errored.items():
            request = self.requests.get(rid)
            if request is not None:
                self._finish(request, FinishReason.ERROR, message, "error", batched=True)
                updates.append(update_of(request))
        self._requeue_refused(result.stale_request_ids)
        self._requeue_deferred(deferred)
        scheduled: Iterable[ScheduledNew | ScheduledCont] = iter_chain(output.new, output.cont)
        self._apply_samples(scheduled, result, updates)
        if self._running_dirty:
            self.running = self._order(r for r in self.running if r.status is RUNNING)
            self._running_dirty = False
        self._audit()
        if self.config.debug_invariants:
            self.check_invariants()
        return updates

    def _worker_restarted(self) -> None:
        """The worker came back with empty KV memory: whatever it computed is gone.

        Each running request recomputes from scratch; every cached hash goes, so a waiting
        request's lookup is found stale (source worker_lost) before it is used.
        """
        self._requeue_in_order(list(self.running), "worker_lost")
        self.kv.clear_cache("worker_lost")

    def _requeue_refused(self, request_ids: Iterable[str]) -> None:
        """Requests the worker refused for a stale claim go back to recompute."""
        refused = [self.requests.get(rid) for rid in request_ids]
        live = [r for r in refused if r is not None and r.status is RUNNING]
        self._requeue_in_order(live, "preempted")
        bump(self.stats.stale_entries, "worker_report", len(live))

    def _requeue_deferred(self, request_ids: Iterable[str]) -> None:
        """Requests the worker did not run because their grammar was still compiling while
        other requests ran (it never makes them wait): back to the front of the queue, their
        blocks freed (nothing was written to them), to be admitted again next step. Not a
        preemption, and not stale: counted as released for `grammar_pending`."""
        deferred = [self.requests.get(rid) for rid in request_ids]
        live = [r for r in deferred if r is not None and r.status is RUNNING]
        self._requeue_in_order(live, "grammar_pending", preempted=False)
        self.stats.grammar_deferrals += len(live)

    def _requeue_in_order(
        self, requests: list[Request], release_reason: str, preempted: bool = True
    ) -> None:
        # each goes to the front of the queue, so the one to serve first goes last
        for request in reversed(self._order(requests)):
            self._requeue(request, release_reason, preempted)
            self._running_dirty = True

    def _apply_samples(
        self,
        scheduled: Iterable[ScheduledNew | ScheduledCont],
        result: ModelResult,
        updates: list[RequestUpdate],
    ) -> None:
        requests, sampled, max_len = self.requests, result.sampled, self.max_len
        embedded = set(result.embedded)
        for item in scheduled:
            request = requests.get(item.request_id)
            if (
                not item.samples
                or request is None
                or request.status is not RUNNING
                or request.placement != item.placement
            ):
                continue  # a prompt chunk, or gone, requeued, or planned before a requeue
            if not request.is_embedding:
                request.num_placeholders -= 1
            if request.is_embedding:
                if request.request_id in embedded:
                    self._finish(request, FinishReason.STOP, "", "finished", batched=True)
                else:
                    message = "the worker returned no embedding for a scheduled request"
                    self._finish(request, FinishReason.ERROR, message, "error", batched=True)
                updates.append(update_of(request, [], result.payloads.get(request.request_id)))
                continue
            token = sampled.get(request.request_id)
            if token is None:
                message = "the worker returned no token for a scheduled request"
                self._finish(request, FinishReason.ERROR, message, "error", batched=True)
                updates.append(update_of(request))
                continue
            tokens = [token]
            if request.num_drafts:
                kept = self._settle_drafts(request, item, result.accepted.get(item.request_id, 0))
                if kept is None:
                    message = "the worker kept more draft tokens than were scheduled"
                    self._finish(request, FinishReason.ERROR, message, "error", batched=True)
                    updates.append(update_of(request))
                    continue
                tokens = kept + tokens
            appended: list[int] = []
            for token in tokens:  # a stop among kept drafts ends the request there
                request.append_output_token(token)
                appended.append(token)
                reason = stop_reason(request, token, max_len)
                if reason is not None:
                    self._finish(request, reason, "", "finished", batched=True)
                    break
            payload = result.payloads.get(request.request_id)
            updates.append(update_of(request, appended, payload))  # with its finish, if it ended

    def _drafts_next(self, request: Request) -> bool:
        """Whether the request drafts at its next step: then it is not planned ahead on a
        placeholder (async scheduling, bundles), since its draft follows that very token. A
        request backing off from rejected drafts is planned ahead as any other."""
        drafting = request.drafting
        return self._may_draft(request) and (drafting is None or drafting.wait == 0)

    def _may_draft(self, request: Request) -> bool:
        spec = self.config.speculative
        return (
            spec is not None
            and request.may_speculate
            and not request.is_embedding
            and len(self.running) <= spec.disable_by_batch_size
        )

    def _settle_drafts(
        self, request: Request, item: ScheduledNew | ScheduledCont, accepted: int
    ) -> list[int] | None:
        """The drafts the worker kept (the first `accepted`), or None for a verdict on more
        than were scheduled. Positions of rejected drafts stop counting as computed, and the
        blocks only they took go back: their KV is never declared written, never read."""
        drafts = item.draft_token_ids if isinstance(item, ScheduledCont) else []
        request.num_drafts = 0
        if not 0 <= accepted <= len(drafts):
            return None
        request.num_computed_tokens = item.num_computed_tokens + 1 + accepted
        self.kv.trim(request.request_id, request.num_computed_tokens)
        stats = self.stats
        stats.spec_accepted_tokens += accepted
        for position in range(accepted):
            bump(stats.spec_accepted_per_position, str(position))
        if request.drafting is not None:
            settle(request.drafting, len(drafts), accepted)
        return drafts[:accepted]

    def _forget_unwritten(self, output: SchedulerOutput, request_ids: set[str]) -> None:
        """Blocks declared written by requests the worker did not run hold no such content.
        Plans still in flight (async scheduling) are void for those requests too: the worker
        skips the requests it failed or refused, so their declarations there never hold."""
        outputs = [output, *(o for o in self._in_flight if o is not output)]
        block_ids = declared_written(outputs, request_ids)
        if block_ids:
            self.kv.remove_blocks(block_ids, "worker_report")

    # -- state changes --------------------------------------------------------------------

    def _requeue(self, request: Request, release_reason: str, preempted: bool = True) -> None:
        """A running request back to the front of the queue to recompute; the caller takes it
        off `running`."""
        rid = request.request_id
        self.kv.free(rid)
        self._count_running(request, -1)
        request.reset_for_recompute(RequestStatus.PREEMPTED)
        request.num_preemptions += preempted
        self.tracker.release_lookup(rid, release_reason)
        self.waiting.push_front(request)
        self._dropped.append(rid)

    def _finish(
        self,
        request: Request,
        reason: FinishReason,
        message: str,
        release_reason: str,
        batched: bool = False,
    ) -> None:
        rid = request.request_id
        if request.status is RUNNING:
            self.kv.free(rid)
            self._dropped.append(rid)
            self._count_running(request, -1)
            if batched:
                self._running_dirty = True
            else:
                self.running.remove(request)
                self.running = self._order(self.running)  # fair: later ranks of its tenant move
        else:
            self.waiting.remove(request)
        request.finish(reason, message)
        del self.requests[rid]
        self.tracker.remove(rid, release_reason)

    def _count_running(self, request: Request, delta: int) -> None:
        load, tenant = self.running_per_tenant, request.tenant
        load[tenant] += delta
        if not load[tenant]:
            del load[tenant]

    def _finish_at_arrival(self, request: Request, reason: FinishReason, message: str) -> None:
        request.finish(reason, message)
        self._finished_pending.append(update_of(request))

    def _audit(self) -> None:
        """After each step: entries and tables that outlived their request. Should be none."""
        self.tracker.purge_orphans(self.requests, len(self.requests))
        if self.kv.num_tables != len(self.running):
            running_ids = {r.request_id for r in self.running}
            self.stats.table_orphans += self.kv.free_orphan_tables(running_ids)
