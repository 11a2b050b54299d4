"""One connected worker as the scheduler sees it: its own ledger and the requests placed on it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from protos import frontend_pb2, worker_pb2
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.output import RequestUpdate, SchedulerOutput
from scheduler_svc.core.request import FinishReason, Request
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.live import Delivery, LiveRequest
from scheduler_svc.routing import WorkerView
from scheduler_svc.wire import delivery_from, model_result_from, plan_from_output

log = logging.getLogger(__name__)

EMPTY_OUTPUT = SchedulerOutput(
    step_id=0, new=[], cont=[], dropped_request_ids=[], finished=[], num_batched_tokens=0
)


# A bundle stops growing where the worker's recent step time says it would run longer than
# its budget: BUNDLE_BUDGET_S, or STREAM_BUDGET_S for each request the step decodes if that is
# more. Bundles pay where a step is short next to the per-message costs (a small model such as
# tiny-llama, whose steps take a few milliseconds). Those costs grow with the streams a message
# carries: each stream costs the scheduler and the frontend CPU for every message, so a budget
# a stream keeps them a small, fixed share of a step's time however slow the step. One stream
# of a slow model gains next to nothing from bundles while its tokens come in long chunks, so
# it keeps BUNDLE_BUDGET_S's floor: it runs a step a plan and streams every token as it comes
# (the figures behind both budgets: docs/performance.md, "Scheduler").
BUNDLE_BUDGET_S = 0.05
STREAM_BUDGET_S = 0.008
# The step time a bundle is sized by: a moving average of the worker's decode-only steps, each
# new one weighing this much (about the last five steps), so one slow step does not end bundling.
STEP_TIME_SMOOTHING = 0.2


def bundle_budget_s(streams: int) -> float:
    """The longest a bundle of decode steps for `streams` requests may run (see above)."""
    return max(BUNDLE_BUDGET_S, STREAM_BUDGET_S * streams)


def _decodes_only(out: SchedulerOutput) -> bool:
    return bool(out.cont) and not out.new and all(c.num_scheduled_tokens == 1 for c in out.cont)


class LinkClosed(Exception):
    """The worker's stream ended: the link must not hand out more plans."""


