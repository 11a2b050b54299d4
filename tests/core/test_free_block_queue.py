import pytest

from scheduler_svc.core.free_block_queue import FreeBlockQueue
from scheduler_svc.core.kv_block import KVBlock


def ids(queue: FreeBlockQueue) -> list[int]:
    return [b.block_id for b in queue]


def test_starts_in_block_order_and_pops_from_the_front() -> None:
    blocks = [KVBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert ids(queue) == [0, 1, 2, 3, 4] and len(queue) == 5
    taken = queue.popleft_n(2)
    assert [b.block_id for b in taken] == [0, 1]
    assert all(b.prev_free is None and b.next_free is None for b in taken)
    assert ids(queue) == [2, 3, 4] and len(queue) == 3


def test_remove_from_the_middle_and_append_to_the_back() -> None:
    blocks = [KVBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert ids(queue) == [1, 3] and len(queue) == 2
    queue.append(blocks[4])
    queue.append(blocks[0])
    assert ids(queue) == [1, 3, 4, 0]
    assert [b.block_id for b in queue.popleft_n(4)] == [1, 3, 4, 0]
    assert ids(queue) == [] and len(queue) == 0
    queue.append(blocks[2])
    assert ids(queue) == [2]


def test_misuse_is_refused() -> None:
    blocks = [KVBlock(i) for i in range(2)]
    queue = FreeBlockQueue(blocks)
    with pytest.raises(ValueError, match="only 2 left"):
        queue.popleft_n(3)
    queue.remove(blocks[0])
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[0])
