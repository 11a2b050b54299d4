"""What each scheduling policy means to the scheduler: its waiting queue and its running order.

Running requests are kept in the policy's order: the step serves them from the front and
preempts from the back. FCFS orders by arrival, priority by (priority, arrival), fair
interleaves tenants (core/fair.py). The order is a function of the running set, recomputed
whenever that set changes, because fair's depends on who else runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from scheduler_svc.core.fair import FairQueue, fair_order
from scheduler_svc.core.request import Request
from scheduler_svc.core.waiting_queue import (
    FCFSQueue,
    PriorityQueue,
    WaitingQueue,
    fcfs_key,
    priority_key,
)

RunningOrder = Callable[[Iterable[Request]], list[Request]]


def _by_arrival(requests: Iterable[Request]) -> list[Request]:
    return sorted(requests, key=fcfs_key)


def _by_priority(requests: Iterable[Request]) -> list[Request]:
    return sorted(requests, key=priority_key)


def running_order(policy: str) -> RunningOrder:
    """Running requests in the order they are kept: served from the front, preempted from the
    back."""
    return {"priority": _by_priority, "fair": fair_order}.get(policy, _by_arrival)


def make_waiting_queue(policy: str, load: Mapping[str, int]) -> WaitingQueue:
    """`load`: running requests per tenant, kept by the scheduler (only fair reads it)."""
    if policy == "priority":
        return PriorityQueue()
    if policy == "fair":
        return FairQueue(load)
    return FCFSQueue()
