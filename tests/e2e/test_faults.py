"""Faults with real processes: a worker killed mid-stream, no worker at all, a scheduler restart."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai

from tests.e2e.helpers import cmdline, idle, spawn, wait_status
from tests.serving import descendants, free_port, metric_sum, scrape, start_serve, wait_metric

MODEL = "tiny-llama"
PROMPTS = [f"request number {i} asks the ledger for a long answer" for i in range(4)]


def test_kill_9_a_worker_mid_stream_requests_finish_on_the_other(tmp_path):
    served = start_serve(tmp_path, "--num-workers", "2", "--num-kv-blocks", "256")
    try:
        # serve says it is serving once both workers registered, not at the first one's /health
        samples = scrape(served.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_workers_connected", model=MODEL) == 2
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        kwargs = dict(model=MODEL, max_tokens=60, temperature=0, extra_body={"ignore_eos": True})
        reference = [client.completions.create(prompt=p, **kwargs).choices[0].text for p in PROMPTS]
        victim = next(
            p
            for p in descendants(served.process.pid)
            if "-m worker" in cmdline(p) and "worker-0" in cmdline(p)
        )
        results: dict[int, str] = {}

        def stream(i: int) -> None:
            chunks = client.completions.create(prompt=PROMPTS[i], stream=True, **kwargs)
            results[i] = "".join(c.choices[0].text for c in chunks)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        metrics = served.scheduler_metrics_url
        wait_metric(metrics, "kvledger_num_requests_running", 1, worker="worker-0")
        os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join(60)
        assert results == dict(enumerate(reference))
        assert idle(served), "blocks or tracker entries outlived the lost worker"
        assert "worker worker-0 lost" in served.log()
        deadline = time.monotonic() + 60  # serve's supervisor looks every 0.2 s
        while "worker-0 exited with code -9; restarting it" not in served.log():
            assert time.monotonic() < deadline, "serve never restarted worker-0"
            time.sleep(0.1)
    finally:
        served.stop()


def test_no_worker_is_503_then_a_scheduler_restart_is_survived(tmp_path, processes):
    grpc_port, http_port = free_port(), free_port()
    target = f"127.0.0.1:{grpc_port}"
    log = tmp_path / "services.log"
    scheduler_args = (
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(free_port()),
        "--debug-invariants",
    )
    processes.append(spawn("scheduler_svc", *scheduler_args, log=log))
    processes.append(
        spawn(
            "server",
            "--scheduler",
            target,
            "--port",
            str(http_port),
            "--require-model",
            MODEL,
            log=log,
        )
    )
    url = f"http://127.0.0.1:{http_port}"
    wait_status(f"{url}/version", 200)
    assert httpx.get(f"{url}/health").status_code == 503
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2, "temperature": 0}
    reply = httpx.post(f"{url}/v1/completions", json=body)
    assert reply.status_code == 503 and reply.headers["retry-after"]
    assert reply.json()["error"]["type"] == "service_unavailable"

    processes.append(
        spawn(
            "worker",
            "--scheduler",
            target,
            "--num-kv-blocks",
            "64",
            "--metrics-port",
            str(free_port()),
            log=log,
        )
    )
    wait_status(f"{url}/health", 200)
    first = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert first.status_code == 200

    processes[0].send_signal(signal.SIGKILL)
    processes[0].wait()
    wait_status(f"{url}/health", 503, timeout=10)
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=10)
    assert reply.status_code == 503, reply.text

    processes[0] = spawn("scheduler_svc", *scheduler_args, log=log)
    wait_status(f"{url}/health", 200, timeout=30)
    again = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert again.status_code == 200
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]


def test_full_queue_is_429_with_retry_after(tmp_path):
    served = start_serve(
        tmp_path, "--num-kv-blocks", "64", "--max-num-seqs", "1", "--max-waiting-requests", "1"
    )
    try:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 400, "ignore_eos": True}
        statuses: list[int] = []

        def call() -> None:
            statuses.append(
                httpx.post(f"{served.url}/v1/completions", json=body, timeout=300).status_code
            )

        threads = [threading.Thread(target=call) for _ in range(2)]
        metrics = served.scheduler_metrics_url
        threads[0].start()
        wait_metric(metrics, "kvledger_num_requests_running", 1)  # the first runs
        threads[1].start()
        wait_metric(metrics, "kvledger_num_requests_waiting", 1)  # the second waits
        reply = httpx.post(f"{served.url}/v1/completions", json=body)
        assert reply.status_code == 429 and reply.headers["retry-after"]
        assert reply.json()["error"]["type"] == "rate_limit_error"
        for t in threads:
            t.join(300)  # 800 tokens one after the other: slow on a loaded 2-core machine
        assert statuses == [200, 200]
    finally:
        served.stop()


def test_mid_stream_failure_ends_with_an_error_event_then_done(tmp_path):
    served = start_serve(tmp_path, "--num-kv-blocks", "128")
    try:
        worker = next(p for p in descendants(served.process.pid) if "-m worker" in cmdline(p))
        body = {
            "model": MODEL,
            "prompt": "tell me everything",
            "max_tokens": 1500,
            "ignore_eos": True,
            "stream": True,
        }
        events: list[str] = []
        with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=60) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[len("data: ") :])
                if len(events) == 3:
                    os.kill(worker, signal.SIGKILL)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "service_unavailable" and "worker" in error["message"]
        assert all("choices" in json.loads(e) for e in events[:-2])
    finally:
        served.stop()
