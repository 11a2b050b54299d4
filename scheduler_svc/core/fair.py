"""The fair policy: tenants take turns on a worker, the one holding least of it first.

The rule. Every tenant (the frontend's tag of an API key; '' on an open server, which is thus
one tenant) has a first-come-first-served queue of its own.

- Admission: the next request admitted is the head of the tenant with the fewest running
  requests on this worker; between tenants holding equally many, the one admitted least
  recently (round robin; a tenant that just came has waited longest), then the earliest head.
  Each admission counts against its tenant, so while tenant B holds fewer running requests
  than tenant A, B's head goes before A's: B's request waits for at most one admission of
  each other tenant (one round), never for A's whole burst.
- Running order: running requests are interleaved by tenant, every tenant's earliest running
  request first, then every tenant's second, and so on (ties in arrival order). A step hands
  its token budget out from the front, so prefill chunks go round robin across tenants too;
  preemption takes from the back, which is always the latest request of a tenant holding the
  most, never the only request of a tenant holding one.
- Seats: a burst can take every seat (`max_num_seqs`) or block before anyone else arrives,
  and a request frees its room only after its last token. So when a pass stopped at a head
  for want of a seat or a block (`max_num_seqs`, `no_blocks`) and nothing was freed since, the
  next step starts by preempting the back of the running order, provided its tenant holds at
  least SEAT_MARGIN (2) more running requests than the head's: taking one never makes it the
  poorer of the two, so seats do not ping-pong. That preemption is made for the head, so
  unlike one made for a running request's growth it leaves admission open in its step. One
  per step; nothing is admitted past a waiting head, so the loaded tenant's count only falls
  until the head gets in. The victim recomputes like any preempted request (its blocks, freed
  last-first, stay cached until reused).

Why this measure. First come, first served let one tenant's burst (4 prompts x n=16 x 100
tokens) hold another tenant's 4-token request over a hundred times as long as this rule does
(docs/performance.md, "Scheduler"). Counting running requests rather than tokens served so far
keeps the rule almost stateless: it depends on who holds the worker now (plus the round-robin
order among tenants that are waiting), so an idle tenant banks no credit to burst with later, a
drained ledger starts even, and nothing grows with the number of tenants ever seen. And one
running request is one decode position per step, the unit every tenant competes for. Within a
tenant nothing changes: its requests keep their arrival order, and with a single tenant this
policy is FCFS.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from scheduler_svc.core.request import Request
from scheduler_svc.core.waiting_queue import WaitingQueue

# A tenant must hold this many more running requests than a waiting head's tenant for the head
# to take a seat from it: one more would only swap which of the two is short.
SEAT_MARGIN = 2


def fair_order(requests: Iterable[Request]) -> list[Request]:
    """Running requests in fair order: rank within their tenant (by arrival), then arrival."""
    ranks: dict[str, int] = {}
    keyed: list[tuple[int, int, Request]] = []
    for request in sorted(requests, key=lambda r: r.arrival_index):
        rank = ranks.get(request.tenant, 0)
        ranks[request.tenant] = rank + 1
        keyed.append((rank, request.arrival_index, request))
    keyed.sort(key=lambda item: item[:2])  # arrival indices are unique: no tie reaches item[2]
    return [item[2] for item in keyed]


@dataclass(frozen=True, slots=True)
class Stall:
    """A pass stopped at this head for want of a seat or a block, with the room there was."""

    request_id: str
    num_running: int
    num_free_blocks: int

    def persists(self, head: Request, num_running: int, num_free_blocks: int) -> bool:
        """The same head, and nothing freed since (no request left running, no block came
        back): preempting for it is not wasted on room that a request's end just made."""
        return (
            head.request_id == self.request_id
            and num_running >= self.num_running
            and num_free_blocks <= self.num_free_blocks
        )


def seat_for(head: Request, running: Sequence[Request], load: Mapping[str, int]) -> Request | None:
    """The running request a stalled head may take a seat from (the back of the fair order),
    or None when no tenant holds SEAT_MARGIN more than the head's."""
    if not running:
        return None
    victim = running[-1]
    if load.get(victim.tenant, 0) >= load.get(head.tenant, 0) + SEAT_MARGIN:
        return victim
    return None


class FairQueue(WaitingQueue):
    """Per-tenant FCFS queues; the next head is the least loaded tenant's, round robin
    between equals.

    `load` is the scheduler's live count of running requests per tenant: read, never written.
    """

    def __init__(self, load: Mapping[str, int]) -> None:
        self._load = load
        self._queues: dict[str, deque[Request]] = {}
        # When each waiting tenant last had a request admitted (a tenant with nothing waiting
        # is forgotten, so a newcomer ranks as served longest ago).
        self._served_at: dict[str, int] = {}
        self._clock = 0
        self._len = 0

    def push(self, request: Request) -> None:
        self._queues.setdefault(request.tenant, deque()).append(request)
        self._len += 1

    def push_front(self, request: Request) -> None:
        """A preempted request: ahead of its own tenant's later arrivals, not of other tenants."""
        self._queues.setdefault(request.tenant, deque()).appendleft(request)
        self._len += 1

    def peek(self) -> Request:
        return self._queues[self._next_tenant()][0]

    def pop(self) -> Request:
        tenant = self._next_tenant()
        request = self._queues[tenant].popleft()
        self._clock += 1
        self._served_at[tenant] = self._clock
        self._dropped_one(tenant)
        return request

    def remove(self, request: Request) -> None:
        self._queues[request.tenant].remove(request)
        self._dropped_one(request.tenant)

    def __len__(self) -> int:
        return self._len

    def per_tenant(self) -> dict[str, int]:
        return {tenant: len(queue) for tenant, queue in self._queues.items()}

    def __iter__(self) -> Iterator[Request]:
        """In the order they would be served if each were admitted in turn (each admission
        raises its tenant's count by one and makes it the one served last)."""
        heads = [(*self._rank(tenant), tenant, 0) for tenant in self._queues]
        heapq.heapify(heads)
        clock = self._clock
        while heads:
            load, _, _, tenant, index = heapq.heappop(heads)
            queue = self._queues[tenant]
            yield queue[index]
            if index + 1 < len(queue):
                clock += 1
                nxt = (load + 1, clock, queue[index + 1].arrival_index, tenant, index + 1)
                heapq.heappush(heads, nxt)

    def _rank(self, tenant: str) -> tuple[int, int, int]:
        """Fewest running first, then served longest ago, then the earliest head."""
        head = self._queues[tenant][0]
        return (self._load.get(tenant, 0), self._served_at.get(tenant, 0), head.arrival_index)

    def _next_tenant(self) -> str:
        if not self._queues:
            raise IndexError("peek or pop from an empty queue")
        return min(self._queues, key=self._rank)

    def _dropped_one(self, tenant: str) -> None:
        self._len -= 1
        if not self._queues[tenant]:
            del self._queues[tenant]
            self._served_at.pop(tenant, None)
