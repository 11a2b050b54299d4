"""The scheduler service's engine: workers by model, routing, request placement and re-placement."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import grpc
from prometheus_client import CollectorRegistry, Gauge

from protos import frontend_pb2, worker_pb2
from scheduler_svc.config import EngineConfig
from scheduler_svc.convert import request_from_embed_input, request_from_generate
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.request import FinishReason, Request
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.core.stats import SchedulerSnapshot
from scheduler_svc.link import WorkerLink
from scheduler_svc.live import Delivery, LiveRequest, RequestFailure
from scheduler_svc.metrics import (
    LedgerCollector,
    LedgerReading,
    LinkMetrics,
    RequestMetrics,
    RetiredLedgers,
)

log = logging.getLogger(__name__)

# A cached token is worth this many queued requests when choosing a worker.
CACHED_TOKENS_PER_QUEUED_REQUEST = 64
# A worker whose plan has been out longer than this share of --worker-step-timeout is overdue:
# it gets new requests only when no worker of its model that is not overdue can take them.
OVERDUE_SHARE_OF_STEP_TIMEOUT = 0.5


# Sane bounds of a registration. The ledger keeps a Python object per KV block (~150 bytes,
# ~1 s to build a million): 2^22 blocks is ~600 MB and a few seconds, built off the event loop;
# 10M blocks of one token once took the scheduler to 1.6 GB and froze every call for 15 s.
REGISTRATION_LIMITS = {
    "num_blocks": 1 << 22,
    "block_size": 1 << 12,
    "max_model_len": 1 << 24,
    "vocab_size": 1 << 24,
    "embedding_size": 1 << 16,
}


def _refreeze_gc() -> None:
    """Moves what is alive now (above all the block pools, full of reference cycles through the
    free queue) out of the collector's reach: a full collection over a large pool otherwise
    stalls a scheduling step for tens of milliseconds. Unfreezing first lets the collector
    reclaim a dropped pool; registrations and losses are rare, so the collection is too
    (freezing without it left lost pools frozen: tests/service/test_links.py)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class PlacementError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Engine:
    def __init__(self, config: EngineConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.links: dict[str, WorkerLink] = {}
        self.requests: dict[str, LiveRequest] = {}
        self.where: dict[str, WorkerLink] = {}
        self.known_models: set[str] = set()  # every model a worker ever registered
        self.metrics = RequestMetrics(self.registry)
        self.link_metrics = LinkMetrics(self.registry)
        self.retired = RetiredLedgers()  # counters of the ledgers of lost workers
        self.registry.register(LedgerCollector(self.ledger_readings))
        Gauge(
            "kvledger_max_waiting_requests",
            "Queue length per model past which requests get 429 (--max-waiting-requests)",
            registry=self.registry,
        ).set(config.max_waiting_requests)
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- workers ----

    def ledger_readings(self) -> list[LedgerReading]:
        """Every ledger's counters and gauges, read on the engine's loop so that no step is
        half-seen (the metrics endpoint calls this from its own thread). The counters of lost
        workers' ledgers are kept, so an exported counter never goes down."""

        def take() -> list[LedgerReading]:
            return self.retired.readings(
                (lk.model, lk.worker_id, lk.scheduler.snapshot())
                for lk in list(self.links.values())
            )

        loop = self._loop
        if loop is None or not loop.is_running() or _on_loop(loop):
            return take()

        async def on_loop() -> list[LedgerReading]:
            return take()

        return asyncio.run_coroutine_threadsafe(on_loop(), loop).result(timeout=5)

    def ledger_snapshots(self) -> list[tuple[str, str, SchedulerSnapshot]]:
        """(model, worker, snapshot) of every ledger, lost workers' included (gauges at 0)."""
        return [(r.model, r.worker, r.snapshot) for r in self.ledger_readings()]

    def register(self, registration: worker_pb2.Registration) -> WorkerLink:
        """Checks a registration, builds its ledger and attaches the worker, on the loop.
        The Connect handler does the same with the ledger built off the loop."""
        cfg = self.ledger_config(registration)
        return self.attach(registration, cfg, Scheduler(cfg))

    def ledger_config(self, registration: worker_pb2.Registration) -> SchedulerConfig:
        """The ledger a registration asks for; PlacementError when it cannot be served."""
        self._check_unused_id(registration)
        self._check_well_formed(registration)
        is_embed = registration.kind == frontend_pb2.MODEL_KIND_EMBED
        chunked = self.config.enable_chunked_prefill and not is_embed
        budget = self.config.max_num_batched_tokens
        if not chunked and budget < registration.max_model_len:
            # A whole prompt must fit one step when it cannot be split.
            log.info(
                "worker %s: token budget raised to max_model_len %d (no chunked prefill)",
                registration.worker_id,
                registration.max_model_len,
            )
            budget = registration.max_model_len
        try:
            cfg = SchedulerConfig(
                num_blocks=registration.num_blocks,
                block_size=registration.block_size,
                max_num_seqs=self.config.max_num_seqs,
                max_num_batched_tokens=budget,
                max_model_len=registration.max_model_len,
                enable_prefix_caching=self.config.enable_prefix_caching and not is_embed,
                enable_chunked_prefill=chunked,
                scheduling_policy=self.config.scheduling_policy,
                kv_cache=not is_embed,
                debug_invariants=self.config.debug_invariants,
            )
        except ValueError as err:  # a registration no ledger can be built for: permanent
            raise PlacementError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"worker {registration.worker_id!r} cannot be served: {err}",
            ) from err
        self._check_consistent(registration)
        return cfg

    def attach(
        self, registration: worker_pb2.Registration, cfg: SchedulerConfig, scheduler: Scheduler
    ) -> WorkerLink:
        """Serves the worker with its ledger. Checked again: another worker may have taken
        the id, or registered the model differently, while the ledger was being built."""
        self._check_unused_id(registration)
        self._check_consistent(registration)
        self._loop = asyncio.get_running_loop()
        link = WorkerLink(
            registration,
            cfg,
            self._on_update,
            plan_ahead=self.config.async_scheduling,
            scheduler=scheduler,
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
            registration.num_blocks,
            registration.block_size,
        )
        return link

    def _check_unused_id(self, registration: worker_pb2.Registration) -> None:
        if registration.worker_id in self.links:
            raise PlacementError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"worker {registration.worker_id!r} is already connected",
            )

    @staticmethod
    def _check_well_formed(reg: worker_pb2.Registration) -> None:
        """A registration that could never work is refused as INVALID_ARGUMENT, which the
        worker takes as final (retrying would only repeat it)."""
        problems = []
        if not reg.worker_id:
            problems.append("worker_id is empty")
        if not reg.model_name:
            problems.append("model_name is empty")
        if reg.kind not in (frontend_pb2.MODEL_KIND_GENERATE, frontend_pb2.MODEL_KIND_EMBED):
            problems.append(f"kind {reg.kind} is neither generate nor embed")
        for field in ("block_size", "max_model_len", "vocab_size"):
            if getattr(reg, field) < 1:
                problems.append(f"{field} is {getattr(reg, field)}, must be at least 1")
        if reg.kind != frontend_pb2.MODEL_KIND_EMBED and reg.num_blocks < 1:
            problems.append(f"num_blocks is {reg.num_blocks}: a generative worker needs KV blocks")
        for field, limit in REGISTRATION_LIMITS.items():
            if getattr(reg, field) > limit:
                problems.append(f"{field} is {getattr(reg, field)}, more than {limit}")
        if problems:
            raise PlacementError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"malformed registration of worker {reg.worker_id!r}: " + "; ".join(problems),
            )

    def _check_consistent(self, reg: worker_pb2.Registration) -> None:
        """Workers of one model name must be interchangeable: requests move between them."""
        for other in self.links_for(reg.model_name):
            theirs = other.registration
            for field in ("kind", "vocab_size", "max_model_len", "embedding_size"):
                if getattr(reg, field) != getattr(theirs, field):
                    raise PlacementError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"worker {reg.worker_id!r} serves {reg.model_name!r} with {field} "
                        f"{getattr(reg, field)}, but worker {other.worker_id!r} has "
                        f"{getattr(theirs, field)}",
                    )

    def unregister(self, link: WorkerLink) -> None:
        if self.links.get(link.worker_id) is not link:
            return
        del self.links[link.worker_id]
        orphans = link.close()
        # The drained ledger's counters (its worker_lost releases among them) stay exported.
        self.retired.retire(link.model, link.worker_id, link.scheduler.snapshot())
        log.warning("worker %s lost with %d live requests", link.worker_id, len(orphans))
        _refreeze_gc()  # after close(): the dropped pool must not stay frozen
        for live in orphans:
            if live.done:
                continue
            try:
                self._place(live)
            except PlacementError as err:
                self._fail(live, err.code, f"worker lost and {err.message}")

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
        infos: dict[str, frontend_pb2.ModelInfo] = {}
        for link in self.links.values():
            reg = link.registration
            info = infos.get(reg.model_name)
            if info is None:
                info = infos[reg.model_name] = frontend_pb2.ModelInfo(
                    name=reg.model_name,
                    kind=reg.kind,
                    model_path=reg.model_path,
                    max_model_len=reg.max_model_len,
                    vocab_size=reg.vocab_size,
                    eos_token_ids=reg.eos_token_ids,
                    block_size=reg.block_size,
                    embedding_size=reg.embedding_size,
                )
            info.num_workers += 1
        return sorted(infos.values(), key=lambda m: m.name)

    # ---- requests ----

    def submit_generate(self, req: frontend_pb2.GenerateRequest) -> LiveRequest:
        links = self._check_model(req.model, req.request_id, embed=False)
        reg = links[0].registration
        self._check_tokens([*req.prompt_token_ids, *req.resumed_token_ids], reg)
        if req.resumed_token_ids and len(req.resumed_token_ids) >= req.stop.max_tokens:
            raise PlacementError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "a continuation must hold fewer resumed tokens than max_tokens",
            )
        core = request_from_generate(req, reg.eos_token_ids)
        live = LiveRequest(core=core, model=req.model, sampling=req.sampling)
        return self._admit(live)

    def submit_embed(
        self,
        request_id: str,
        model: str,
        token_ids: list[int],
        embed: worker_pb2.EmbedParams,
        tenant: str = "",
    ) -> LiveRequest:
        links = self._check_model(model, request_id, embed=True)
        self._check_tokens(token_ids, links[0].registration)
        core = request_from_embed_input(request_id, token_ids, tenant)
        live = LiveRequest(
            core=core, model=model, sampling=frontend_pb2.SamplingParams(), embed=embed
        )
        return self._admit(live)

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> bool:
        """Ends a request from outside: ABORT when its client gave up, STOP when the frontend
        finished it on a stop string."""
        live = self.requests.pop(request_id, None)
        if live is None:
            return False
        live.done = True
        link = self.where.pop(request_id, None)
        if link is not None:
            link.abort(request_id, reason)
        self.metrics.finished(live, reason.value)
        # Wakes a stream still waiting on it (an Abort RPC from another caller).
        message = "request aborted" if reason is FinishReason.ABORT else "finished by caller"
        live.updates.put_nowait(RequestFailure(grpc.StatusCode.CANCELLED, message))
        return True

    def reset_prefix_cache(self) -> bool:
        return all([link.scheduler.reset_prefix_cache() for link in self.links.values()])

    def _admit(self, live: LiveRequest) -> LiveRequest:
        self._place(live)
        self.requests[live.request_id] = live
        return live

    def _check_model(self, model: str, request_id: str, embed: bool) -> list[WorkerLink]:
        if request_id in self.requests:
            raise PlacementError(
                grpc.StatusCode.ALREADY_EXISTS, f"request id {request_id!r} is already in use"
            )
        links = self.links_for(model)
        if not links:
            if model in self.known_models:
                raise PlacementError(
                    grpc.StatusCode.UNAVAILABLE, f"no worker for model {model!r} is up"
                )
            raise PlacementError(grpc.StatusCode.NOT_FOUND, f"model {model!r} does not exist")
        if links[0].is_embedding and not embed:
            raise PlacementError(
                grpc.StatusCode.INVALID_ARGUMENT, f"model {model!r} is an embedding model"
            )
        waiting = sum(link.scheduler.num_waiting for link in links)
        if waiting >= self.config.max_waiting_requests:
            raise PlacementError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"the queue for model {model!r} is full"
            )
        return links

    @staticmethod
    def _check_tokens(token_ids: list[int], reg: worker_pb2.Registration) -> None:
        if not token_ids:
            raise PlacementError(grpc.StatusCode.INVALID_ARGUMENT, "the prompt is empty")
        bad = next((t for t in token_ids if t >= reg.vocab_size), None)
        if bad is not None:
            raise PlacementError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"token id {bad} is out of vocabulary (size {reg.vocab_size})",
            )

    def _place(self, live: LiveRequest) -> None:
        links = self.links_for(live.model)
        if not links:
            raise PlacementError(
                grpc.StatusCode.UNAVAILABLE, f"no worker for model {live.model!r} is up"
            )
        links = self._candidates(links, live.core)
        link = max(links, key=lambda lk: self._placement_key(lk, live.core))
        self.where[live.request_id] = link
        link.add(live)

    def _candidates(self, links: list[WorkerLink], core: Request) -> list[WorkerLink]:
        """The workers worth choosing among, best tier first. Workers of one model may differ
        in pool size (a CPU and a GPU worker): those whose ledger holds the whole request
        (prompt plus max_tokens, up to the context length), else those that hold its prompt.
        A worker that is not overdue comes before one that is, whatever its pool: an overdue
        worker may be hung, and a request sent there waits for the step deadline. With no
        worker able to hold the prompt, all are candidates and the ledger ignores it."""

        def holds(link: WorkerLink, num_tokens: int) -> bool:
            return link.scheduler.max_len >= min(num_tokens, link.scheduler.config.max_model_len)

        whole = core.num_prompt_tokens + max(core.max_tokens, 0)
        responsive = [link for link in links if not self._overdue(link)]
        for group in (responsive, links):
            for need in (whole, core.num_prompt_tokens):
                able = [link for link in group if holds(link, need)]
                if able:
                    return able
        return links

    def _overdue(self, link: WorkerLink) -> bool:
        limit = self.config.worker_step_timeout
        return limit > 0 and link.plan_outstanding_for() > limit * OVERDUE_SHARE_OF_STEP_TIMEOUT

    def _placement_key(self, link: WorkerLink, core: Request) -> tuple[float, float]:
        """Higher is better: the score, and on a tie the link whose current plan has been out
        the shortest (a worker that hangs mid-step keeps its cached prefixes and, once its
        clients gave up, a load of 0)."""
        return self._placement_score(link, core), -link.plan_outstanding_for()

    def _placement_score(self, link: WorkerLink, core: Request) -> float:
        cached = 0
        if not link.is_embedding:
            cached = link.scheduler.cached_prefix_tokens(core.all_token_ids, core.cache_salt)
        return cached / CACHED_TOKENS_PER_QUEUED_REQUEST - link.load

    def _on_update(self, live: LiveRequest, delivery: Delivery) -> None:
        if live.done:
            return
        update = delivery.update
        now = time.monotonic()
        if update.new_token_ids and live.first_token_time is None:
            live.first_token_time = now
        self.metrics.tokens_generated(live, len(update.new_token_ids))
        if update.finish_reason is not None:
            live.done = True
            self.requests.pop(live.request_id, None)
            self.where.pop(live.request_id, None)
            self.metrics.finished(live, update.finish_reason.value)
        live.updates.put_nowait(delivery)

    def _fail(self, live: LiveRequest, code: grpc.StatusCode, message: str) -> None:
        live.done = True
        self.requests.pop(live.request_id, None)
        self.where.pop(live.request_id, None)
        self.metrics.finished(live, FinishReason.ERROR.value)
        live.updates.put_nowait(RequestFailure(code, message))
