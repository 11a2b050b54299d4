"""Frontends authenticate to the scheduler: the frontend API (Generate, Embed, Abort,
ListModels, ResetPrefixCache) answers only calls carrying --frontend-auth-token; the health
service stays open for probes; refusals are counted; the scheduler will not start without a
token unless told to serve anyone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import frontend_pb2, frontend_pb2_grpc
from server.client import SchedulerClient
from tests.deploy.tools import REPO
from tests.service.helpers import running_scheduler
from tests.serving import free_port

TOKEN = "frontend-s3cret"


def _refused(engine) -> float:  # noqa: ANN001
    return engine.registry.get_sample_value("kvledger_frontend_calls_refused_total") or 0.0


@pytest.mark.parametrize("metadata", [None, (("authorization", "Bearer wrong"),)])
def test_calls_without_the_token_are_refused_and_counted(metadata):
    with running_scheduler("--frontend-auth-token", TOKEN) as sched:
        stub = frontend_pb2_grpc.SchedulerStub(grpc.insecure_channel(sched.target))
        calls = [
            lambda: stub.ListModels(frontend_pb2.ListModelsRequest(), metadata=metadata),
            lambda: stub.ResetPrefixCache(
                frontend_pb2.ResetPrefixCacheRequest(), metadata=metadata
            ),
            lambda: next(
                stub.Generate(
                    frontend_pb2.GenerateRequest(request_id="r", model="m", prompt_token_ids=[1]),
                    metadata=metadata,
                )
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert _refused(sched.engine) == len(calls)
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(sched.target))
        reply = health.Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_frontend_client_sends_the_token():
    """On unary calls and on the Generate stream alike."""

    async def list_models(target: str, token: str) -> int:
        client = SchedulerClient(target, auth_token=token)
        try:
            reply = await client.stub.ListModels(frontend_pb2.ListModelsRequest(), timeout=5)
            return len(reply.models)
        finally:
            await client.close()

    async def generate(target: str, token: str) -> grpc.StatusCode:
        client = SchedulerClient(target, auth_token=token)
        request = frontend_pb2.GenerateRequest(request_id="r", model="m", prompt_token_ids=[1])
        try:
            async for _ in client.stub.Generate(request, timeout=5):
                pass
        except grpc.aio.AioRpcError as err:
            return err.code()
        finally:
            await client.close()
        return grpc.StatusCode.OK

    with running_scheduler("--frontend-auth-token", TOKEN) as sched:
        assert asyncio.run(list_models(sched.target, TOKEN)) == 0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            asyncio.run(list_models(sched.target, "not-it"))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # past the token check: no worker serves model "m"
        assert asyncio.run(generate(sched.target, TOKEN)) == grpc.StatusCode.NOT_FOUND
        assert asyncio.run(generate(sched.target, "not-it")) == grpc.StatusCode.UNAUTHENTICATED


def test_the_scheduler_refuses_to_start_without_a_frontend_token():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLEDGER_")}
    env["KVLEDGER_WORKER_AUTH_TOKEN"] = "w"
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_svc", "--grpc-port", str(free_port())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "KVLEDGER_FRONTEND_AUTH_TOKEN" in proc.stderr
    assert "--allow-unauthenticated-frontends" in proc.stderr
