"""A worker that hangs mid-step: its process and its stream stay up, but a plan never gets its
result. `--worker-step-timeout` turns it into a lost worker; routing stops favouring it."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from protos import frontend_pb2, frontend_pb2_grpc, worker_pb2
from tests.service.helpers import (
    GatedRunner,
    PositionRunner,
    Worker,
    expected_tokens,
    ledger_idle,
    running_scheduler,
    wait_for,
)
from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sample


class HangingRunner(PositionRunner):
    """Never returns from a step until released: a wedged kernel, a deadlock in the model."""

    def __init__(self) -> None:
        self.reached, self.release = threading.Event(), threading.Event()

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        self.reached.set()
        self.release.wait(30)
        return super().execute(chunks)


def generate(target: str, rid: str, prompt: list[int], max_tokens: int, timeout: float):
    stub = frontend_pb2_grpc.SchedulerStub(grpc.insecure_channel(target))
    req = frontend_pb2.GenerateRequest(
        request_id=rid,
        model="m",
        prompt_token_ids=prompt,
        stop=frontend_pb2.StopCriteria(max_tokens=max_tokens, ignore_eos=True),
    )
    return stub.Generate(req, timeout=timeout)


def tokens(stream) -> list[int]:  # noqa: ANN001
    return [t for r in stream for t in r.token_ids]


class HungAndGood:
    """Worker "hung" registers first (it wins the first tie), then "good"."""

    def __init__(self, scheduler) -> None:  # noqa: ANN001
        self.runner = HangingRunner()
        self.hung = Worker(scheduler.target, "hung", runner=self.runner)
        wait_for(lambda: len(scheduler.engine.links) == 1)
        self.good = Worker(scheduler.target, "good")
        wait_for(lambda: len(scheduler.engine.links) == 2)

    def stop(self) -> None:
        self.runner.release.set()
        self.hung.stop()
        self.good.stop()


def test_a_worker_that_hangs_mid_step_is_dropped_and_its_requests_move():
    with running_scheduler("--worker-step-timeout", "0.5") as scheduler:
        engine = scheduler.engine
        pair = HungAndGood(scheduler)
        try:
            stream = generate(scheduler.target, "r0", list(range(1, 11)), 5, timeout=8)
            assert pair.runner.reached.wait(5), "the first request goes to the hung worker"
            old = engine.links["hung"]
            steps_before = old.steps
            assert tokens(stream) == expected_tokens(10, 5), "recomputed on the good worker"

            assert scheduler.call(lambda: "hung" not in engine.links)
            timeouts = engine.registry.get_sample_value(
                "kvledger_worker_step_timeouts_total", {"model": "m", "worker": "hung"}
            )
            assert timeouts == 1
            lost = {r.worker: r.snapshot.entries_released["worker_lost"] for r in engine.readings()}
            assert lost["hung"] == 1

            # The step returns at last: its result goes to a call that is over, and the
            # worker registers again with an empty cache. The old link never applies it.
            pair.runner.release.set()
            wait_for(lambda: "hung" in engine.links and engine.links["hung"] is not old)
            scheduler.call(old.apply_result, worker_pb2.StepResult(step_id=1))
            assert old.steps == steps_before, "a result reached a dropped link"
            wait_for(lambda: ledger_idle(scheduler))
        finally:
            pair.stop()


def test_an_idle_worker_is_never_timed_out():
    # a deadline an instant step meets even on a loaded machine, and an idle wait past it
    with running_scheduler("--worker-step-timeout", "2") as scheduler:
        worker = Worker(scheduler.target, "w0")
        try:
            wait_for(lambda: scheduler.engine.links)
            first = scheduler.engine.links["w0"]
            assert tokens(generate(scheduler.target, "r0", [1, 2, 3], 2, timeout=30)) == (
                expected_tokens(3, 2)
            )
            time.sleep(3)  # waiting for work is not a hung step
            assert scheduler.call(lambda: scheduler.engine.links.get("w0")) is first
        finally:
            worker.stop()


@pytest.mark.parametrize("timeout", ["0", "60"])
def test_on_a_tie_routing_avoids_the_worker_whose_plan_is_out_longest(timeout):
    # 0 disables the deadline: only the tie-break can keep the second request off "hung".
    with running_scheduler("--worker-step-timeout", timeout) as scheduler:
        engine = scheduler.engine
        pair = HungAndGood(scheduler)
        try:
            first = generate(scheduler.target, "r0", list(range(1, 11)), 5, timeout=30)
            assert pair.runner.reached.wait(5)
            first.cancel()  # the client gives up: "hung" is back to a load of 0
            wait_for(lambda: not engine.requests)
            time.sleep(0.05)
            other = list(range(50, 60))  # nothing cached anywhere: the scores tie
            assert tokens(generate(scheduler.target, "r1", other, 3, timeout=3)) == (
                expected_tokens(10, 3)
            )
        finally:
            pair.stop()


def test_an_overdue_worker_loses_its_cache_affinity():
    # Overdue after half the 10 s deadline; the prompt's blocks are cached on "hung" only.
    with running_scheduler("--worker-step-timeout", "10") as scheduler:
        engine = scheduler.engine
        pair = HungAndGood(scheduler)
        try:
            prompt = list(range(1, 11))
            first = generate(scheduler.target, "r0", prompt, 5, timeout=30)
            assert pair.runner.reached.wait(5)
            first.cancel()
            wait_for(lambda: not engine.requests)
            hung = engine.links["hung"]
            assert scheduler.call(hung.scheduler.cached_prefix_tokens, prompt, None) > 0
            wait_for(lambda: hung.plan_outstanding_for() > 5.1)
            # Long before the deadline drops "hung", the retry is served by "good".
            assert tokens(generate(scheduler.target, "r1", prompt, 3, timeout=4)) == (
                expected_tokens(10, 3)
            )
            assert scheduler.call(lambda: engine.links.get("hung")) is hung
        finally:
            pair.stop()


def test_an_overdue_worker_is_avoided_even_when_only_its_pool_holds_the_whole_request():
    with running_scheduler("--worker-step-timeout", "10") as scheduler:
        engine = scheduler.engine
        runner = HangingRunner()
        hung = Worker(scheduler.target, "hung", num_blocks=256, runner=runner)
        wait_for(lambda: len(engine.links) == 1)
        gate = GatedRunner("r1", 45)  # holds r1 on "small" until its placement is read
        small = Worker(scheduler.target, "small", num_blocks=32, runner=gate)  # 128 tokens of 4
        wait_for(lambda: len(engine.links) == 2)
        try:
            first = generate(scheduler.target, "r0", list(range(1, 11)), 5, timeout=30)
            assert runner.reached.wait(5)
            first.cancel()
            wait_for(lambda: not engine.requests)
            wait_for(lambda: engine.links["hung"].plan_outstanding_for() > 5.1)
            # the prompt fits "small"; prompt + max_tokens only fits the overdue "hung"
            stream = generate(scheduler.target, "r1", list(range(200, 240)), 100, timeout=4)
            assert gate.reached.wait(4)
            assert scheduler.call(lambda: engine.link_of("r1").worker_id) == "small"
            gate.release.set()
            assert len(tokens(stream)) == 128 - 40  # served at once, up to the small pool
        finally:
            gate.release.set()
            runner.release.set()
            hung.stop()
            small.stop()
