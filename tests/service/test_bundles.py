"""--num-scheduler-steps: decode steps planned at once and sent to the worker in one message.

The scheduler service runs over real gRPC with real worker links; the model is the stand-in
of tests/service/helpers.py (a token that depends only on the position). The cancel and
lost-worker scenarios of test_links.py run with and without bundles (`stepped_scheduler`).
"""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc

from protos import frontend_pb2, frontend_pb2_grpc, worker_pb2
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.output import RequestUpdate, SchedulerOutput
from scheduler_svc.core.request import FinishReason, Request
from scheduler_svc.live import Delivery, LiveRequest, RequestFailure
from scheduler_svc.service import _ready_with
from scheduler_svc.wire import response_from
from scheduler_svc.worker_link import WorkerLink
from tests.service.helpers import (
    EOS,
    PositionRunner,
    Worker,
    expected_tokens,
    generate,
    ledger_idle,
    registration,
    running_scheduler,
    wait_for,
)
from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sample

STEPS = "4"


class CountingRunner(PositionRunner):
    """Counts the steps the worker runs; optionally samples EOS for `rid` at position `at`."""

    def __init__(self, eos_for: str = "", at: int = -1) -> None:
        self.steps = 0
        self.eos_for, self.at = eos_for, at

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        self.steps += 1
        out = super().execute(chunks)
        for i, c in enumerate(chunks):
            if c.request_id == self.eos_for and c.end_pos == self.at and c.sample:
                out[i] = Sample(EOS)
        return out


def test_a_bundle_streams_every_token_in_groups_and_frees_everything():
    with running_scheduler("--num-scheduler-steps", STEPS) as scheduler:
        runner = CountingRunner()
        worker = Worker(scheduler.target, "w0", runner=runner)
        try:
            wait_for(lambda: scheduler.engine.links)
            responses = list(generate(scheduler.target, "r1", list(range(1, 11)), 21))
            assert [t for r in responses for t in r.token_ids] == expected_tokens(10, 21)
            assert max(len(r.token_ids) for r in responses) > 1, "no step was bundled"
            assert len(responses) < 21
            wait_for(lambda: ledger_idle(scheduler))
            assert runner.steps == 21, "one step per token: none planned twice or lost"
            link = next(iter(scheduler.engine.links.values()))
            sent, applied = scheduler.call(lambda: (link.messages, link.steps))
            assert sent < applied / 2, (sent, applied)
        finally:
            worker.stop()


def test_requests_of_different_lengths_end_inside_bundles():
    """Requests end at max_tokens at different steps of a bundle, and an EOS ends one in the
    middle of a bundle: the steps planned past it are discarded, nothing leaks."""
    with running_scheduler("--num-scheduler-steps", STEPS) as scheduler:
        runner = CountingRunner(eos_for="eos", at=16)  # its 7th output token is EOS
        worker = Worker(scheduler.target, "w0", runner=runner)
        try:
            wait_for(lambda: scheduler.engine.links)
            got: dict[str, list[int]] = {}

            def run(rid: str, n: int, ignore_eos: bool = True) -> None:
                stub = frontend_pb2_grpc.SchedulerStub(grpc.insecure_channel(scheduler.target))
                request = frontend_pb2.GenerateRequest(
                    request_id=rid,
                    model="m",
                    prompt_token_ids=list(range(1, 11)),
                    stop=frontend_pb2.StopCriteria(max_tokens=n, ignore_eos=ignore_eos),
                )
                got[rid] = [t for r in stub.Generate(request) for t in r.token_ids]

            threads = [threading.Thread(target=run, args=(f"r{n}", n)) for n in (3, 5, 9, 13)]
            threads.append(threading.Thread(target=run, args=("eos", 30, False)))
            for t in threads:
                t.start()
            for t in threads:
                t.join(20)
            for n in (3, 5, 9, 13):
                assert got[f"r{n}"] == expected_tokens(10, n)
            assert got["eos"] == expected_tokens(10, 6) + [EOS]
            wait_for(lambda: ledger_idle(scheduler))
        finally:
            worker.stop()


def test_a_request_arriving_during_bundles_is_served():
    with running_scheduler("--num-scheduler-steps", "8") as scheduler:
        worker = Worker(scheduler.target, "w0")
        try:
            wait_for(lambda: scheduler.engine.links)
            long = generate(scheduler.target, "long", list(range(1, 11)), 60)
            first = list(next(long).token_ids)
            late_stream = generate(scheduler.target, "late", [5, 6, 7], 4)
            late = [t for r in late_stream for t in r.token_ids]
            assert late == expected_tokens(3, 4)
            rest = [t for r in long for t in r.token_ids]
            assert first + rest == expected_tokens(10, 60)
            wait_for(lambda: ledger_idle(scheduler))
        finally:
            worker.stop()


def test_a_bundle_answered_short_fails_its_request_and_leaks_nothing(caplog):
    """A worker that answers a bundle of 4 with one result (a bug, or a worker that does not
    know bundles): the unanswered steps get empty results, so the request ends with an error
    instead of waiting forever, and its blocks and tracker entry go."""
    link, ends = bare_link(4)
    add(link, "a", 20)
    prefill = link._plan()
    assert prefill is not None and not prefill.then
    link.apply_result(worker_pb2.StepResult(sampled=[worker_pb2.SampledToken(request_id="a")]))
    bundle = link._plan()
    assert bundle is not None and len(bundle.then) == 3
    with caplog.at_level(logging.WARNING):
        link.apply_result(worker_pb2.StepResult(sampled=[worker_pb2.SampledToken(request_id="a")]))
    assert "answered 4 plans with 1 results" in caplog.text
    assert ends[-1].finish_reason == "error" and "no token" in ends[-1].message
    link._plan()  # tells the worker to drop it
    snap = link.scheduler.snapshot()
    assert snap.blocks_in_use == 0 and snap.tracker_entries == 0 and not link.live


