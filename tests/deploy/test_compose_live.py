"""Live: docker-compose.yml started for real in a Docker engine. The images are built (a base made
from Debian's packages, a wheelhouse, no index in the build), the frontend, scheduler, two CPU
workers, the embedding worker and Prometheus come up, and through the published port the API
answers, Prometheus scrapes every service and the dashboard's queries have data. A worker's
container is then crashed (SIGKILL to its main process from the host) under 16 live streams:
its restart policy brings it back and every stream ends with the text it has undisturbed.
`compose down -v` leaves no container, network or volume.

Runs as root where a Docker engine can be started (CI); skips, saying why, only where none can.
`-m "not docker"` leaves it out of a quick local run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import time
import uuid

import httpx
import pytest

from tests.deploy.docker_stack import (
    BUILD_TIMEOUT,
    CPU_WORKERS,
    IMAGE_TAG,
    MODEL,
    Stack,
    docker,
    ensure_engine,
)
from tests.deploy.live import wait_for
from tests.deploy.prom import expressions, promql
from tests.deploy.tools import REPO

pytestmark = [pytest.mark.docker, pytest.mark.timeout(BUILD_TIMEOUT + 900)]

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
STREAMS = 16
MAX_TOKENS = 192
LOGS = REPO / "build" / "compose-test"
SCRAPED = {"frontend:9404", "scheduler:9400", "worker:9401", "embedding-worker:9402"}


@pytest.fixture(scope="module")
def stack():
    """The stack, up and healthy. Its commands' output and, at the end, every service's log are
    in build/compose-test/ (kept for a failed CI run to show)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / "compose.log"
    log.write_text("")
    ensure_engine(log)
    stack = Stack(project=f"kvltest{uuid.uuid4().hex[:8]}", log=log)
    try:
        stack.build()
        stack.up()
        wait_for(lambda: _health(stack) == 200, "the frontend's /health", timeout=300)
        yield stack
    finally:
        with contextlib.suppress(Exception):
            (LOGS / "services.log").write_text(stack.compose("logs", "--no-color", timeout=120))
        # the last test checks `down`; this one only cleans up after a failure
        with contextlib.suppress(Exception):
            stack.down()


def _health(stack: Stack) -> int | None:
    try:
        return httpx.get(f"{stack.url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


def _client(stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers=stack.headers, timeout=300)


def _body(prompt: str, max_tokens: int = 8) -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def _stream_text(http: httpx.Client, body: dict, started: list[bool] | None = None) -> str:
    """The streamed completion's text; appends to `started` as its tokens arrive."""
    text = []
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                return "".join(text)
            event = json.loads(data)
            assert "error" not in event, event
            text.append(event["choices"][0]["text"])
            if started is not None:
                started.append(True)
    raise AssertionError(f"stream ended without [DONE] after {''.join(text)!r}")


def test_completions_streaming_chat_and_embeddings_answer(stack):
    with _client(stack) as http:
        reply = http.post("/v1/completions", json=_body("The ledger"))
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 8
        assert _stream_text(http, _body("The ledger")) == reply.json()["choices"][0]["text"]
        chat = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": 6,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["role"] == "assistant"
        embed = http.post("/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": ["a", "b"]})
        assert embed.status_code == 200, embed.text
        vectors = [d["embedding"] for d in embed.json()["data"]]
        assert len(vectors) == 2 and len(vectors[0]) == 384
        no_key = httpx.post(f"{stack.url}/v1/completions", json=_body("x"), timeout=30)
        assert no_key.status_code == 401, "the API key from the environment is required"


def test_a_stored_response_is_read_back_and_continued(stack):
    """The frontend's responses volume is writable by its non-root user: `store` keeps the
    response, GET reads it and previous_response_id continues it."""
    with _client(stack) as http:
        first = {"model": MODEL, "input": "Name a colour.", "max_output_tokens": 4}
        reply = http.post("/v1/responses", json=first)
        assert reply.status_code == 200, reply.text
        stored = reply.json()
        assert stored["store"] is True and stored["status"] in ("completed", "incomplete")
        read = http.get(f"/v1/responses/{stored['id']}")
        assert read.status_code == 200 and read.json()["output"] == stored["output"], read.text
        follow = {"model": MODEL, "input": "Another.", "previous_response_id": stored["id"]}
        continued = http.post("/v1/responses", json={**follow, "max_output_tokens": 4})
        assert continued.status_code == 200, continued.text
        assert continued.json()["previous_response_id"] == stored["id"]


def test_health_and_metrics_through_the_published_port(stack):
    assert httpx.get(f"{stack.url}/health", timeout=10).status_code == 200
    with _client(stack) as http:
        metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert "kvledger_http_requests_total" in metrics.text


