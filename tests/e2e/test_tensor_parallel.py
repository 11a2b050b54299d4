"""`kvledger serve --tensor-parallel-size 2` end to end: real processes (each worker a group of
two gloo ranks), real gRPC and HTTP. A group serves what a single-rank worker serves, is one
worker to the scheduler, and a killed rank takes its group down as one lost worker whose
requests finish on the other worker, with no rank left running."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai

from tests.e2e.helpers import cmdline
from tests.serving import alive, descendants, metric_sum, scrape, start_serve

MODEL = "tiny-llama"
PROMPTS = [f"request number {i} asks the ledger for a long answer" for i in range(3)]
KWARGS = dict(model=MODEL, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})


def _client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)


def _complete(served) -> list[str]:
    client = _client(served)
    return [client.completions.create(prompt=p, **KWARGS).choices[0].text for p in PROMPTS]


def _worker_pid(served, worker_id: str) -> int:
    return next(
        p
        for p in descendants(served.process.pid)
        if "-m worker" in cmdline(p) and worker_id in cmdline(p)
    )


def _ranks(worker_pid: int) -> list[int]:
    """The spawned ranks 1..N-1 of a worker (not multiprocessing's resource tracker)."""
    return [p for p in descendants(worker_pid) if "spawn_main" in cmdline(p)]


def test_a_tp2_group_serves_what_a_single_rank_worker_serves(tmp_path) -> None:
    (tmp_path / "tp1").mkdir()
    (tmp_path / "tp2").mkdir()
    single = start_serve(tmp_path / "tp1", "--num-kv-blocks", "64")
    try:
        reference = _complete(single)
    finally:
        single.stop()
    group = start_serve(tmp_path / "tp2", "--tensor-parallel-size", "2", "--num-kv-blocks", "64")
    try:
        assert len(_ranks(_worker_pid(group, "worker-0"))) == 1
        assert _complete(group) == reference
        samples = scrape(group.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_workers_connected") == 1  # one worker, two ranks
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
    finally:
        assert group.stop() == 0, group.log()
    assert not [p for p in group.children if alive(p)]


def test_killing_a_rank_loses_one_worker_whose_requests_finish_on_the_other(tmp_path) -> None:
    served = start_serve(
        tmp_path, "--num-workers", "2", "-tp", "2", "--num-kv-blocks", "256", timeout=300
    )
    try:
        client = _client(served)
        reference = _complete(served)
        leader = _worker_pid(served, "worker-0")
        (victim,) = _ranks(leader)
        group = [leader, victim]
        results: dict[int, str] = {}

        def stream(i: int) -> None:
            chunks = client.completions.create(prompt=PROMPTS[i], stream=True, **KWARGS)
            results[i] = "".join(c.choices[0].text for c in chunks)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while not metric_sum(
            scrape(served.scheduler_metrics_url),
            "kvledger_num_requests_running",
            worker="worker-0",
        ):
            assert time.monotonic() < deadline, "worker-0 never got a request"
            time.sleep(0.01)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        while alive(leader) and time.monotonic() - killed < 60:  # the collective timeout is 120 s
            time.sleep(0.05)
        assert not alive(leader), "rank 0 outlived its rank 1"
        for t in threads:
            t.join(90)
        assert results == dict(enumerate(reference))
        log = served.log()
        # rank 0 goes down whichever sees the loss first: the watcher of its ranks, or its
        # own next collective (worker/parallel/tp_spawn.py)
        watcher = "worker-rank1 exited" in log and "the tensor-parallel group goes down" in log
        assert watcher or "the tensor-parallel group is broken" in log, log[-2000:]
        assert "worker worker-0 lost" in log
        assert not [p for p in group if alive(p)]
        samples = scrape(served.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
    finally:
        served.stop()


def test_a_lone_group_that_loses_a_rank_fails_its_stream_cleanly_then_comes_back(tmp_path):
    """With no other worker, the stream ends with an error event (not a hang); serve restarts
    the worker, which forms a new group and serves again."""
    served = start_serve(tmp_path, "-tp", "2", "--num-kv-blocks", "128")
    try:
        leader = _worker_pid(served, "worker-0")
        (victim,) = _ranks(leader)
        body = {"model": MODEL, "prompt": "tell me everything", "max_tokens": 1500}
        body |= {"ignore_eos": True, "stream": True}
        events: list[str] = []
        with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=60) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: ") :])
                    if len(events) == 3:
                        os.kill(victim, signal.SIGKILL)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "service_unavailable" and "worker" in error["message"]
        deadline = time.monotonic() + 120
        while True:  # the restarted group registers again
            try:
                text = _client(served).completions.create(prompt=PROMPTS[0], **KWARGS)
                break
            except (openai.APIStatusError, openai.APIConnectionError):
                assert time.monotonic() < deadline, served.log()
                time.sleep(0.5)
        assert text.choices[0].text
        assert not alive(leader) and not alive(victim)
        assert len(_ranks(_worker_pid(served, "worker-0"))) == 1
    finally:
        served.stop()
