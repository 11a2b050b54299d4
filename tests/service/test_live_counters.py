"""The ledger's counters as Prometheus scrapes them from a live scheduler service, for a
scripted workload: a shared prefix gives hits; a waiting request whose prefix is evicted
before its lookup is used gives a stale entry (source `eviction`); failed admissions give
releases. The worker is a real link whose model is a gated stand-in, so the order is exact."""

from __future__ import annotations

import asyncio
import threading

from kvledger.flags import SCHEDULER, parse
from scheduler_svc.__main__ import start
from tests.service.helpers import GatedRunner, Worker, generate, wait_for
from tests.serving import free_port, metric_sum, scrape


def collect(target: str, rid: str, prompt: list[int], max_tokens: int, out: dict) -> None:
    out[rid] = [t for r in generate(target, rid, prompt, max_tokens) for t in r.token_ids]


def test_eviction_of_a_waiting_requests_prefix_is_a_counted_stale_entry():
    loop = asyncio.new_event_loop()
    port, metrics_port = free_port(), free_port()
    # Lockstep, one step a plan: the timeline below needs C's second decode planned after B's
    # arrival (with async scheduling or bundles it is planned before B arrives).
    argv = ["--grpc-port", str(port), "--metrics-port", str(metrics_port), "--debug-invariants"]
    lockstep = ["--no-async-scheduling", "--num-scheduler-steps", "1"]
    args = parse(SCHEDULER, [*argv, *lockstep], "t")
    server, engine, _ = loop.run_until_complete(start(args, metrics=True))
    threading.Thread(target=loop.run_forever, daemon=True).start()
    target, url = f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    # 6 blocks of 4 tokens. C's 15-token prompt fills blocks 2-5; its first decode (position
    # 15) is held while B arrives; its second decode then takes block 1, A's cached tail.
    gate = GatedRunner("C", at=15)
    worker = Worker(target, "w0", num_blocks=6)
    worker.client.executor.runner = gate
    try:
        wait_for(lambda: engine.links)
        out: dict[str, list[int]] = {}
        shared = [11, 12, 13, 14, 15, 16, 17, 18]
        collect(target, "A", shared, 1, out)  # blocks 0 and 1 now cached, free
        c = threading.Thread(target=collect, args=(target, "C", list(range(100, 115)), 5, out))
        c.start()
        assert gate.reached.wait(10)
        b = threading.Thread(target=collect, args=(target, "B", shared + [21, 22, 23, 24], 2, out))
        b.start()
        wait_for(lambda: "B" in engine.requests)  # its lookup (8 cached tokens) is taken
        gate.release.set()
        c.join(10)
        b.join(10)
        assert len(out["C"]) == 5 and len(out["B"]) == 2
        samples = scrape(url)
        assert metric_sum(samples, "kvledger_tracker_stale_entries_total", source="eviction") == 1
        assert (
            metric_sum(samples, "kvledger_tracker_entries_released_total", reason="no_blocks") >= 1
        )
        assert metric_sum(samples, "kvledger_kv_block_evictions_total") >= 1
        hits = metric_sum(samples, "kvledger_prefix_cache_hits_total")
        queries = metric_sum(samples, "kvledger_prefix_cache_queries_total")
        assert 0 < hits <= queries
        assert metric_sum(samples, "kvledger_tracker_entries") == 0
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
        assert metric_sum(samples, "kvledger_tracker_orphans_total") == 0
    finally:
        gate.release.set()
        worker.stop()
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