# ---- the link alone: a real ledger, plain messages, no gRPC ------------------------------


def bare_link(
    steps: int, num_blocks: int = 16, worker_steps: int = 64
) -> tuple[WorkerLink, list[frontend_pb2.GenerateResponse]]:
    config = SchedulerConfig(
        num_blocks=num_blocks, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
        max_model_len=64, debug_invariants=True,
    )  # fmt: skip
    sent: list[frontend_pb2.GenerateResponse] = []
    link = WorkerLink(
        registration(max_steps_per_plan=worker_steps),
        config,
        lambda _live, delivery: sent.append(response_from(delivery)),
        num_scheduler_steps=steps,
    )
    return link, sent


def add(link: WorkerLink, rid: str, max_tokens: int, prompt_len: int = 3) -> None:
    core = Request(
        request_id=rid, prompt_token_ids=list(range(1, prompt_len + 1)), max_tokens=max_tokens
    )
    link.add(LiveRequest(core=core, model="m", sampling=frontend_pb2.SamplingParams(logprobs=-1)))


def answer(link: WorkerLink, plan: worker_pb2.Plan) -> None:
    """What a worker answers to `plan` (and its `then`): a token for every scheduled request."""
    results = []
    for p in [plan, *plan.then]:
        ids = [r.request_id for r in p.new_requests] + [c.request_id for c in p.continuing]
        results.append(
            worker_pb2.StepResult(
                sampled=[worker_pb2.SampledToken(request_id=r, token_id=5) for r in ids]
            )
        )
    first, *rest = results
    first.then.extend(rest)
    link.apply_result(first)


def test_a_worker_that_predates_bundles_gets_one_plan_a_message():
    link, _ = bare_link(4, worker_steps=0)  # its registration says nothing of bundles
    add(link, "a", 20)
    answer(link, link._plan())
    assert link.max_bundle_steps == 1 and not link._plan().then


def test_a_prefill_ends_a_bundle_and_a_newcomer_is_planned_alone():
    link, _ = bare_link(8)
    add(link, "a", 40)
    first = link._plan()
    assert first.new_requests and not first.then  # a prefill: its first token is not held back
    answer(link, first)
    bundle = link._plan()
    assert len(bundle.then) == 7  # decodes alone, nobody waiting: a full bundle
    add(link, "b", 5)  # arrives while the bundle runs
    answer(link, bundle)
    nxt = link._plan()
    assert [r.request_id for r in nxt.new_requests] == ["b"] and not nxt.then


def test_a_step_planned_ahead_never_preempts():
    """Three requests in 8 blocks of 4 tokens cannot all finish at once: preemptions come. A
    bundle's first step may preempt, as any plan may; a step planned behind it never does
    (its victim's tokens sampled in the steps before would be thrown away): the bundle stops
    where the next step might not find a block for every running request."""
    link, _ = bare_link(8, num_blocks=8)
    for rid in ("a", "b", "c"):
        add(link, rid, 30)
    schedule, counts = link.scheduler.schedule, []

    def counting() -> SchedulerOutput:
        before = link.scheduler.stats.preemptions
        out = schedule()
        counts.append(link.scheduler.stats.preemptions - before)
        return out

    link.scheduler.schedule = counting
    bundled = 0
    while True:
        start = len(counts)
        plan = link._plan()
        if plan is None:
            break
        assert not any(counts[start + 1 :]), counts[start:]  # what the steps behind did
        bundled += len(plan.then)
        answer(link, plan)
    assert link.scheduler.stats.preemptions > 0 and bundled > 0
    assert not link.live and link.scheduler.snapshot().blocks_in_use == 0


def test_merged_updates_keep_every_token_and_logprob_in_order_and_end_at_a_finish():
    queue: asyncio.Queue = asyncio.Queue()
    held: list = []

    def update(tokens: list[int], finish: FinishReason | None = None) -> Delivery:
        logprobs = [frontend_pb2.TokenLogprob(token_id=t, logprob=-t / 10) for t in tokens]
        return Delivery(RequestUpdate("r", tokens, finish_reason=finish), logprobs)

    for item in (update([2]), update([3], FinishReason.LENGTH), update([4])):
        queue.put_nowait(item)
    batch = _ready_with(update([1]), queue, held)
    response = response_from(*batch)
    assert list(response.token_ids) == [1, 2, 3] and response.finish_reason == "length"
    assert [lp.token_id for lp in response.logprobs] == [1, 2, 3]
    assert queue.qsize() == 1 and not held  # what came after the finish stays queued


def test_an_error_or_a_failure_queued_behind_tokens_is_sent_alone_after_them():
    queue: asyncio.Queue = asyncio.Queue()
    held: list = []
    queue.put_nowait(Delivery(RequestUpdate("r", [2])))
    queue.put_nowait(Delivery(RequestUpdate("r", [], finish_reason=FinishReason.ERROR)))
    batch = _ready_with(Delivery(RequestUpdate("r", [1])), queue, held)
    assert [t for d in batch for t in d.update.new_token_ids] == [1, 2]
    assert len(held) == 1 and held[0].update.finish_reason is FinishReason.ERROR
    failure = RequestFailure(grpc.StatusCode.UNAVAILABLE, "gone")
    queue.put_nowait(failure)
    held.clear()
    assert len(_ready_with(Delivery(RequestUpdate("r", [3])), queue, held)) == 1
    assert held == [failure]
