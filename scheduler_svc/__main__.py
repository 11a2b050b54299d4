"""`python -m scheduler_svc`: the scheduler service (gRPC for frontends and workers, /metrics)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvledger.config.scheduler import SchedulerSettings
from kvledger.flags import SCHEDULER, config_for, parse
from kvledger.grpc_auth import BearerServerInterceptor
from kvledger.log import setup_logging
from kvledger.metrics_http import start_metrics_server
from kvledger.rpc import SERVER_OPTIONS
from kvledger.tls import add_port, checked, plaintext_warning
from protos import frontend_pb2_grpc, worker_pb2_grpc
from scheduler_svc.engine import Engine
from scheduler_svc.service import SchedulerServicer, WorkerLinkServicer

log = logging.getLogger("scheduler_svc")
FRONTEND_SERVICE = "/kvledger.frontend.Scheduler/"


async def start(
    args: argparse.Namespace | SchedulerSettings, metrics: bool = True
) -> tuple[grpc.aio.Server, Engine, health.aio.HealthServicer]:
    """Starts the gRPC server (and the metrics endpoint); returns once it accepts calls.
    `args`: the parsed flags, or the settings built from them."""
    settings = config_for(SCHEDULER, args) if isinstance(args, argparse.Namespace) else args
    engine = Engine(settings.engine)
    if metrics:
        start_metrics_server(
            settings.metrics_port, addr=settings.metrics_host, registry=engine.registry
        )

    interceptors = []
    if settings.frontend_auth_token:
        refused = engine.link_metrics.frontend_calls_refused
        interceptors.append(
            BearerServerInterceptor(
                settings.frontend_auth_token, FRONTEND_SERVICE, lambda method: refused.inc()
            )
        )
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
    frontend_pb2_grpc.add_SchedulerServicer_to_server(SchedulerServicer(engine), server)
    worker_pb2_grpc.add_WorkerLinkServicer_to_server(
        WorkerLinkServicer(engine, settings.worker_auth_token), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    tls = checked(settings, server=True, service="scheduler")
    try:
        bound = add_port(server, address, tls)
    except RuntimeError as err:  # grpc raises where it once returned 0
        raise SystemExit(f"cannot bind the scheduler's gRPC port at {address}: {err}") from None
    if bound == 0:
        raise SystemExit(f"cannot bind the scheduler's gRPC port at {address}")
    if (
        warning := plaintext_warning(settings.grpc_host, tls, settings.worker_auth_token)
    ) is not None:
        log.warning("INSECURE: %s", warning)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "scheduler listening on %s (gRPC%s), metrics on :%d",
        address,
        ", TLS" + (", clients need a certificate" if tls.ca else "") if tls.enabled else "",
        settings.metrics_port,
    )
    return server, engine, health_servicer


async def serve(settings: SchedulerSettings) -> None:
    server, _engine, health_servicer = await start(settings)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("scheduler stopping")
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal changes nothing
        loop.add_signal_handler(sig, lambda: log.info("scheduler: already stopping"))
    await health_servicer.enter_graceful_shutdown()
    # Open streams (frontends, workers) get the grace period, then are cancelled.
    await server.stop(grace=settings.shutdown_timeout)


def check_worker_auth(args: argparse.Namespace | SchedulerSettings) -> None:
    """Workers receive users' prompts and choose their output tokens: a scheduler that accepts
    any process reaching its gRPC port as a worker hands both to whoever asks. It therefore
    needs a worker token, unless told otherwise, and then says so loudly."""
    if args.worker_auth_token:
        return
    if not args.allow_unauthenticated_workers:
        raise SystemExit(
            "scheduler: no worker token. Set KVLEDGER_WORKER_AUTH_TOKEN (or "
            "--worker-auth-token) here and on every worker, or pass "
            "--allow-unauthenticated-workers to accept any process that reaches the gRPC port "
            "as a worker (it would receive users' prompts)."
        )
    log.warning(
        "UNAUTHENTICATED WORKERS ALLOWED: any process that reaches %s:%d can register as a "
        "worker, read users' prompts and choose their output tokens",
        args.grpc_host,
        args.grpc_port,
    )


def check_frontend_auth(args: argparse.Namespace | SchedulerSettings) -> None:
    """The frontend API returns users' tokens and flushes every tenant's cache: like workers,
    frontends need a token, unless told otherwise, and then it is said loudly."""
    if args.frontend_auth_token:
        return
    if not args.allow_unauthenticated_frontends:
        raise SystemExit(
            "scheduler: no frontend token. Set KVLEDGER_FRONTEND_AUTH_TOKEN (or "
            "--frontend-auth-token) here and on every frontend, or pass "
            "--allow-unauthenticated-frontends to serve the frontend API to any caller."
        )
    log.warning(
        "UNAUTHENTICATED FRONTENDS ALLOWED: any process that reaches %s:%d can generate, list "
        "models and reset every tenant's prefix cache",
        args.grpc_host,
        args.grpc_port,
    )


def main(argv: Sequence[str] | None = None) -> None:
    prometheus_client.disable_created_metrics()  # *_created series only add noise here
    args = parse(SCHEDULER, argv, "kvledger scheduler service: owns every block table")
    settings: SchedulerSettings = config_for(SCHEDULER, args)
    setup_logging("scheduler", settings.log_level, settings.log_format)
    check_worker_auth(settings)
    check_frontend_auth(settings)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main(sys.argv[1:])
