"""The scheduler's gRPC links over TLS, with certificates made at test time: a worker and a
frontend that trust the scheduler's CA are served; a worker that trusts another CA, or (with
mutual TLS) presents no certificate or one of another CA, never registers."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvledger.rpc import CHANNEL_OPTIONS
from kvledger.tls import TlsFiles, channel
from protos import frontend_pb2, frontend_pb2_grpc
from server.client import SchedulerClient
from tests.certs import CA
from tests.service.helpers import Worker, expected_tokens, running_scheduler, wait_for
from tests.serving import free_port
from worker.link import client as link_client


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other = CA(d, "ca"), CA(d, "other-ca")
    return dict(
        ca=ca.pem,
        other=other.pem,
        server=ca.issue("scheduler", server=True),
        client=ca.issue("worker", server=False),
        stranger=other.issue("stranger", server=False),
    )


def tls_flags(pki, mutual: bool) -> list[str]:  # noqa: ANN001
    flags = ["--grpc-tls-cert", pki["server"].cert, "--grpc-tls-key", pki["server"].key]
    return flags + (["--grpc-tls-ca", pki["ca"]] if mutual else [])


def generate_over(target: str, tls: TlsFiles, prompt: list[int], max_tokens: int) -> list[int]:
    with channel(target, tls, CHANNEL_OPTIONS) as ch:
        request = frontend_pb2.GenerateRequest(
            request_id="r1",
            model="m",
            prompt_token_ids=prompt,
            stop=frontend_pb2.StopCriteria(max_tokens=max_tokens, ignore_eos=True),
        )
        replies = frontend_pb2_grpc.SchedulerStub(ch).Generate(request, timeout=30)
        return [t for r in replies for t in r.token_ids]


def never_registers(scheduler, tls: TlsFiles, seconds: float = 2.0) -> bool:  # noqa: ANN001
    worker = Worker(scheduler.target, "w-refused", tls=tls)
    try:
        time.sleep(seconds)
        return not scheduler.engine.links
    finally:
        worker.stop()


def test_a_tls_scheduler_serves_workers_and_frontends_that_trust_its_ca(pki):
    with running_scheduler(*tls_flags(pki, mutual=False)) as scheduler:
        worker = Worker(scheduler.target, "w0", tls=TlsFiles(ca=pki["ca"]))
        try:
            wait_for(lambda: scheduler.engine.links)
            tls = TlsFiles(ca=pki["ca"])
            assert generate_over(scheduler.target, tls, [1, 2, 3], 4) == expected_tokens(3, 4)

            async def listed() -> set[str]:
                client = SchedulerClient(scheduler.target, tls=tls)
                try:
                    models = await client.models()
                    # the stand-in's /nonexistent tokenizer makes it unloadable, yet listed
                    return set(models) | set(client.unloadable)
                finally:
                    await client.close()

            assert asyncio.run(listed()) == {"m"}  # the frontend's aio channel, over TLS
        finally:
            worker.stop()


def test_a_worker_trusting_another_ca_or_none_is_never_served_and_says_why(
    pki, monkeypatch, caplog
):
    monkeypatch.setattr(link_client, "NOT_READY_WARN_SECONDS", 0.5)
    with running_scheduler(*tls_flags(pki, mutual=False)) as scheduler:
        assert never_registers(scheduler, TlsFiles(ca=pki["other"]))
        assert "do --grpc-tls-ca and the scheduler's certificate match" in caplog.text
        assert never_registers(scheduler, TlsFiles())  # plaintext to a TLS port
        assert "does it serve plaintext" in caplog.text


def test_mutual_tls_refuses_workers_without_a_certificate_of_its_ca(pki):
    with running_scheduler(*tls_flags(pki, mutual=True)) as scheduler:
        assert never_registers(scheduler, TlsFiles(ca=pki["ca"]))
        stranger = pki["stranger"]
        assert never_registers(scheduler, TlsFiles(stranger.cert, stranger.key, pki["ca"]))
        client = pki["client"]
        worker = Worker(scheduler.target, "w0", tls=TlsFiles(client.cert, client.key, pki["ca"]))
        try:
            wait_for(lambda: scheduler.engine.links)
        finally:
            worker.stop()


def test_a_worker_waiting_for_an_unreachable_scheduler_stops_at_once():
    worker = Worker(f"127.0.0.1:{free_port()}", "w-alone")  # nothing listens there
    time.sleep(0.5)
    started = time.monotonic()
    worker.stop()
    assert not worker.thread.is_alive()
    assert time.monotonic() - started < 1.5