class WorkerLink:
    def __init__(
        self,
        registration: worker_pb2.Registration,
        config: SchedulerConfig,
        on_update: Callable[[LiveRequest, Delivery], None],
        plan_ahead: bool = False,
        scheduler: Scheduler | None = None,
        num_scheduler_steps: int = 1,
    ) -> None:
        self.registration = registration
        self.worker_id = registration.worker_id
        self.model = registration.model_name
        self.is_embedding = registration.kind == frontend_pb2.MODEL_KIND_EMBED
        self.scheduler = scheduler if scheduler is not None else Scheduler(config)
        # The service's one record of live requests by id, per worker: a request is on exactly
        # one link from its placement to its last update (a lost worker's requests move to
        # another before anything else runs). The engine finds a request through the links.
        self.live: dict[str, LiveRequest] = {}
        self.alive = True
        self._on_update = on_update
        self._wake = asyncio.Event()
        # Async scheduling (--async-scheduling): a second plan goes out while the worker runs
        # the first, so the worker never waits for the scheduler between steps.
        self.plan_ahead_enabled = plan_ahead
        # A bundle: the decode steps planned at once and sent as one message, at most
        # --num-scheduler-steps (at least 1) and never more than the worker said it runs from
        # one message (`max_steps_per_plan`; a worker built before bundles says 0: one plan a
        # message)
        self.max_bundle_steps = min(num_scheduler_steps, max(registration.max_steps_per_plan, 1))
        self._in_flight: list[list[SchedulerOutput]] = []  # unanswered bundles, oldest first
        self._sent_at: list[float] = []  # monotonic time each of them left
        self.step_s = 0.0  # the worker's recent time per decode step (moving average)
        self.steps = 0  # results applied
        self.messages = 0  # plan messages sent (fewer than steps when bundles form)

    @property
    def plan_sent_at(self) -> float | None:
        """When the oldest unanswered plan left (None when none is out): the step deadline
        and the overdue check time the plan the worker is computing now."""
        return self._sent_at[0] if self._sent_at else None

    @property
    def has_in_flight(self) -> bool:
        return bool(self._in_flight)

    def plan_outstanding_for(self, now: float | None = None) -> float:
        """Seconds the oldest plan has waited for its result (0 when none is out)."""
        if self.plan_sent_at is None:
            return 0.0
        return max((time.monotonic() if now is None else now) - self.plan_sent_at, 0.0)

    @property
    def load(self) -> int:
        return len(self.live)

    def routing_view(self, now: float) -> WorkerView:
        """This worker as routing weighs it at `now` (a monotonic time)."""
        return WorkerView(
            worker_id=self.worker_id,
            max_len=self.scheduler.max_len,
            max_model_len=self.scheduler.config.max_model_len,
            load=self.load,
            plan_out_s=self.plan_outstanding_for(now),
        )

    def cached_prefix_tokens(self, core: Request) -> int:
        """Tokens of the request this worker's cache holds now (an embedding model caches
        nothing). Changes nothing: a probe for routing."""
        if self.is_embedding:
            return 0
        return self.scheduler.cached_prefix_tokens(core.all_token_ids, core.cache_salt)

    def add(self, live: LiveRequest) -> None:
        self.live[live.request_id] = live
        self.scheduler.add_request(live.core)
        self._wake.set()

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        if self.scheduler.abort_request(request_id, reason):
            self._wake.set()  # the next plan tells the worker to drop it
        self.live.pop(request_id, None)

    def close(self) -> list[LiveRequest]:
        """The worker is gone: empty its ledger and hand back its live requests to re-place.

        The service's own record decides what was live: a request the core ended on arrival
        still waits for its update, which the next schedule() would have sent.
        """
        self.alive = False
        self._wake.set()
        self._in_flight.clear()
        self._sent_at.clear()
        self.scheduler.drain("worker_lost")
        live = sorted(self.live.values(), key=lambda lv: lv.core.arrival_index)
        self.live.clear()
        return live

    async def next_plan(self) -> worker_pb2.Plan:
        """The next plan, waiting for work when there is none."""
        while True:
            if not self.alive:
                raise LinkClosed(self.worker_id)
            self._wake.clear()
            plan = self._plan()
            if plan is not None:
                return plan
            await self._wake.wait()

    def plan_ahead(self) -> worker_pb2.Plan | None:
        """With async scheduling on and one plan (or bundle) out, the next one, planned now on
        the tokens the worker is sampling (the core plans only what the worker certainly
        computes)."""
        if not (self.plan_ahead_enabled and self.alive and len(self._in_flight) == 1):
            return None
        return self._plan()

    def _plan(self) -> worker_pb2.Plan | None:
        bundle = self._schedule_bundle()
        if not bundle:
            return None
        self._in_flight.append(bundle)
        self._sent_at.append(time.monotonic())
        self.messages += 1
        first, *rest = (plan_from_output(out, self.live.__getitem__) for out in bundle)
        first.then.extend(rest)
        return first

    def _schedule_bundle(self) -> list[SchedulerOutput]:
        """One step, and with --num-scheduler-steps N up to N-1 more planned right behind it
        (each on the tokens the steps before it sample, as async scheduling plans): the core
        sees N plans in flight, and its rules for them hold unchanged."""
        bundle: list[SchedulerOutput] = []
        while len(bundle) < self.max_bundle_steps:
            out = self.scheduler.schedule()
            self._dispatch(out.finished)
            if out.is_empty:
                break
            self._note_scheduled(out)
            bundle.append(out)
            if not self._may_follow(out, len(bundle) + 1):
                break
        return bundle

    def _may_follow(self, out: SchedulerOutput, size: int) -> bool:
        """Another step joins the bundle (making it `size` steps) only behind a step of
        single-token decodes, with no waiting request that a plan could seat, with a free
        block for each running request, and while the bundle would take at most its budget
        (`bundle_budget_s`): a prefill's first token is not held back, a newcomer is not kept out
        of a free seat for a bundle, a step planned ahead never preempts for want of a block
        (that would throw away the tokens its victim samples in the steps before), and a slow
        model's stream is not chunked for no gain. (A bundle (or step) already in flight still
        runs first. Under the fair policy a waiting head with no seat may still take one from
        a loaded tenant at the next step of a bundle, core/fair.py: the victim's tokens of the
        bundle's earlier steps are dropped and recomputed, the price of the head waiting one
        step, not a bundle.)"""
        sched = self.scheduler
        seated = sched.num_running >= sched.config.max_num_seqs
        return (
            _decodes_only(out)
            and (sched.num_waiting == 0 or seated)
            and sched.kv.num_free_blocks >= sched.num_running
            and size * self.step_s <= bundle_budget_s(len(out.cont))
        )

    def apply_result(self, result: worker_pb2.StepResult) -> None:
        if not self.alive:
            # A result that arrives after the link was dropped (its worker timed out): the
            # ledger is drained and its requests live elsewhere now. Never apply it.
            log.warning("worker %s: result after the link was dropped, ignored", self.worker_id)
            return
        bundle = self._in_flight.pop(0) if self._in_flight else [EMPTY_OUTPUT]
        if self._sent_at:
            self._sent_at.pop(0)
        results = [result, *result.then]
        if len(results) != len(bundle):
            # a worker that ran fewer (or more) plans than the bundle held: the steps it did
            # not answer get an empty result, so their requests fail ("no token"), not hang
            log.warning(
                "worker %s answered %d plans with %d results",
                self.worker_id,
                len(bundle),
                len(results),
            )
        for i, out in enumerate(bundle):
            self._apply(out, results[i] if i < len(results) else worker_pb2.StepResult())

    def _apply(self, out: SchedulerOutput, result: worker_pb2.StepResult) -> None:
        for prompt in result.prompt_logprobs:
            live = self.live.get(prompt.request_id)
            if live is not None:
                live.receive_prompt_logprobs(prompt.start, prompt.entries)
        updates = self.scheduler.update_from_output(out, model_result_from(result))
        self.steps += 1
        if result.step_seconds > 0 and _decodes_only(out):  # what a bundle's steps are
            seconds, before = result.step_seconds, self.step_s
            self.step_s = before + STEP_TIME_SMOOTHING * (seconds - before) if before else seconds
        self._dispatch(updates)

    def _note_scheduled(self, out: SchedulerOutput) -> None:
        now = time.monotonic()
        for new in out.new:
            live = self.live.get(new.request_id)
            if live is not None and live.first_scheduled_time is None:
                live.first_scheduled_time = now

    def _dispatch(self, updates: list[RequestUpdate]) -> None:
        for update in updates:
            live = self.live.get(update.request_id)
            if live is None:
                continue
            if update.finish_reason is not None:
                del self.live[update.request_id]
            self._on_update(live, delivery_from(update, live))
