"""Everything at once, with real processes: two workers on pools small enough to evict and
preempt, shared prefixes with and without salts, n > 1, clients that leave mid-stream, and a
worker killed with SIGKILL in the middle of it.

Every request that ran to its end must say exactly what the same request says alone on an idle
server (greedy), and afterwards the ledger must be empty and no worker may ever have refused a
claimed block: the scheduler never handed out a stale entry.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import httpx

from tests.e2e.helpers import cmdline
from tests.serving import descendants, metric_sum, scrape, start_serve, wait_metric

MODEL = "tiny-llama"
SHARED = "The ledger keeps every block it hands out accounted for, in every state. " * 3
MAX_TOKENS = 24


def workload(seed: int) -> list[dict]:
    rng = random.Random(seed)
    bodies = []
    for i in range(28):
        prompt = SHARED * rng.choice([1, 2]) + f"Request {i % 7} asks about block {i % 5}."
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "n": rng.choice([1, 1, 2]),
        }
        if rng.random() < 0.3:
            body["cache_salt"] = rng.choice(["tenant-a", "tenant-b"])
        bodies.append(body)
    return bodies


def complete(http: httpx.Client, body: dict) -> list[str]:
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return [c["text"] for c in sorted(reply.json()["choices"], key=lambda c: c["index"])]


def leave_after_a_few_chunks(http: httpx.Client, body: dict) -> None:
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        for n, _ in enumerate(reply.iter_lines()):
            if n >= 3:
                return  # the client goes away mid-stream


def scrape_when_up(url: str, timeout: float = 60) -> dict[str, float]:
    """A restarted worker's metrics, once it serves them again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(url)
        except OSError:
            assert time.monotonic() < deadline, f"{url} never came back"
            time.sleep(0.2)


def worker_pid(served, name: str) -> int:  # noqa: ANN001
    return next(
        p
        for p in descendants(served.process.pid)
        if "-m worker" in cmdline(p) and name in cmdline(p)
    )


def test_everything_at_once_leaves_an_exact_ledger(tmp_path):
    # 24 blocks of 16 tokens a worker: three requests of ~100 tokens fill a pool.
    served = start_serve(
        tmp_path, "--num-workers", "2", "--num-kv-blocks", "24", "--max-num-seqs", "6"
    )
    try:
        http = httpx.Client(base_url=served.url, timeout=120)
        bodies = workload(seed=3)
        alone = {i: complete(http, body) for i, body in enumerate(bodies) if i % 4 != 3}
        leaving = [i for i in range(len(bodies)) if i % 4 == 3]
        got: dict[int, list[str]] = {}
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                if i in leaving:
                    leave_after_a_few_chunks(http, bodies[i])
                else:
                    got[i] = complete(http, bodies[i])
            except BaseException as err:  # noqa: BLE001 - reported below, with its request
                errors.append(err)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
        for thread in threads:
            thread.start()
        # into the run: the victim holds requests (a fixed delay could kill an idle worker)
        metrics = served.scheduler_metrics_url
        wait_metric(metrics, "kvledger_num_requests_running", 2, worker="worker-0")
        os.kill(worker_pid(served, "worker-0"), signal.SIGKILL)
        for thread in threads:
            thread.join(180)
        assert not errors, errors
        assert got == alone

        deadline = time.monotonic() + 60
        while True:  # the killed worker is restarted; the ledger settles
            samples = scrape(served.scheduler_metrics_url)
            idle = all(
                metric_sum(samples, name) == 0
                for name in (
                    "kvledger_kv_blocks_in_use",
                    "kvledger_tracker_entries",
                    "kvledger_num_requests_running",
                    "kvledger_num_requests_waiting",
                )
            )
            if idle:
                break
            assert time.monotonic() < deadline, "the ledger never went idle"
            time.sleep(0.2)
        assert metric_sum(samples, "kvledger_tracker_orphans_total") == 0
        assert metric_sum(samples, "kvledger_block_table_orphans_total") == 0
        assert metric_sum(samples, "kvledger_kv_block_evictions_total") > 0
        assert metric_sum(samples, "kvledger_prefix_cache_hits_total") > 0
        assert metric_sum(samples, "kvledger_requests_finished_total", reason="abort") >= 1
        assert metric_sum(samples, "kvledger_requests_finished_total", reason="error") == 0
        for i in range(2):  # a worker's provenance check never caught a stale claim
            worker = scrape_when_up(f"http://127.0.0.1:{served.metrics_port + 1 + i}/metrics")
            assert metric_sum(worker, "kvledger_worker_stale_block_hits_total") == 0
        assert "worker worker-0 lost" in served.log()
    finally:
        served.stop()
