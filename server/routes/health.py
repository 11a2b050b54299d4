"""/health, /version and /metrics: what operators and probes read."""

from __future__ import annotations

import logging

import grpc
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import kvledger
from server.deps import scheduler, settings_of
from server.responses import VersionResponse

log = logging.getLogger(__name__)

public = APIRouter()
metrics_router = APIRouter()


@public.get(
    "/health",
    response_class=Response,
    responses={
        200: {
            "description": "Serving: the scheduler is up, at least one model can be served, "
            "and so can every required model (a model can be served when a worker has it "
            "and this frontend could load its tokenizer)."
        },
        503: {"description": "Not serving (no body)."},
    },
)
async def health(request: Request) -> Response:
    client = scheduler(request)
    try:
        ok = await client.is_serving()
        if ok:
            try:
                models = await client.models(refresh=True)
            except grpc.aio.AioRpcError:
                models = {}
            ok = bool(models) and all(
                name in models and models[name].info.num_workers > 0
                for name in settings_of(request).require_model
            )
    except Exception:  # a health check answers; it never fails with a 500
        log.exception("health check failed")
        ok = False
    return Response(status_code=200 if ok else 503)


@public.get("/version", response_model=VersionResponse)
async def version() -> VersionResponse:
    return VersionResponse(version=kvledger.__version__)


@metrics_router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