def test_prometheus_scrapes_every_service_and_the_dashboard_has_data(stack):
    def targets() -> list[dict]:
        reply = httpx.get(f"{stack.prometheus_url}/api/v1/targets", timeout=10).json()
        return reply["data"]["activeTargets"]

    def all_up() -> bool:
        up = {t["labels"]["instance"] for t in targets() if t["health"] == "up"}
        return up >= SCRAPED

    wait_for(all_up, f"Prometheus to see {sorted(SCRAPED)} up", timeout=120)
    [expr] = [e for title, e in expressions() if title == "Prompt and generation tokens /s / B"]

    def query(q: str) -> list[dict]:
        reply = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": q}, timeout=10)
        assert reply.json()["status"] == "success", reply.text
        return reply.json()["data"]["result"]

    def has_data() -> bool:
        # traffic inside the rate window, then Prometheus's next scrape must see it
        with _client(stack) as http:
            assert http.post("/v1/completions", json=_body("Prometheus")).status_code == 200
        return any(float(r["value"][1]) > 0 for r in query(promql(expr)))

    try:
        wait_for(has_data, "the dashboard's generation-token rate to have data", timeout=120)
    except AssertionError as err:
        samples = query("kvledger_generation_tokens_total[2m]")
        raise AssertionError(f"{err}; the counter's samples: {samples}") from None


def _scheduler_gauge(stack: Stack, name: str, label: str) -> dict[str, float]:
    """A scheduler gauge by one label, read inside the scheduler's container (its metrics port
    is on the internal network only)."""
    text = stack.exec(
        "scheduler",
        "python",
        "-c",
        "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9400/metrics').read().decode())",
    )
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf'{name}\{{.*{label}="([^"]+)".*\}} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def _running_by_worker(stack: Stack) -> dict[str, float]:
    return _scheduler_gauge(stack, "kvledger_num_requests_running", "worker")


def _workers_connected(stack: Stack) -> float:
    return _scheduler_gauge(stack, "kvledger_workers_connected", "model").get(MODEL, 0)


def _worker_container(stack: Stack, worker_id: str) -> str:
    """The CPU worker container whose worker id (`<hostname>-<pid>`) this is."""
    for container in stack.containers("worker"):
        if worker_id.startswith(stack.inspect(container)["Config"]["Hostname"] + "-"):
            return container
    raise AssertionError(f"no worker container for {worker_id}")


def test_a_worker_crashed_under_16_streams_comes_back_and_no_stream_changes(stack):
    assert len(stack.containers("worker")) == CPU_WORKERS
    # a container is healthy once its model is loaded; registered is the scheduler's word, and
    # with one CPU worker registered the victim's streams would have nowhere to go
    wait_for(lambda: _workers_connected(stack) == CPU_WORKERS, "both CPU workers", timeout=240)
    prompts = [f"Stream {i} asks the ledger about block {i * 7}." for i in range(STREAMS)]
    bodies = [_body(p, MAX_TOKENS) for p in prompts]
    with _client(stack) as http, concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        undisturbed = list(pool.map(lambda b: _stream_text(http, b), bodies))
        started: list[list[bool]] = [[] for _ in bodies]
        futures = [pool.submit(_stream_text, http, b, started[i]) for i, b in enumerate(bodies)]
        wait_for(lambda: all(started), "every stream's first tokens", timeout=120)
        busy = {w: n for w, n in _running_by_worker(stack).items() if n > 0}
        victim_id = next((w for w in busy if not w.startswith("embed")), None)
        assert victim_id, f"no CPU worker is running a stream: {busy}"
        victim = _worker_container(stack, victim_id)
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", victim))
        os.kill(pid, signal.SIGKILL)  # a crash: `docker kill` would count as a deliberate stop
        texts = [f.result(timeout=300) for f in futures]
    assert texts == undisturbed
    assert f"worker {victim_id} lost" in stack.logs("scheduler")

    def back() -> bool:
        state = stack.inspect(victim)
        return (
            state["RestartCount"] >= 1
            and state["State"]["Running"]
            and state["State"].get("Health", {}).get("Status") == "healthy"
        )

    wait_for(back, "the crashed worker's container restarted and healthy", timeout=240)
    with _client(stack) as http:
        reply = http.post("/v1/completions", json=bodies[0])
    assert reply.json()["choices"][0]["text"] == undisturbed[0]


def test_the_cpu_image_is_lean_labelled_and_not_root(stack):
    image = f"kvledger-cpu:{IMAGE_TAG}"
    info = json.loads(docker("image", "inspect", image))[0]
    labels = info["Config"]["Labels"]
    assert labels["org.opencontainers.image.title"] == "kvledger"
    assert info["Config"]["User"] == "kvledger" and info["Config"]["Healthcheck"]["Test"]
    probe = "id -u; command -v g++ cc c++ || true; ls /opt/kvledger/kernels"
    out = docker("run", "--rm", "--entrypoint", "sh", image, "-c", probe, timeout=120).split()
    assert out[0] == "1000", out
    assert not [w for w in out[1:] if w.startswith("/")], f"a compiler in the runtime image: {out}"
    # the fused/paged kernels (built for the build machine's CPU) and the portable quantized ones
    assert sorted(w.rsplit("_", 1)[0] for w in out[1:]) == [
        "kvledger_cpu_ops",
        "kvledger_quant_ops",
    ], out


def test_down_removes_every_container_network_and_volume(stack):
    assert stack.leftovers()["volumes"], "the stack made its named volumes"
    stack.down()
    deadline = time.monotonic() + 30
    while any(stack.leftovers().values()) and time.monotonic() < deadline:
        time.sleep(1)
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
