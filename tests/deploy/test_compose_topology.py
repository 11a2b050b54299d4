"""The compose topology run as local processes with the compose commands and environment
(hostnames mapped to loopback): traffic to both models, then every target prometheus.yml lists
answers with kvledger metrics labelled by the workers' ids."""

from __future__ import annotations

import re
import socket

import pytest

from tests.deploy.compose import active_services
from tests.deploy.live import SHARED_PROMPT, complete, post
from tests.deploy.prom import scrape_targets
from tests.deploy.topology import start_topology
from tests.serving import metric_sum, scrape

EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def compose_model() -> str:
    """The generative model compose serves by default (the real one, from its GGUF file)."""
    return active_services()["worker"]["environment"]["KVLEDGER_SERVED_MODEL_NAME"]


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    topo = start_topology(tmp_path_factory.mktemp("topology"))
    yield topo
    topo.stop()


@pytest.fixture(scope="module")
def frontend_url(topology) -> str:
    return f"http://{topology.address('frontend', 8000)}"


def test_traffic_to_both_models(frontend_url):
    complete(frontend_url, SHARED_PROMPT, model=compose_model())
    again = complete(frontend_url, SHARED_PROMPT, model=compose_model())
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    reply = post(
        frontend_url,
        "/v1/embeddings",
        {"model": EMBEDDING_MODEL, "input": ["kv ledger", "block table"]},
    )
    assert [d["index"] for d in reply["data"]] == [0, 1]


def test_every_prometheus_target_answers(topology, frontend_url):
    scraped = 0
    for job, targets in scrape_targets().items():
        for host, port in targets:
            if (host, port) not in topology.ports:
                assert job == "worker-gpu", f"{job}: {host}:{port} is no compose service"
                continue
            samples = scrape(f"http://{topology.address(host, port)}/metrics")
            assert any(k.startswith("kvledger_") for k in samples), f"{job} {host}:{port}"
            scraped += 1
    assert scraped == len(topology.services)


def _workers_of(samples: dict[str, float], model: str) -> set[str]:
    found = set()
    for key in samples:
        if key.startswith("kvledger_kv_blocks_capacity{") and f'model="{model}"' in key:
            found.add(re.search(r'worker="([^"]+)"', key).group(1))
    return found


def test_workers_carry_their_ids(topology, frontend_url):
    """The embedding worker its compose id; the CPU worker none, so that `--scale worker=N`
    replicas differ: it names itself `<hostname>-<pid>`."""
    scheduler = scrape(f"http://{topology.address('scheduler', 9400)}/metrics")
    assert _workers_of(scheduler, EMBEDDING_MODEL) == {"embed-0"}
    [cpu] = _workers_of(scheduler, compose_model())
    assert re.fullmatch(rf"{re.escape(socket.gethostname())}-\d+", cpu), cpu
    worker = scrape(f"http://{topology.address('worker', 9401)}/metrics")
    assert metric_sum(worker, "kvledger_worker_step_seconds_count", worker=cpu) > 0
