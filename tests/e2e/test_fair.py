"""`--scheduling-policy fair` with real processes: one API key's burst holds every seat of the
worker with more of it waiting, and another key's short request overtakes the waiting part.

Under FCFS the short request waits behind everything queued before it: with 4 seats, a burst of
12 and at least 4 of it waiting, every unfinished request of the burst (8 or more) finishes
first. Under fair it takes a seat from the burst within a step or two of arriving, so at most
the requests that held the seats when it came (4) finish before it. The bound is counted in the
run's own events, not in seconds, so a slow or loaded machine cannot break it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx

from tests.serving import metric_sum, scrape, start_serve

MODEL = "tiny-llama"
KEY_A, KEY_B = "key-tenant-with-a-burst", "key-tenant-with-one-request"
# A round of the burst (96 steps) is long next to the time from seeing the full house to the
# short request's arrival, so it arrives while the first 4 hold the seats and takes one by
# preemption, not from a request that just ended (with 24 tokens, one bundle of 8 steps in
# flight and one planned ahead spanned most of a round).
SEATS, BURST, BURST_TOKENS = 4, 12, 96


def stream_burst(url: str, finished_at: dict[int, float], texts: dict[int, str]) -> None:
    body = {
        "model": MODEL,
        "prompt": "one tenant asks for many long answers at once",
        "n": BURST,
        "max_tokens": BURST_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEY_A}"}
    with (
        httpx.Client(base_url=url, headers=headers, timeout=120) as http,
        http.stream("POST", "/v1/completions", json=body) as reply,
    ):
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[len("data: ") :])["choices"]:
                i = choice["index"]
                texts[i] = texts.get(i, "") + choice["text"]
                if choice["finish_reason"] is not None:
                    finished_at[i] = time.monotonic()


def wait_for_a_full_house(metrics_url: str, timeout: float = 60) -> None:
    """Until the burst holds every seat and at least as many again of it wait."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(metrics_url)
        running = metric_sum(samples, "kvledger_num_requests_running", model=MODEL)
        waiting = metric_sum(samples, "kvledger_num_requests_waiting", model=MODEL)
        if running == SEATS and waiting >= SEATS:
            return
        assert time.monotonic() < deadline, f"the burst never filled the seats: {running=}"
        time.sleep(0.005)


def test_a_burst_from_one_key_does_not_hold_another_keys_request(tmp_path):
    served = start_serve(
        tmp_path,
        "--scheduling-policy",
        "fair",
        "--api-key",
        KEY_A,
        "--api-key",
        KEY_B,
        "--max-num-seqs",
        str(SEATS),
        "--num-kv-blocks",
        "64",
    )
    try:
        finished_at: dict[int, float] = {}
        texts: dict[int, str] = {}
        burst = threading.Thread(target=stream_burst, args=(served.url, finished_at, texts))
        burst.start()
        wait_for_a_full_house(served.scheduler_metrics_url)
        sent = time.monotonic()
        reply = httpx.post(
            f"{served.url}/v1/completions",
            headers={"Authorization": f"Bearer {KEY_B}"},
            json={"model": MODEL, "prompt": "a short question", "max_tokens": 4, "temperature": 0},
            timeout=120,
        )
        done = time.monotonic()
        burst.join(120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        assert len(finished_at) == BURST and not burst.is_alive()
        before = sum(t < sent for t in finished_at.values())
        overtaken = sum(sent <= t < done for t in finished_at.values())
        assert overtaken <= SEATS and done < max(finished_at.values()), (
            f"{overtaken} of the {BURST - before} unfinished requests of the burst finished "
            f"before the other tenant's 4-token request ({done - sent:.2f} s; the burst ended "
            f"{max(finished_at.values()) - sent:.2f} s after it was sent)"
        )
        # it got its seat from the burst, whose preempted requests then recomputed the same text
        samples = scrape(served.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_num_preemptions_total") >= 1
        assert len(set(texts.values())) == 1
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
        assert metric_sum(samples, "kvledger_tracker_entries") == 0
    finally:
        served.stop()


def test_a_tenant_filling_the_queue_does_not_lock_another_out(tmp_path):
    """With 2 seats and a waiting cap of 4, one key keeping the queue full had every request of
    another key refused with 429 (20 of 20). Under fair, the cap is shared out per tenant: the
    other key gets in."""
    served = start_serve(
        tmp_path,
        "--scheduling-policy", "fair",
        "--api-key", KEY_A,
        "--api-key", KEY_B,
        "--max-num-seqs", "2",
        "--max-waiting-requests", "4",
        "--num-kv-blocks", "64",
    )  # fmt: skip
    flood = {"model": MODEL, "prompt": "flood", "max_tokens": 400, "ignore_eos": True}

    def post(key: str, body: dict) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.post(f"{served.url}/v1/completions", json=body, headers=headers, timeout=300)

    stop = threading.Event()

    def flooding() -> None:
        # Each flooder posts again as soon as its request ends or is refused, so the queue stays
        # full however slowly the machine runs, not just for one 400-token window.
        with contextlib.suppress(httpx.HTTPError):  # cut off when the server stops
            while not stop.is_set():
                if post(KEY_A, flood).status_code == 429:
                    time.sleep(0.05)

    try:
        threads = [threading.Thread(target=flooding, daemon=True) for _ in range(8)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while True:
            samples = scrape(served.scheduler_metrics_url)
            if metric_sum(samples, "kvledger_num_requests_waiting", model=MODEL) == 4:
                break
            assert time.monotonic() < deadline, "the flood never filled the queue"
            time.sleep(0.01)
        reply = post(KEY_B, {"model": MODEL, "prompt": "hello", "max_tokens": 2})
        assert reply.status_code == 200, reply.text
    finally:
        stop.set()
        served.stop()
