"""Ledger invariants, checked after every step when debug_invariants is on."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from scheduler_svc.core.policy import running_order
from scheduler_svc.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from scheduler_svc.core.scheduler import Scheduler


class InvariantViolation(AssertionError):
    """The ledger disagrees with itself: a bug, never an operational condition."""


def ensure(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)


def check_scheduler(scheduler: Scheduler) -> None:
    """Every cross-structure fact the ledger relies on. O(everything): debug only."""
    running, waiting = scheduler.running, list(scheduler.waiting)
    live = scheduler.requests
    running_ids = [r.request_id for r in running]
    waiting_ids = [r.request_id for r in waiting]
    ensure(len(set(running_ids)) == len(running_ids), "a request is running twice")
    ensure(len(set(waiting_ids)) == len(waiting_ids), "a request is waiting twice")
    ensure(not set(running_ids) & set(waiting_ids), "a request is both running and waiting")
    ensure(
        set(live) == set(running_ids) | set(waiting_ids),
        f"live requests {sorted(set(live) ^ (set(running_ids) | set(waiting_ids)))} "
        "are not exactly the queued ones",
    )
    ensure(len(running) <= scheduler.config.max_num_seqs, "more running than max_num_seqs")
    for request in running:
        ensure(request.status is RequestStatus.RUNNING, f"{request.request_id} not RUNNING")
        ensure(
            0 < request.num_computed_tokens <= request.num_tokens + request.num_placeholders,
            f"{request.request_id}: computed {request.num_computed_tokens} of "
            f"{request.num_tokens} tokens and {request.num_placeholders} placeholders",
        )
        ensure(request.num_placeholders >= 0, f"{request.request_id}: negative placeholders")
    for request in waiting:
        ensure(
            request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED),
            f"waiting {request.request_id} has status {request.status}",
        )
        ensure(request.num_computed_tokens == 0, f"waiting {request.request_id} has KV")
        ensure(request.num_placeholders == 0, f"waiting {request.request_id} has placeholders")
    # FCFS: by arrival; priority: by (priority, arrival); fair: interleaved by tenant, so the
    # back (where preemption takes from) is the latest request of a tenant holding the most.
    ensure(
        running == running_order(scheduler.config.scheduling_policy)(running),
        f"running requests {running_ids} are out of {scheduler.config.scheduling_policy} order",
    )
    ensure(
        scheduler.running_per_tenant == Counter(r.tenant for r in running),
        f"running per tenant {dict(scheduler.running_per_tenant)} is not what runs",
    )
    if scheduler.config.scheduling_policy == "fair":
        _check_fcfs_within_tenants(waiting)
    tracker = scheduler.tracker
    ensure(
        set(tracker.entries) == set(live),
        f"tracker entries {sorted(set(tracker.entries) ^ set(live))} do not match live requests",
    )
    _check_lookups(scheduler, waiting)
    chains = {rid: entry.chain for rid, entry in tracker.entries.items()}
    scheduler.kv.check_invariants(running, chains)
    stats = scheduler.stats
    ensure(
        stats.prefix_cache_hits <= stats.prefix_cache_queries,
        f"prefix cache hits {stats.prefix_cache_hits} above queries {stats.prefix_cache_queries}",
    )
    if not live:
        kv = scheduler.kv
        ensure(kv.num_free_blocks == kv.num_blocks_total, "idle but blocks are in use")
        ensure(len(tracker) == 0, "idle but the tracker holds entries")
        ensure(kv.num_tables == 0, "idle but block tables remain")


def _check_fcfs_within_tenants(waiting: list[Request]) -> None:
    """Fair shares between tenants only: a tenant's requests that never ran are served in
    arrival order. Requeued ones are left out: they go back to the front, and refusals
    reported in different steps can requeue two out of arrival order, as under FCFS."""
    latest: dict[str, int] = {}
    for request in waiting:  # in the order they would be served
        if request.was_admitted:
            continue
        ensure(
            request.arrival_index > latest.get(request.tenant, -1),
            f"{request.request_id} of tenant {request.tenant!r} would be served after a later "
            "arrival of its tenant",
        )
        latest[request.tenant] = request.arrival_index


def _check_lookups(scheduler: Scheduler, waiting: list[Request]) -> None:
    """A lookup that claims to be current must be true: its blocks hold exactly its prefix."""
    size = scheduler.config.block_size
    for request in waiting:
        lookup = scheduler.tracker.peek_lookup(request.request_id)
        if lookup is None or any(
            block.generation != generation
            for block, generation in zip(lookup.blocks, lookup.generations, strict=True)
        ):
            continue  # known stale: it is recomputed before use
        tokens = request.all_token_ids
        ensure(
            lookup.num_tokens == len(lookup.blocks) * size
            and lookup.num_tokens < max(request.num_tokens, 1),
            f"{request.request_id}: lookup of {lookup.num_tokens} tokens is out of range",
        )
        for i, block in enumerate(lookup.blocks):
            ensure(
                block.block_hash is not None
                and block.token_ids == tuple(tokens[i * size : (i + 1) * size]),
                f"{request.request_id}: current lookup names {block}, which does not hold "
                "the request's tokens",
            )
