"""Waiting queues: the interface, and the FCFS and priority queues (fair: core/fair.py)."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Iterator

from scheduler_svc.core.request import Request


def fcfs_key(request: Request) -> tuple[int, int]:
    return (0, request.arrival_index)


def priority_key(request: Request) -> tuple[int, int]:
    return (request.priority, request.arrival_index)


class WaitingQueue(ABC):
    @abstractmethod
    def push(self, request: Request) -> None: ...

    @abstractmethod
    def push_front(self, request: Request) -> None:
        """A preempted request: ahead of new arrivals."""

    @abstractmethod
    def peek(self) -> Request: ...

    @abstractmethod
    def pop(self) -> Request: ...

    @abstractmethod
    def remove(self, request: Request) -> None: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """In the order they would be served."""

    def per_tenant(self) -> dict[str, int]:
        """Waiting requests per tenant (those with any)."""
        return dict(Counter(request.tenant for request in self))


class FCFSQueue(WaitingQueue):
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def push(self, request: Request) -> None:
        self._queue.append(request)

    def push_front(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue(WaitingQueue):
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Request]] = []

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_index, request))

    def push_front(self, request: Request) -> None:
        self.push(request)  # its own (priority, arrival) already places it

    def peek(self) -> Request:
        return self._heap[0][2]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def remove(self, request: Request) -> None:
        self._heap = [item for item in self._heap if item[2] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (item[2] for item in sorted(self._heap, key=lambda item: item[:2]))
