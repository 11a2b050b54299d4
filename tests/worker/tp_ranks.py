"""The body of each rank process in the tensor-parallel tests (spawned: importable by name).

Rank 0 drives an `GroupExecutor` with plans, as the worker's link does; the other ranks
`follow`. Every rank reports each step's outcome, so a test can check that the ranks agree
(the design's claim: same plans, same state, same tokens) as well as what rank 0 returns.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from worker.executor import Executor
from worker.link.step import ContinueSeq, EmbedParams, NewSeq, StepOutput, StepPlan
from worker.parallel import distributed, tp_group
from worker.parallel.distributed import GroupLost, join_group
from worker.parallel.tp_group import GroupExecutor, Message, follow
from worker.runner.config import RunnerConfig
from worker.runner.model_runner import ModelRunner
from worker.sample.sampling_params import GREEDY, SamplingParams

BLOCK_SIZE = 8


@dataclass(frozen=True)
class Job:
    name: str
    path: Path
    plans: list[StepPlan]
    follower_dies_after: int | None = None  # steps; then ranks > 0 exit abruptly
    idle_seconds: float = 0.0  # rank 0 waits this long after the first plan (heartbeat test)


def greedy_plans(prompt: list[int], steps: int) -> list[StepPlan]:
    """A prefill, then one decode step at a time, as the scheduler plans them."""
    blocks = list(range(-(-(len(prompt) + steps) // BLOCK_SIZE)))
    plans = [
        StepPlan(1, new=[NewSeq("g", prompt, blocks, 0, len(prompt), len(prompt), GREEDY, [], [])])
    ]
    for i in range(1, steps):
        plans.append(StepPlan(i + 1, cont=[ContinueSeq("g", [], len(prompt) + i - 1, 1, [])]))
    return plans


def provenance_plans(prompt: list[int]) -> list[StepPlan]:
    """Request a writes blocks 0 and 1; b claims block 1 with another hash (refused on every
    rank, no forward pass for it); c claims block 0 with the right hash and reads it."""
    h0, h1 = b"h0" * 16, b"h1" * 16
    a = NewSeq("a", prompt[:16], [0, 1, 2], 0, 16, 16, GREEDY, [], [(0, h0), (1, h1)])
    b = NewSeq("b", prompt[:17], [0, 1, 3], 16, 1, 17, GREEDY, [(0, h0), (1, b"x" * 32)], [])
    c = NewSeq("c", prompt[:9], [0, 4], 8, 1, 9, GREEDY, [(0, h0)], [])
    return [StepPlan(1, new=[a]), StepPlan(2, new=[b], dropped=["a"]), StepPlan(3, new=[c])]


def sampling_plans(prompt: list[int], steps: int) -> list[StepPlan]:
    """Three requests in one batch: seeded top-k with logprobs and prompt logprobs, unseeded
    top-p, and a prompt prefilled in two chunks, then decoded together."""
    seeded = SamplingParams(temperature=0.8, top_k=20, seed=7, logprobs=2, prompt_logprobs=1)
    free = SamplingParams(temperature=1.0, top_p=0.9, presence_penalty=0.5)
    n = len(prompt)
    first = [
        NewSeq("s1", prompt, [0, 1, 2], 0, n, n, seeded, [], []),
        NewSeq("s2", prompt[::-1], [3, 4, 5], 0, n, n, free, [], []),
        NewSeq("s3", prompt[1:] + prompt[:1], [6, 7, 8], 0, 6, n, GREEDY, [], []),
    ]
    embed = NewSeq("e", prompt, [9, 10], 0, n, n, GREEDY, [], [], EmbedParams(True, 0))
    plans = [StepPlan(1, new=[*first, embed])]  # a decoder's embedding pass in the same step
    for k in range(2, steps + 2):
        s3_done = n if k > 2 else 6
        plans.append(
            StepPlan(
                k,
                cont=[
                    ContinueSeq("s1", [], n + k - 2, 1, []),
                    ContinueSeq("s2", [], n + k - 2, 1, []),
                    ContinueSeq("s3", [], s3_done + max(0, k - 3), n - 6 if k == 2 else 1, []),
                ],
            )
        )
    return plans


def summary(out: StepOutput) -> dict[str, Any]:
    return {
        # logprobs and embeddings too: the ranks hold the same bits
        "full": (out.sampled, out.prompt_logprobs, out.embeddings),
        "sampled": [(rid, s.token_id, s.error) for rid, s in out.sampled],
        "errors": list(out.errors),
        "stale": list(out.stale_request_ids),
        "removed": sorted(out.removed_block_ids),
        "stored": sorted(out.stored),
    }


class Recording(Executor):
    """A following rank's executor that keeps what each step produced (and, for the fault
    test, dies abruptly after `dies_after` steps)."""

    def __init__(self, runner: ModelRunner, dies_after: int | None) -> None:
        super().__init__(runner)
        self.outputs: list[dict[str, Any]] = []
        self.dies_after = dies_after

    def step(self, plan: StepPlan) -> StepOutput:
        out = super().step(plan)
        self.outputs.append(summary(out))
        if self.dies_after is not None and len(self.outputs) >= self.dies_after:
            os._exit(3)
        return out


def lead(ex: GroupExecutor, job: Job) -> list[dict[str, Any]] | str:
    """Rank 0's side; a broken group is reported with how long it took to notice."""
    outputs = []
    started = time.monotonic()
    try:
        for i, plan in enumerate(job.plans):
            if i == 1 and job.idle_seconds:
                threading.Thread(target=ex.heartbeat, daemon=True).start()
                time.sleep(job.idle_seconds)
            outputs.append(summary(ex.step(plan)))
        ex.send(Message("stop"))
    except GroupLost:
        return f"lost after {time.monotonic() - started:.1f}s"
    return outputs


def run_rank(
    rank: int, size: int, port: int, jobs: list[Job], results: multiprocessing.Queue
) -> None:
    try:
        if any(job.idle_seconds for job in jobs):  # timeouts short enough for a test
            distributed.COLLECTIVE_TIMEOUT = timedelta(seconds=5)
            tp_group.HEARTBEAT_SECONDS = 0.5
        tp = join_group(rank, size, port, "cpu")
        for job in jobs:
            config = RunnerConfig(job.path, block_size=BLOCK_SIZE, num_blocks=16, progress=False)
            runner = ModelRunner(config, tp)
            if rank == 0:
                outputs: Any = lead(GroupExecutor(runner, tp), job)
            else:
                rec = Recording(runner, job.follower_dies_after)
                follow(rec, tp)
                outputs = rec.outputs
            params = sum(p.numel() for p in runner.model.parameters())
            results.put((rank, job.name, outputs, (runner.num_blocks, params)))
    except BaseException:  # noqa: BLE001 - the test reads the traceback
        results.put((rank, "error", traceback.format_exc(), 0))
