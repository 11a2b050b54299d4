"""Ledger invariants, checked after every step when debug_invariants is on.

The scheduler calls these checks, so they read it through `Ledger`, a view of their own, and
never import it: the dependency runs one way. The KV manager's checks (tables, ref counts,
free queue, hash map) live here too, beside the ones they complete; the manager without a KV
cache holds nothing to check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from scheduler_svc.core.block_hash import BlockHash
from scheduler_svc.core.block_pool import BlockPool
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.kv_cache_interface import KVManager
from scheduler_svc.core.kv_cache_manager import BlockTable, KVCacheManager, cdiv
from scheduler_svc.core.policy import running_order
from scheduler_svc.core.request import Request, RequestStatus
from scheduler_svc.core.stats import SchedulerStats
from scheduler_svc.core.tracker import ComputedBlocksTracker
from scheduler_svc.core.violation import ensure


class Ledger(Protocol):
    """What the checks read of a scheduler (core/scheduler.py)."""

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def running(self) -> list[Request]: ...

    @property
    def waiting(self) -> Iterable[Request]: ...

    @property
    def requests(self) -> Mapping[str, Request]: ...

    @property
    def running_per_tenant(self) -> Counter[str]: ...

    @property
    def tracker(self) -> ComputedBlocksTracker: ...

    @property
    def kv(self) -> KVManager: ...

    @property
    def stats(self) -> SchedulerStats: ...


def check_scheduler(scheduler: Ledger) -> None:
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
            0
            < request.num_computed_tokens
            <= request.num_tokens + request.num_placeholders + request.num_drafts,
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
    if isinstance(scheduler.kv, KVCacheManager):
        _check_kv_cache(scheduler.kv, running, chains)
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


def _check_lookups(scheduler: Ledger, waiting: list[Request]) -> None:
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


def _check_kv_cache(
    kv: KVCacheManager, running: Sequence[Request], chains: Mapping[str, Sequence[BlockHash]]
) -> None:
    """Tables, ref counts, the free queue and the hash map agree."""
    pool = kv.pool
    running_ids = {request.request_id for request in running}
    ensure(
        set(kv.tables) == running_ids,
        f"block tables {sorted(set(kv.tables) ^ running_ids)} do not match running requests",
    )
    holders = [0] * pool.num_blocks
    for request in running:
        table = kv.tables[request.request_id]
        _check_table(request, table, chains.get(request.request_id, ()), kv.block_size)
        for block in table.blocks:
            holders[block.block_id] += 1
    for block in pool.blocks:
        ensure(
            block.ref_cnt == holders[block.block_id],
            f"{block}: ref count {block.ref_cnt} but held by {holders[block.block_id]} tables",
        )
    _check_free_queue(pool)
    _check_hash_map(pool, kv.block_size)


def _check_table(
    request: Request, table: BlockTable, chain: Sequence[BlockHash], size: int
) -> None:
    rid = request.request_id
    ensure(
        len(table.blocks) == cdiv(request.num_computed_tokens, size),
        f"{rid}: {len(table.blocks)} blocks for {request.num_computed_tokens} computed tokens",
    )
    ensure(
        len({block.block_id for block in table.blocks}) == len(table.blocks),
        f"{rid}: a block appears twice in its table",
    )
    ensure(
        table.num_committed == request.num_committed_tokens // size
        and request.num_committed_tokens <= min(request.num_computed_tokens, request.num_tokens),
        f"{rid}: {table.num_committed} blocks committed of {request.num_committed_tokens} "
        f"known tokens, {request.num_computed_tokens} tokens computed",
    )
    tokens = request.all_token_ids
    for i, block in enumerate(table.blocks):
        if block.block_hash is None:
            continue
        ensure(i < table.num_committed, f"{rid}: partial block {block} is cached")
        ensure(
            i < len(chain) and block.block_hash == chain[i],
            f"{rid}: {block} at position {i} carries a hash not in the request's chain",
        )
        ensure(
            block.token_ids == tuple(tokens[i * size : (i + 1) * size]),
            f"{rid}: {block} at position {i} holds other tokens than the request",
        )


def _check_free_queue(pool: BlockPool) -> None:
    queued = list(pool.free_queue)
    ensure(len(queued) == len(pool.free_queue), "free queue length counter is wrong")
    ensure(len({id(b) for b in queued}) == len(queued), "a block is queued twice")
    ensure(all(b.ref_cnt == 0 for b in queued), "a referenced block is in the free queue")
    num_unreferenced = sum(1 for b in pool.blocks if b.ref_cnt == 0)
    ensure(
        num_unreferenced == len(queued),
        f"{num_unreferenced} unreferenced blocks but {len(queued)} in the free queue",
    )
    in_use = sum(1 for b in pool.blocks if b.ref_cnt > 0)
    ensure(len(queued) + in_use == pool.num_blocks, "free + in use != total")
    for b in pool.blocks:
        if b.ref_cnt > 0:
            ensure(b.prev_free is None and b.next_free is None, f"{b} in use but linked")
        ensure(b.ref_cnt >= 0, f"{b} has a negative ref count")


def _check_hash_map(pool: BlockPool, size: int) -> None:
    for block_hash, block in pool.cached.items():
        ensure(block.block_hash == block_hash, f"map entry points to {block} with other hash")
        ensure(len(block.token_ids) == size, f"cached {block} is not a full block")
        parent = block.parent
        if parent is not None:
            ensure(
                parent.block_hash is not None and pool.cached[parent.block_hash] is parent,
                f"cached {block} chains from an uncached parent",
            )
            ensure(
                parent.children is not None and block in parent.children,
                f"{parent} does not list its child {block}",
            )
        for child in block.children or ():
            ensure(child.parent is block, f"{child} is listed under a foreign parent")
    for block in pool.blocks:
        if block.block_hash is None:
            ensure(
                block.token_ids == () and block.parent is None and not block.children,
                f"uncached {block} still carries cache state",
            )
        else:
            ensure(pool.cached.get(block.block_hash) is block, f"{block} missing from map")
