"""In-flight requests survive a scheduler restart: `kvledger serve` runs the services as real
processes; the scheduler is killed with SIGKILL in the middle of 40 streaming requests, serve
starts it again, the workers register again, and the frontend re-submits every live request as
a continuation. Every client's stream goes on without an error or a repeated token, and says
exactly what the same request says on an undisturbed server: greedy ones, and seeded sampling
with penalties too. A scheduler that does not come back within --scheduler-reconnect-timeout
ends the stream with an error event, as a lost scheduler always did."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.helpers import cmdline, idle, spawn, wait_status
from tests.serving import descendants, free_port, metric_sum, scrape, start_serve

MODEL = "tiny-llama"
# Long enough that no stream ends while the 40 start: ~15 bundles of 8 steps each.
MAX_TOKENS = 120


def bodies() -> list[dict]:
    out = []
    for i in range(40):
        body = {
            "model": MODEL,
            "prompt": f"Request {i} of the restart test asks the ledger about block {i % 9}.",
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
        }
        if i % 5 == 0:  # seeded sampling with penalties: they continue exactly too
            body |= dict(temperature=0.9, seed=1000 + i, presence_penalty=0.5)
            body |= dict(frequency_penalty=0.4, repetition_penalty=1.2)
        out.append(body)
    return out


def stream(url: str, body: dict, progress: list[int], index: int) -> tuple[str, int, list]:
    """The streamed text, the usage's completion tokens and any error events; `progress[index]`
    counts its events, and turns negative once the choice has a finish reason."""
    text, errors, usage = [], [], None
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with (
        httpx.Client(base_url=url, timeout=120) as http,
        http.stream("POST", "/v1/completions", json=payload) as reply,
    ):
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                errors.append(event["error"])
                continue
            if event.get("usage"):
                usage = event["usage"]
            for choice in event["choices"]:
                text.append(choice["text"])
                progress[index] += 1
                if choice.get("finish_reason"):
                    progress[index] = -progress[index]
    return "".join(text), (usage or {}).get("completion_tokens", -1), errors


def scheduler_pid(served) -> int:  # noqa: ANN001
    return next(p for p in descendants(served.process.pid) if "-m scheduler_svc" in cmdline(p))


def test_a_scheduler_killed_mid_stream_loses_no_request(tmp_path):
    served = start_serve(tmp_path, "--num-kv-blocks", "512", "--max-num-seqs", "64")
    try:
        work = bodies()
        with httpx.Client(base_url=served.url, timeout=120) as http:

            def alone(body: dict) -> str:
                reply = http.post("/v1/completions", json=body)
                assert reply.status_code == 200, reply.text
                return reply.json()["choices"][0]["text"]

            # batched as the disturbed run is (greedy and seeded outputs do not depend on it)
            with ThreadPoolExecutor(8) as pool:
                undisturbed = list(pool.map(alone, work))

        progress = [0] * len(work)
        results: list[tuple[str, int, list] | BaseException | None] = [None] * len(work)

        def run(i: int) -> None:
            try:
                results[i] = stream(served.url, work[i], progress, i)
            except BaseException as err:  # noqa: BLE001 - reported below
                results[i] = err

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
        for t in threads:
            t.start()
        # Kill it once every stream has begun and none has ended: all 40 are live.
        deadline = time.monotonic() + 60
        while 0 in progress:
            assert time.monotonic() < deadline, f"streams did not start: {progress}"
            time.sleep(0.005)
        first = scheduler_pid(served)
        killed_at = list(progress)
        os.kill(first, signal.SIGKILL)
        for t in threads:
            t.join(timeout=180)

        assert min(killed_at) > 0, f"a stream ended before the kill: raise MAX_TOKENS {killed_at}"
        for i, result in enumerate(results):
            assert not isinstance(result, BaseException), (i, result)
            text, completion_tokens, errors = result
            assert errors == [], (i, errors)
            assert completion_tokens == MAX_TOKENS, i
            assert text == undisturbed[i], (i, killed_at[i])
        assert scheduler_pid(served) != first, "serve did not start a new scheduler"
        frontend = scrape(f"{served.url}/metrics")
        assert metric_sum(frontend, "kvledger_request_resumptions_total", outcome="resumed") == len(
            work
        )
        assert metric_sum(frontend, "kvledger_request_resumptions_total", outcome="gave_up") == 0
        assert idle(served), "the restarted scheduler's ledger is not empty"
    finally:
        served.stop()


def test_a_scheduler_that_does_not_come_back_ends_the_stream_with_an_error(tmp_path, processes):
    grpc_port, http_port = free_port(), free_port()
    target, log = f"127.0.0.1:{grpc_port}", tmp_path / "services.log"
    processes.append(spawn("scheduler_svc", "--grpc-port", str(grpc_port), log=log))
    frontend = ("--scheduler", target, "--port", str(http_port), "--require-model", MODEL)
    processes.append(spawn("server", *frontend, "--scheduler-reconnect-timeout", "2", log=log))
    processes.append(spawn("worker", "--scheduler", target, "--num-kv-blocks", "128", log=log))
    url = f"http://127.0.0.1:{http_port}"
    wait_status(f"{url}/health", 200, timeout=120)
    body = {"model": MODEL, "prompt": "go on", "max_tokens": 1500, "ignore_eos": True}
    events: list[str] = []
    killed_at = None
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60
    ) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
            if len(events) == 3 and killed_at is None:
                processes[0].send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
    waited = time.monotonic() - killed_at
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable", error
    assert 2 <= waited < 15, waited
    assert all("choices" in json.loads(e) for e in events[:-2])
    frontend_metrics = scrape(f"{url}/metrics")
    assert (
        metric_sum(frontend_metrics, "kvledger_request_resumptions_total", outcome="gave_up") == 1
    )
