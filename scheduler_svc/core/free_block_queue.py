"""LRU queue of free blocks: a doubly linked list threaded through the blocks themselves.

A deque cannot remove from the middle in O(1), and a cache hit on a free block must do exactly
that. The front is the least recently freed block, the next one to be evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from scheduler_svc.core.kv_block import KVBlock


class FreeBlockQueue:
    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self._head = KVBlock(-1)  # sentinels: no branch for an empty or one-element list
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[KVBlock]:
        node = self._head.next_free
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next_free

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        assert last is not None
        block.prev_free = last
        block.next_free = self._tail
        last.next_free = block
        self._tail.prev_free = block
        self._len += 1

    def appendleft(self, block: KVBlock) -> None:
        """At the front: the next block taken (one that holds nothing worth keeping)."""
        first = self._head.next_free
        assert first is not None
        block.prev_free = self._head
        block.next_free = first
        first.prev_free = block
        self._head.next_free = block
        self._len += 1

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def popleft_n(self, n: int) -> list[KVBlock]:
        if n > self._len:
            raise ValueError(f"asked for {n} free blocks, only {self._len} left")
        taken: list[KVBlock] = []
        node = self._head.next_free
        for _ in range(n):
            assert node is not None
            taken.append(node)
            nxt = node.next_free
            node.prev_free = node.next_free = None
            node = nxt
        assert node is not None
        self._head.next_free = node
        node.prev_free = self._head
        self._len -= n
        return taken
