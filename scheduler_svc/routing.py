"""Routing: which worker of a model a new (or re-placed) request goes to.

Pure: plain data in, a decision out. No gRPC, no asyncio, no clock: the caller describes each
worker at one moment (`WorkerView`) and says how to probe a worker's cache for the request.

The rule, in two steps:

1. Candidates, best tier first. Workers of one model may differ in pool size (a CPU and a GPU
   worker): those whose ledger holds the whole request (prompt plus max_tokens, up to the
   context length), else those that hold its prompt. A worker that is not overdue comes
   before one that is, whatever its pool: an overdue worker may be hung, and a request sent
   there waits for the step deadline. With no worker able to hold the prompt, all are
   candidates and the chosen worker's ledger ignores it with its own reason.
2. Among the candidates, the highest placement score: the longest cached prefix, weighed
   against load (`CACHED_TOKENS_PER_QUEUED_REQUEST`). On a tie, the worker whose current plan
   has been out the shortest (a worker that hangs mid-step keeps its cached prefixes and,
   once its clients gave up, a load of 0); then the first in the caller's order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# A cached token is worth this many queued requests when choosing a worker.
CACHED_TOKENS_PER_QUEUED_REQUEST = 64
# A worker whose plan has been out longer than this share of --worker-step-timeout is overdue:
# it gets new requests only when no worker of its model that is not overdue can take them.
OVERDUE_SHARE_OF_STEP_TIMEOUT = 0.5


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as routing weighs it, at the moment of one choice."""

    worker_id: str
    max_len: int  # the longest request its ledger holds (context length, capped by its pool)
    max_model_len: int  # the model's context length
    load: int  # requests placed on it and not finished
    plan_out_s: float  # seconds its oldest unanswered plan has been out (0 when none)


@dataclass(frozen=True, slots=True)
class Demand:
    """What a request asks of a worker's ledger."""

    num_prompt_tokens: int
    max_tokens: int  # as asked, also when re-placed with some already generated

    @property
    def whole(self) -> int:
        return self.num_prompt_tokens + max(self.max_tokens, 0)


def holds(worker: WorkerView, num_tokens: int) -> bool:
    """The worker's ledger can hold `num_tokens` (anything past the context length is cut
    there by the ledger, so it need only hold up to that)."""
    return worker.max_len >= min(num_tokens, worker.max_model_len)


def is_overdue(worker: WorkerView, step_timeout: float) -> bool:
    """Its plan has been out past OVERDUE_SHARE_OF_STEP_TIMEOUT of the step deadline
    (`step_timeout` 0 means no deadline, and then no worker is overdue)."""
    return step_timeout > 0 and worker.plan_out_s > step_timeout * OVERDUE_SHARE_OF_STEP_TIMEOUT


def candidates(
    workers: Sequence[WorkerView], demand: Demand, step_timeout: float
) -> list[WorkerView]:
    """The workers worth choosing among (the module's rule 1), in the caller's order."""
    responsive = [w for w in workers if not is_overdue(w, step_timeout)]
    for group in (responsive, workers):
        for need in (demand.whole, demand.num_prompt_tokens):
            able = [w for w in group if holds(w, need)]
            if able:
                return able
    return list(workers)


def placement_score(cached_tokens: int, load: int) -> float:
    """Higher is better: cached prefix tokens, in queued requests' worth, minus the load."""
    return cached_tokens / CACHED_TOKENS_PER_QUEUED_REQUEST - load


def choose(
    workers: Sequence[WorkerView],
    demand: Demand,
    step_timeout: float,
    cached_tokens: Callable[[WorkerView], int],
) -> WorkerView:
    """The worker the request goes to. `workers` must not be empty; `cached_tokens` probes a
    worker's cache for this request, and is called once for each candidate only."""
    if not workers:
        raise ValueError("no worker to choose from")

    def key(worker: WorkerView) -> tuple[float, float]:
        return placement_score(cached_tokens(worker), worker.load), -worker.plan_out_s

    return max(candidates(workers, demand, step_timeout), key=key)
