"""The shape of a deployment across machines, simulated on loopback: two frontends, one
scheduler and three workers (two of one model with different pool sizes, one embedding worker),
each its own process, every gRPC link over mutual TLS with its own certificate. Both frontends
are driven at once while one worker is killed and started again; every answer must equal the
undisturbed one, both frontends must agree on embeddings, and the ledger must end empty with
nothing stale."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import httpx

from tests.certs import CA
from tests.e2e.helpers import spawn, wait_status
from tests.serving import free_port, metric_sum, scrape

MODEL = "tiny-llama"
EMBEDDER = "all-MiniLM-L6-v2"
SHARED = "Many hosts, one ledger: every block is accounted for. " * 2


def body(i: int) -> dict:
    return {
        "model": MODEL,
        "prompt": SHARED + f"Question {i}.",
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    }


def tls_args(pki: dict, name: str) -> tuple[str, ...]:
    pair = pki[name]
    return ("--grpc-tls-cert", pair.cert, "--grpc-tls-key", pair.key, "--grpc-tls-ca", pki["ca"])


def start_worker(pki: dict, target: str, log: Path, *args: str):  # noqa: ANN201
    metrics = ("--metrics-port", str(free_port()))
    return spawn(
        "worker", "--scheduler", target, *tls_args(pki, "worker"), *metrics, *args, log=log
    )


def wait_workers(url: str, model: str, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while metric_sum(scrape(url), "kvledger_workers_connected", model=model) < count:
        assert time.monotonic() < deadline, f"{count} workers of {model} never connected"
        time.sleep(0.2)


def ledger_idle(url: str, timeout: float = 30) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    names = ("kv_blocks_in_use", "tracker_entries", "num_requests_running", "num_requests_waiting")
    while True:
        samples = scrape(url)
        if all(metric_sum(samples, f"kvledger_{n}") == 0 for n in names):
            return samples
        assert time.monotonic() < deadline, "the ledger never went idle"
        time.sleep(0.2)


def test_two_frontends_three_workers_over_mutual_tls_survive_a_lost_worker(tmp_path, processes):
    ca = CA(tmp_path, "ca")
    pki = {
        "ca": ca.pem,
        "scheduler": ca.issue("scheduler", server=True),
        "frontend": ca.issue("frontend", server=False),
        "worker": ca.issue("worker", server=False),
    }
    log = tmp_path / "services.log"
    grpc_port, scheduler_metrics = free_port(), free_port()
    target = f"localhost:{grpc_port}"  # the certificate's name, as a host name would be
    processes.append(
        spawn(
            "scheduler_svc",
            *("--grpc-port", str(grpc_port), "--metrics-port", str(scheduler_metrics)),
            *tls_args(pki, "scheduler"),
            "--debug-invariants",
            log=log,
        )
    )
    ports = [free_port(), free_port()]
    for port in ports:
        processes.append(
            spawn(
                "server",
                *("--scheduler", target, "--port", str(port)),
                *tls_args(pki, "frontend"),
                *("--require-model", MODEL, "--require-model", EMBEDDER),
                log=log,
            )
        )
    small = ("--worker-id", "small", "--num-kv-blocks", "24", "--model", MODEL)
    processes.append(start_worker(pki, target, log, *small))
    big = ("--worker-id", "big", "--num-kv-blocks", "256", "--model", MODEL)
    processes.append(start_worker(pki, target, log, *big))
    embed = ("--worker-id", "embed", "--model", EMBEDDER)
    processes.append(start_worker(pki, target, log, *embed))
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url in urls:
        wait_status(f"{url}/health", 200, timeout=180)
    # /health answers once one worker of each required model is up; the big worker must be too,
    # or the small one's requests have nowhere to go when it is killed (a 503, by design).
    metrics_url = f"http://127.0.0.1:{scheduler_metrics}/metrics"
    wait_workers(metrics_url, MODEL, 2)

    work = [body(i) for i in range(16)]
    with httpx.Client(base_url=urls[0], timeout=120) as http:
        alone = [http.post("/v1/completions", json=b).json()["choices"][0]["text"] for b in work]

    got: dict[int, str] = {}
    vectors: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with httpx.Client(base_url=urls[i % 2], timeout=120) as http:
                reply = http.post("/v1/completions", json=work[i])
                assert reply.status_code == 200, reply.text
                got[i] = reply.json()["choices"][0]["text"]
                if i < 2:
                    text = {"model": EMBEDDER, "input": "the same sentence on both frontends"}
                    vectors[i] = http.post("/v1/embeddings", json=text).json()["data"][0][
                        "embedding"
                    ]
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    # Kill the small worker once it holds requests (a fixed delay raced the frontends' parsing).
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(metrics_url)
        held = metric_sum(samples, "kvledger_num_requests_running", worker="small")
        held += metric_sum(samples, "kvledger_num_requests_waiting", worker="small")
        if held >= 1:
            break
        assert time.monotonic() < deadline, "the small worker was never given a request"
        time.sleep(0.01)
    processes[3].send_signal(signal.SIGKILL)  # the small worker
    processes[3].wait()
    processes[3] = start_worker(pki, target, log, *small)
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    assert [got[i] for i in range(len(work))] == alone
    assert vectors[0] == vectors[1]

    samples = ledger_idle(f"http://127.0.0.1:{scheduler_metrics}/metrics")
    assert metric_sum(samples, "kvledger_tracker_orphans_total") == 0
    assert metric_sum(samples, "kvledger_requests_finished_total", reason="error") == 0
    for url in urls:  # each frontend served its half
        served = metric_sum(scrape(f"{url}/metrics"), "kvledger_http_requests_total", status="200")
        assert served >= len(work) // 2
    text = log.read_text()
    lost = re.search(r"worker small lost with (\d+) live requests", text)
    assert lost and int(lost.group(1)) >= 1, "the killed worker held no request: kill it sooner"
    wait_workers(metrics_url, MODEL, 2)  # the restarted worker registered again
    assert "INSECURE" not in text
