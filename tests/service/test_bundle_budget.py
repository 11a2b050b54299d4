"""A bundle's time budget (`bundle_budget_s`, scheduler_svc/worker_link.py): one stream of a
slow model goes a step a message, many streams of it go in bundles.

The scheduler service runs over real gRPC with a real worker link; the model is the stand-in
of tests/service/helpers.py, slowed to a large model's step.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from scheduler_svc.worker_link import BUNDLE_BUDGET_S, bundle_budget_s
from tests.service.helpers import (
    PositionRunner,
    Worker,
    expected_tokens,
    generate,
    ledger_idle,
    running_scheduler,
    wait_for,
)
from worker import executor
from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sample

STEPS = "4"
STEP_S = 0.03


class SlowRunner(PositionRunner):
    """A model whose step takes 30 ms (a large model's decode step). The executor times each
    step on `clock`, which advances by exactly that: a loaded machine's late wake-ups change
    when tokens arrive, never the step time the link measures and bundles by."""

    def __init__(self) -> None:
        self.clock = 0.0

    def perf_counter(self) -> float:
        return self.clock

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        time.sleep(STEP_S)
        self.clock += STEP_S
        return super().execute(chunks)


@pytest.fixture
def slow_runner(monkeypatch) -> SlowRunner:  # noqa: ANN001
    runner = SlowRunner()
    monkeypatch.setattr(executor, "time", SimpleNamespace(perf_counter=runner.perf_counter))
    return runner


def test_a_slow_model_is_not_bundled(slow_runner):
    """Two 30 ms steps would pass one stream's 50 ms budget (BUNDLE_BUDGET_S): once the link
    has timed a decode step, each plan goes alone, so the stream is not held back in chunks."""
    with running_scheduler("--num-scheduler-steps", STEPS) as scheduler:
        worker = Worker(scheduler.target, "w0", runner=slow_runner)
        try:
            wait_for(lambda: scheduler.engine.links)
            responses = list(generate(scheduler.target, "r1", list(range(1, 11)), 16))
            assert [t for r in responses for t in r.token_ids] == expected_tokens(10, 16)
            wait_for(lambda: ledger_idle(scheduler))
            # the first two bundles (one planned ahead of the other) go out before any decode
            # step is timed; every token after them streams alone
            assert [len(r.token_ids) for r in responses[-6:]] == [1] * 6, responses
            link = next(iter(scheduler.engine.links.values()))
            assert scheduler.call(lambda: link.step_s) == pytest.approx(STEP_S)
        finally:
            worker.stop()


def test_many_streams_of_a_slow_model_are_bundled(slow_runner):
    """Sixteen requests share each 30 ms step: the budget grows by STREAM_BUDGET_S a stream
    (128 ms), so their steps go in bundles (each stream's per-message costs amortized) where
    one stream's would go alone (the test above); every token arrives, in order."""
    n = 16
    assert bundle_budget_s(1) == BUNDLE_BUDGET_S < 2 * STEP_S < 3 * STEP_S < bundle_budget_s(n)
    with running_scheduler("--num-scheduler-steps", STEPS) as scheduler:
        # room for every request's blocks and one free block each (a bundle never preempts)
        worker = Worker(scheduler.target, "w0", runner=slow_runner, num_blocks=256)
        try:
            wait_for(lambda: scheduler.engine.links)
            got: dict[str, list[list[int]]] = {}

            def run(rid: str) -> None:
                got[rid] = [
                    list(r.token_ids)
                    for r in generate(scheduler.target, rid, list(range(1, 11)), 24)
                ]

            threads = [threading.Thread(target=run, args=(f"r{i}",)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert len(got) == n
            for chunks in got.values():
                assert [t for c in chunks for t in c] == expected_tokens(10, 24)
                assert max(len(c) for c in chunks[-4:]) > 1, chunks
            wait_for(lambda: ledger_idle(scheduler))
            link = next(iter(scheduler.engine.links.values()))
            sent, applied = scheduler.call(lambda: (link.messages, link.steps))
            assert sent < applied * 2 / 3, (sent, applied)
        finally:
            worker.stop()
