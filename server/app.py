"""The FastAPI frontend: builds the app from its routers (one per endpoint family, in
server/routes/), its middleware, error handlers and lifespan. No route lives here."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Security
from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import kvledger
from kvledger.config.frontend import Settings
from kvledger.log import REQUEST_ID
from kvledger.tls import files_of
from server.anthropic.replies import anthropic_error_responses
from server.body_screen import BodyScreen
from server.client import SchedulerClient
from server.deps import bearer, tenant, x_api_key
from server.errors import error_responses, install_error_handlers
from server.grammar_sandbox import close_sandbox
from server.limits import BodyDeadline, BodySizeLimit
from server.offload import tokenize_slots
from server.responses_api.store import store_for
from server.routes import (
    chat,
    completions,
    embeddings,
    health,
    messages,
    models,
    rerank,
    responses,
    tokenize,
)

__all__ = ["Settings", "build_app"]

# Routers whose every route needs the API key (when the server has keys).
GUARDED: tuple[APIRouter, ...] = (
    completions.router,
    chat.router,
    responses.router,
    embeddings.router,
    rerank.router,
    models.router,
    tokenize.router,
)


def build_app(settings: Settings) -> FastAPI:
    registry = CollectorRegistry()
    http_requests = Counter(
        "kvledger_http_requests_total",
        "HTTP requests by route and status",
        ["route", "status"],
        registry=registry,
    )
    # The header deadline is the server's (server/connections.py, which __main__ hands this
    # counter); the body deadline is counted by the app's 408s and the server's backstop.
    request_timeouts = Counter(
        "kvledger_http_request_timeouts_total",
        "requests refused, and their connections closed, because their headers (phase=header) "
        "or body (phase=body) did not arrive within --timeout-request-header/-body",
        ["phase"],
        registry=registry,
    )
    for phase in ("header", "body"):
        request_timeouts.labels(phase)  # exported at 0 from the start
    resumptions = Counter(
        "kvledger_request_resumptions_total",
        "live requests whose link to the scheduler broke: re-submitted as continuations and "
        "admitted (outcome=resumed), or failed past --scheduler-reconnect-timeout (gave_up)",
        ["outcome"],
        registry=registry,
    )
    for outcome in ("resumed", "gave_up"):
        resumptions.labels(outcome)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.scheduler = SchedulerClient(
            settings.scheduler,
            tuple(settings.require_model),
            settings.chat_template,
            settings.frontend_auth_token,
            settings.scheduler_reconnect_timeout,
            resumptions,
            files_of(settings),
        )
        app.state.body_screen.start()
        yield
        app.state.body_screen.close()
        if app.state.responses_store is not None:
            app.state.responses_store.close()
        await app.state.scheduler.close()
        close_sandbox()  # its children would exit at the end of their stdin anyway

    app = FastAPI(title="kvledger", version=kvledger.__version__, lifespan=lifespan)
    app.state.settings = settings
    app.state.registry = registry
    app.state.request_timeouts = request_timeouts
    app.state.tokenize_slots = tokenize_slots()
    app.state.body_screen = BodyScreen()
    stored = settings.responses
    app.state.responses_store = store_for(
        stored.responses_store, stored.responses_retention, stored.responses_store_bytes
    )
    install_error_handlers(app)
    _document_errors_truthfully(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.limits.max_request_body_bytes)
    if settings.limits.timeout_request_body > 0:
        app.add_middleware(
            BodyDeadline, seconds=settings.limits.timeout_request_body, timeouts=request_timeouts
        )
    app.add_middleware(RequestCounter, counter=http_requests)
    app.add_middleware(RequestId)  # outermost: even a refused body is logged with its id

    # Auth is a dependency of the routers that need it; the bearer scheme (declared only when
    # the server has keys) puts it in the OpenAPI schema, with the 401 it answers.
    keyed = bool(settings.api_keys)
    guard = [Security(bearer), Depends(tenant)] if keyed else []
    key_errors = error_responses(401) if keyed else {}
    app.include_router(health.public)
    if settings.metrics_public:
        app.include_router(health.metrics_router)
    else:
        app.include_router(health.metrics_router, dependencies=guard, responses=key_errors)
    for router in GUARDED:
        app.include_router(router, dependencies=guard, responses=key_errors)
    # Anthropic's clients send the key as `x-api-key` (accepted on every route: deps.tenant),
    # and read errors only in Anthropic's shape.
    anthropic_guard = [Security(bearer), Security(x_api_key), Depends(tenant)] if keyed else []
    anthropic_key_errors = anthropic_error_responses(401) if keyed else {}
    app.include_router(
        messages.router, dependencies=anthropic_guard, responses=anthropic_key_errors
    )
    return app


def _document_errors_truthfully(app: FastAPI) -> None:
    """FastAPI documents a 422 for every route with a body; this server answers every
    validation error with a 400 in OpenAI's shape (declared on each route), never a 422."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class RequestCounter:
    """Pure ASGI (not BaseHTTPMiddleware, which hides client disconnects from endpoints)."""

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            self.counter.labels(getattr(route, "path", "unmatched"), str(status["code"])).inc()


class RequestId:
    """Pure ASGI: each HTTP request gets an id, sent back as `X-Request-Id`, set as the log
    context (`kvledger.log.REQUEST_ID`) of everything that handles it, and used in the ids of
    the completions it creates, so the scheduler's and workers' lines about it share it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                message["headers"] = [*headers, (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
