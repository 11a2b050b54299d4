"""--num-scheduler-steps: decode steps planned at once and sent to the worker in one message.

The scheduler service runs over real gRPC with real worker links; the model is the stand-in
of tests/service/helpers.py (a token that depends only on the position).
"""

from __future__ import annotations

import logging
import threading
import time

import grpc

from protos import frontend_pb2, frontend_pb2_grpc, worker_pb2
from scheduler_svc.convert import response_from
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.request import Request
from scheduler_svc.link import WorkerLink
from scheduler_svc.live import LiveRequest
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
from worker.batch import SeqChunk
from worker.sampler import Sample

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


def test_a_cancel_while_a_bundle_is_out_frees_everything():
    with running_scheduler("--num-scheduler-steps", STEPS) as scheduler:
        worker = Worker(scheduler.target, "w0")
        try:
            wait_for(lambda: scheduler.engine.links)
            stream = generate(scheduler.target, "r1", list(range(1, 30)), 200)
            next(stream)
            next(stream)
            stream.cancel()
            wait_for(lambda: ledger_idle(scheduler))
        finally:
            worker.stop()


def test_a_request_arriving_during_bundles_is_served_and_its_prefill_not_bundled():
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


def test_a_lost_worker_mid_bundle_continues_on_another():
    with running_scheduler("--num-scheduler-steps", STEPS) as scheduler:
        first = Worker(scheduler.target, "w0")
        wait_for(lambda: len(scheduler.engine.links) == 1)
        stream = generate(scheduler.target, "r1", list(range(1, 20)), 40)
        got = list(next(stream).token_ids)
        second = Worker(scheduler.target, "w1")
        try:
            wait_for(lambda: len(scheduler.engine.links) == 2)
            first.stop()
            for response in stream:
                got += response.token_ids
            assert got == expected_tokens(19, 40)
            wait_for(lambda: ledger_idle(scheduler))
        finally:
            second.stop()


class SlowRunner(PositionRunner):
    """A model whose step takes 30 ms (a large model's decode step)."""

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        time.sleep(0.03)
        return super().execute(chunks)


def test_a_slow_model_is_not_bundled():
    """Two 30 ms steps would pass the 50 ms budget (BUNDLE_BUDGET_S): once the link has timed
    a decode step, each plan goes alone, so the stream is not held back in chunks."""
    with running_scheduler("--num-scheduler-steps", STEPS) as scheduler:
        worker = Worker(scheduler.target, "w0", runner=SlowRunner())
        try:
            wait_for(lambda: scheduler.engine.links)
            responses = list(generate(scheduler.target, "r1", list(range(1, 11)), 16))
            assert [t for r in responses for t in r.token_ids] == expected_tokens(10, 16)
            wait_for(lambda: ledger_idle(scheduler))
            # the first two bundles (one planned ahead of the other) go out before any decode
            # step is timed; every token after them streams alone
            assert [len(r.token_ids) for r in responses[-6:]] == [1] * 6, responses
            link = next(iter(scheduler.engine.links.values()))
            assert 0.025 < scheduler.call(lambda: link.step_s) < 0.1
        finally:
            worker.stop()


def test_a_bundle_answered_short_fails_its_request_and_leaks_nothing(caplog):
    """A worker that answers a bundle of 4 with one result (a bug, or a worker that does not
    know bundles): the unanswered steps get empty results, so the request ends with an error
    instead of waiting forever, and its blocks and tracker entry go."""
    config = SchedulerConfig(
        num_blocks=16, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
        max_model_len=64, debug_invariants=True,
    )  # fmt: skip
    ends: list[frontend_pb2.GenerateResponse] = []
    link = WorkerLink(
        registration(),
        config,
        lambda _live, delivery: ends.append(response_from(delivery)),
        steps_per_plan=4,
    )
    core = Request(request_id="a", prompt_token_ids=[1, 2, 3], max_tokens=20)
    link.add(LiveRequest(core=core, model="m", sampling=frontend_pb2.SamplingParams(logprobs=-1)))
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
