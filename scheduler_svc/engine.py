"""The scheduler service's engine: the registry of connected workers and the life of a request
on them (submit, place, deliver, retire, re-place after a lost worker).

What it delegates, each to its own module: checking a registration (registration.py), checking
a request before placement (admission.py), choosing a worker (routing.py, pure), translating to
and from the wire (wire.py), one worker's ledger and plans (worker_link.py), reading the ledgers
for Prometheus (readings.py, metrics.py). Live requests are recorded once, on the link that
holds them (`WorkerLink.live`): the engine finds a request through its links and keeps no map
of its own.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections import Counter

import grpc
from prometheus_client import CollectorRegistry, Gauge

from kvledger.config.scheduler import EngineConfig
from protos import frontend_pb2, worker_pb2
from scheduler_svc import admission, registration, routing
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.errors import PlacementError
from scheduler_svc.live import Delivery, LiveRequest, RequestFailure
from scheduler_svc.metrics import LedgerCollector, LinkMetrics, RequestMetrics
from scheduler_svc.readings import LedgerReadings
from scheduler_svc.wire import (
    model_infos,
    request_from_embed_input,
    request_from_generate,
    sampling_with_min_tokens,
)
from scheduler_svc.worker_link import WorkerLink

__all__ = ["Engine", "EngineConfig", "PlacementError"]

log = logging.getLogger(__name__)


def _refreeze_gc() -> None:
    """Moves what is alive now (above all the block pools, full of reference cycles through the
    free queue) out of the collector's reach: a full collection over a large pool otherwise
    stalls a scheduling step for tens of milliseconds. Unfreezing first lets the collector
    reclaim a dropped pool; registrations and losses are rare, so the collection is too
    (freezing without it left lost pools frozen: tests/service/test_links.py)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class Engine:
    def __init__(self, config: EngineConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.links: dict[str, WorkerLink] = {}
        self.known_models: set[str] = set()  # every model a worker ever registered
        self.metrics = RequestMetrics(self.registry)
        self.link_metrics = LinkMetrics(self.registry)
        self.readings = LedgerReadings(lambda: self.links.values())
        self.registry.register(LedgerCollector(self.readings))
        Gauge(
            "kvledger_max_waiting_requests",
            "Queue length per model past which requests get 429 (--max-waiting-requests)",
            registry=self.registry,
        ).set(config.max_waiting_requests)

    # ---- workers ----

    def ledger_config(self, reg: worker_pb2.Registration) -> SchedulerConfig:
        """The ledger a registration asks for; PlacementError when it cannot be served."""
        return registration.ledger_config(reg, self.config, self._registrations())

    def attach(
        self, reg: worker_pb2.Registration, cfg: SchedulerConfig, scheduler: Scheduler
    ) -> WorkerLink:
        """Serves the worker with its ledger, once checked again against the workers
        connected now (they may have changed while the ledger was being built)."""
        registration.check_against_peers(reg, self._registrations())
        self.readings.loop = asyncio.get_running_loop()
        link = WorkerLink(
            reg,
            cfg,
            self._on_update,
            plan_ahead=self.config.async_scheduling,
            scheduler=scheduler,
            num_scheduler_steps=self.config.num_scheduler_steps,
        )
        self.links[link.worker_id] = link
        self.known_models.add(link.model)
        # exported at 0 from the start, so a dashboard or an alert sees the series before it moves
        self.link_metrics.step_timeouts.labels(link.model, link.worker_id)
        _refreeze_gc()  # the new pool out of the collector's reach; one full collection
        log.info(
            "worker %s registered: model %s, %d blocks of %d tokens",
            link.worker_id,
            link.model,
            reg.num_blocks,
            reg.block_size,
        )
        return link

    def unregister(self, link: WorkerLink) -> None:
        if self.links.get(link.worker_id) is not link:
            return
        del self.links[link.worker_id]
        orphans = link.close()
        self.readings.retire(link)
        log.warning("worker %s lost with %d live requests", link.worker_id, len(orphans))
        _refreeze_gc()  # after close(): the dropped pool must not stay frozen
        for live in orphans:
            if live.done:
                continue
            try:
                self._place(live)
            except PlacementError as err:
                self._retire(
                    live,
                    FinishReason.ERROR,
                    RequestFailure(err.code, f"worker lost and {err.message}"),
                )

    def step_timed_out(self, link: WorkerLink) -> None:
        """The worker has not answered its plan within --worker-step-timeout: it is alive
        enough to keep its stream open but not to compute. Drop it like a broken stream."""
        if self.links.get(link.worker_id) is not link:
            return
        log.error(
            "worker %s (model %s) has not answered a plan in %.1f s (--worker-step-timeout "
            "%g s): dropping it; its requests move to another worker",
            link.worker_id,
            link.model,
            link.plan_outstanding_for(),
            self.config.worker_step_timeout,
        )
        self.link_metrics.step_timeouts.labels(link.model, link.worker_id).inc()
        self.unregister(link)

    def links_for(self, model: str) -> list[WorkerLink]:
        return [link for link in self.links.values() if link.model == model and link.alive]

    def models(self) -> list[frontend_pb2.ModelInfo]:
        return model_infos(self._registrations())

    def _registrations(self) -> list[worker_pb2.Registration]:
        return [link.registration for link in list(self.links.values())]

    # ---- requests ----

    @property
    def requests(self) -> dict[str, LiveRequest]:
        """Every live request by id, gathered from the links (a copy: O(live requests))."""
        return {
            rid: live for link in list(self.links.values()) for rid, live in list(link.live.items())
        }

    def link_of(self, request_id: str) -> WorkerLink | None:
        """The worker a live request is placed on, None once it ended (or never was)."""
        return next((lk for lk in list(self.links.values()) if request_id in lk.live), None)

    def submit_generate(self, req: frontend_pb2.GenerateRequest) -> LiveRequest:
        resumed = list(req.resumed_token_ids)
        prompt_and_resumed = [*req.prompt_token_ids, *resumed]
        # A continuation was admitted before its frontend's link broke: it is not new load,
        # and a full queue must not end a stream that already sent text.
        reg = self._admissible(
            req.request_id,
            req.model,
            prompt_and_resumed,
            embed=False,
            queued=not resumed,
            tenant=req.tenant,
        )
        admission.check_continuation(len(resumed), req.stop.max_tokens)
        admission.check_priority(req.priority, self.config.scheduling_policy)
        core = request_from_generate(req, reg.eos_token_ids)
        sampling = sampling_with_min_tokens(req, reg.eos_token_ids)
        live = LiveRequest(core=core, model=req.model, sampling=sampling)
        self._place(live)
        return live

    def submit_embed(
        self,
        request_id: str,
        model: str,
        token_ids: list[int],
        embed: worker_pb2.EmbedParams,
        tenant: str = "",
    ) -> LiveRequest:
        self._admissible(request_id, model, token_ids, embed=True, tenant=tenant)
        core = request_from_embed_input(request_id, token_ids, tenant)
        live = LiveRequest(
            core=core, model=model, sampling=frontend_pb2.SamplingParams(), embed=embed
        )
        self._place(live)
        return live

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> bool:
        """Ends a request from outside: ABORT when its client gave up, STOP when the frontend
        finished it on a stop string."""
        link = self.link_of(request_id)
        if link is None:
            return False
        live = link.live[request_id]
        link.abort(request_id, reason)
        # Wakes a stream still waiting on it (an Abort RPC from another caller).
        message = "request aborted" if reason is FinishReason.ABORT else "finished by caller"
        self._retire(live, reason, RequestFailure(grpc.StatusCode.CANCELLED, message))
        return True

    def reset_prefix_cache(self) -> bool:
        return all([link.scheduler.reset_prefix_cache() for link in self.links.values()])

    def _admissible(
        self,
        request_id: str,
        model: str,
        token_ids: list[int],
        embed: bool,
        queued: bool = True,
        tenant: str = "",
    ) -> worker_pb2.Registration:
        """The model's registration, when a new request may be placed (admission.py's order);
        `queued=False` skips the queue limit (a continuation). Under the fair policy the
        tenant's share of the queue is weighed too (admission.TenantShare)."""
        if self.link_of(request_id) is not None:
            raise PlacementError(
                grpc.StatusCode.ALREADY_EXISTS, f"request id {request_id!r} is already in use"
            )
        links = self.links_for(model)
        reg = admission.check_model(
            model,
            [link.registration for link in links],
            known=model in self.known_models,
            embed=embed,
            num_waiting=sum(link.scheduler.num_waiting for link in links),
            max_waiting=self.config.max_waiting_requests if queued else sys.maxsize,
            share=self._share(links, tenant) if self.config.scheduling_policy == "fair" else None,
        )
        admission.check_prompt(token_ids, reg.vocab_size)
        return reg

    @staticmethod
    def _share(links: list[WorkerLink], tenant: str) -> admission.TenantShare:
        waiting: Counter[str] = Counter()
        for link in links:
            waiting.update(link.scheduler.waiting_per_tenant())
        return admission.TenantShare(waiting[tenant], len(waiting.keys() | {tenant}))

    def _place(self, live: LiveRequest) -> None:
        """Onto the worker routing chooses; UNAVAILABLE when none of its model is up."""
        links = {link.worker_id: link for link in self.links_for(live.model)}
        if not links:
            raise PlacementError(
                grpc.StatusCode.UNAVAILABLE, f"no worker for model {live.model!r} is up"
            )
        core, now = live.core, time.monotonic()
        chosen = routing.choose(
            [link.routing_view(now) for link in links.values()],
            routing.Demand(core.num_prompt_tokens, core.max_tokens),
            self.config.worker_step_timeout,
            lambda view: links[view.worker_id].cached_prefix_tokens(core),
        )
        links[chosen.worker_id].add(live)

    def _on_update(self, live: LiveRequest, delivery: Delivery) -> None:
        if live.done:
            return
        update = delivery.update
        if update.new_token_ids and live.first_token_time is None:
            live.first_token_time = time.monotonic()
        self.metrics.tokens_generated(live, len(update.new_token_ids))
        if update.finish_reason is not None:
            self._retire(live, update.finish_reason, delivery)
        else:
            live.updates.put_nowait(delivery)

    def _retire(
        self, live: LiveRequest, reason: FinishReason, last: Delivery | RequestFailure
    ) -> None:
        """The one way a request ends in the service, whatever ended it (its last update, an
        abort, a lost worker with nowhere to go): done, counted once, its stream handed its
        last item. Its ledger and link entries are already gone, by the same path that ended
        it (the core finished it and the link dropped it, or link.abort, or link.close)."""
        live.done = True
        self.metrics.finished(live, reason.value)
        live.updates.put_nowait(last)
