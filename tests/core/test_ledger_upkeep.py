"""Upkeep of the ledger: cache reset, drain, the orphan auditor, the invariant checker and the
read-only probes (cached prefix, routing) change exactly what they say and nothing else."""

from collections.abc import Sequence

import pytest

from scheduler_svc.core import RequestStatus, Scheduler
from scheduler_svc.core.block_hash import ExtraKeys, sha256_block_hash
from tests.core.fakes import FakeWorker
from tests.core.harness import Harness, config, has_unfinished, request


def test_reset_prefix_cache_only_when_every_block_is_free(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("r", range(8), max_tokens=2))
    h.step()
    if kv:
        assert h.sched.reset_prefix_cache() is False and h.cached() == [0, 1]
    h.run_to_idle()
    epoch = h.kv.pool.removal_epoch if kv else 0
    assert h.sched.reset_prefix_cache() is True
    if kv:
        assert h.cached() == [] and h.kv.pool.removal_epoch == epoch + 1
        assert h.removal_sources([0, 1]) == ["cache_reset"] * 2


def test_drain_hands_back_every_live_request_in_arrival_order(kv: bool) -> None:
    h = Harness.build(kv, num_blocks=6, max_num_seqs=2)
    h.add(
        request("a", range(6), max_tokens=5),
        request("b", range(10, 16), max_tokens=5),
        request("c", range(20, 26), max_tokens=5),
    )
    h.step()
    h.step()
    drained = h.sched.drain()
    assert [r.request_id for r in drained] == ["a", "b", "c"]
    assert [r.output_token_ids for r in drained] == [[1006, 1007], [1006, 1007], []]
    assert all(r.status is RequestStatus.WAITING and r.num_computed_tokens == 0 for r in drained)
    snap = h.sched.snapshot()
    assert snap.num_running == snap.num_waiting == snap.tracker_entries == 0
    assert snap.blocks_in_use == 0 and snap.blocks_cached == 0
    assert snap.entries_released["worker_lost"] == 3
    assert not has_unfinished(h.sched)
    # another worker's ledger takes them over and finishes them as if nothing happened
    other = Harness.build(kv, num_blocks=6)
    other.add(*drained)
    other.run_to_idle()
    assert [r.output_token_ids for r in drained] == [[1006 + i for i in range(5)]] * 3
    assert [other.finish_of(r).finish_reason for r in "abc"] == ["length"] * 3


def test_the_auditor_counts_and_purges_orphans(kv: bool) -> None:
    h = Harness.build(kv, debug_invariants=False)
    h.add(request("r", range(6), max_tokens=3))
    h.step()
    h.sched.tracker.entries["ghost"] = h.sched.tracker.entries["r"]
    if kv:
        h.kv.tables["ghost"] = h.kv.tables["r"]
    h.step()
    assert h.sched.stats.orphans == 1 and "ghost" not in h.sched.tracker.entries
    assert h.sched.stats.table_orphans == (1 if kv else 0)


def test_the_invariant_checker_catches_a_corrupt_ledger() -> None:
    h = Harness.build(True)
    h.add(request("r", range(6), max_tokens=3))
    h.step()
    h.kv.pool.blocks[0].ref_cnt += 1
    with pytest.raises(AssertionError, match="ref count 2 but held by 1"):
        h.sched.check_invariants()
    h.kv.pool.blocks[0].ref_cnt -= 1
    h.kv.pool.blocks[0].token_ids = (9, 9, 9, 9)
    with pytest.raises(AssertionError, match="holds other tokens"):
        h.sched.check_invariants()


def test_cached_prefix_tokens_is_read_only(kv: bool) -> None:
    h = Harness.build(kv)
    h.add(request("p", range(8), max_tokens=1))
    h.run_to_idle()
    before = h.sched.snapshot()
    assert h.sched.cached_prefix_tokens(list(range(8)) + [1], None) == (8 if kv else 0)
    assert h.sched.cached_prefix_tokens(list(range(8)), None) == (4 if kv else 0)
    assert h.sched.cached_prefix_tokens([], None) == 0
    assert h.sched.snapshot() == before


def test_routing_probe_hashes_only_as_far_as_the_cache_reaches() -> None:
    hashed: list[int] = []

    def counting_hasher(parent: bytes | None, tokens: Sequence[int], extra: ExtraKeys) -> bytes:
        hashed.append(len(tokens))
        return sha256_block_hash(parent, tokens, extra)

    cfg = config(num_blocks=16, max_model_len=64)
    h = Harness(Scheduler(cfg, block_hasher=counting_hasher), FakeWorker(cfg.block_size))
    h.add(request("p", range(24), max_tokens=1))
    h.run_to_idle()
    hashed.clear()
    assert h.sched.cached_prefix_tokens(list(range(24)) + [1, 2, 3, 4, 5], None) == 24
    assert len(hashed) == 7  # six hits and the first miss
    hashed.clear()
    assert h.sched.cached_prefix_tokens([99] + list(range(40)), None) == 0
    assert len(hashed) == 1  # a cold prompt: one hash, not ten
