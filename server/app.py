"""The FastAPI frontend: OpenAI-compatible routes over the scheduler's gRPC service."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import numpy as np
from fastapi import Depends, FastAPI, Request, Security
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import kvledger
from protos import frontend_pb2
from server.client import SchedulerClient, ServedModel
from server.completions import (
    Completion,
    build_completion,
    echo_prefix,
    merged,
    run_choice,
    stream_text,
    tokenize_prompts,
)
from server.errors import APIError, error_responses, from_grpc, install_error_handlers
from server.limits import BodySizeLimit, Limits
from server.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionStreamEvent,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    VersionResponse,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
DISCONNECT_POLL_SECONDS = 0.05


@dataclass
class Settings:
    scheduler: str = "127.0.0.1:50051"
    api_keys: list[str] = field(default_factory=list)
    require_models: list[str] = field(default_factory=list)
    metrics_public: bool = False
    limits: Limits = field(default_factory=Limits)


def _tenant_salt(tenant: str, cache_salt: str | None) -> str:
    """Namespaces the prefix cache per API key: no client can borrow another tenant's salt."""
    if not tenant and not cache_salt:
        return ""
    return hashlib.sha256(f"{tenant}\0{cache_salt or ''}".encode()).hexdigest()


def build_app(settings: Settings) -> FastAPI:
    client_box: dict[str, SchedulerClient] = {}
    registry = CollectorRegistry()
    http_requests = Counter(
        "kvledger_http_requests_total",
        "HTTP requests by route and status",
        ["route", "status"],
        registry=registry,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        client_box["c"] = SchedulerClient(settings.scheduler, tuple(settings.require_models))
        yield
        await client_box["c"].close()

    app = FastAPI(title="kvledger", version=kvledger.__version__, lifespan=lifespan)
    install_error_handlers(app)
    _document_errors_truthfully(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.limits.max_request_body_bytes)

    def client() -> SchedulerClient:
        return client_box["c"]

    app.add_middleware(RequestCounter, counter=http_requests)

    # Declares the bearer scheme in the OpenAPI schema; `tenant` checks the key itself.
    bearer = HTTPBearer(auto_error=False, scheme_name="apiKey", description="an --api-key")
    secured = [Security(bearer)] if settings.api_keys else []
    key_errors = (401,) if settings.api_keys else ()

    def tenant(request: Request) -> str:
        """The API key's tenant ('' when the server is open); 401 for a missing or wrong key."""
        if not settings.api_keys:
            return ""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer":
            matches = [hmac.compare_digest(token.encode(), k.encode()) for k in settings.api_keys]
            if any(matches):
                return hashlib.sha256(token.encode()).hexdigest()[:16]
        raise APIError(401, "Incorrect or missing API key.", code="invalid_api_key")

    async def model_for(name: str) -> ServedModel:
        try:
            return await client().model(name)
        except grpc.aio.AioRpcError as err:
            raise from_grpc(err) from None

    @app.get(
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
    async def health() -> Response:
        try:
            ok = await client().is_serving()
            if ok:
                try:
                    models = await client().models(refresh=True)
                except grpc.aio.AioRpcError:
                    models = {}
                ok = bool(models) and all(
                    name in models and models[name].info.num_workers > 0
                    for name in settings.require_models
                )
        except Exception:  # a health check answers; it never fails with a 500
            log.exception("health check failed")
            ok = False
        return Response(status_code=200 if ok else 503)

    @app.get("/version", response_model=None, responses={200: {"model": VersionResponse}})
    async def version() -> dict:
        return {"version": kvledger.__version__}

    metrics_guard = [] if settings.metrics_public else [*secured, Depends(tenant)]

    @app.get(
        "/metrics",
        dependencies=metrics_guard,
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text exposition format.",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **error_responses(*(() if settings.metrics_public else key_errors)),
        },
    )
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/v1/models",
        response_model=None,
        dependencies=[*secured, Depends(tenant)],
        responses={200: {"model": ModelList}, **error_responses(*key_errors, 503)},
    )
    async def list_models() -> dict:
        try:
            models = await client().models(refresh=True)
        except grpc.aio.AioRpcError as err:
            raise from_grpc(err) from None
        return {
            "object": "list",
            "data": [
                {
                    "id": m.name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "kvledger",
                    "max_model_len": m.info.max_model_len,
                }
                for m in models.values()
            ],
        }

    @app.post(
        "/tokenize",
        response_model=None,
        dependencies=[*secured, Depends(tenant)],
        responses={
            200: {"model": TokenizeResponse},
            **error_responses(400, *key_errors, 404, 413, 503),
        },
    )
    async def tokenize(body: TokenizeRequest) -> dict:
        model = await model_for(body.model)
        encoding = await asyncio.to_thread(
            model.tokenizer.encode, body.prompt, add_special_tokens=body.add_special_tokens
        )
        ids = encoding.ids
        return {"tokens": ids, "count": len(ids), "max_model_len": model.info.max_model_len}

    @app.post(
        "/detokenize",
        response_model=None,
        dependencies=[*secured, Depends(tenant)],
        responses={
            200: {"model": DetokenizeResponse},
            **error_responses(400, *key_errors, 404, 413, 503),
        },
    )
    async def detokenize(body: DetokenizeRequest) -> dict:
        model = await model_for(body.model)
        vocab = model.info.vocab_size
        if any(t >= vocab for t in body.tokens):
            raise APIError(
                400, f"token ids must be below the vocabulary size {vocab}", param="tokens"
            )
        return {"prompt": model.tokenizer.decode(body.tokens)}

    @app.post(
        "/v1/completions",
        dependencies=secured,
        responses={
            200: {
                "model": CompletionResponse,
                "description": "The completion; with `stream`, server-sent events.",
                "content": {
                    "text/event-stream": {
                        "schema": CompletionStreamEvent.model_json_schema(),
                    }
                },
            },
            **error_responses(400, *key_errors, 404, 413, 429, 500, 503),
        },
    )
    async def completions(
        body: CompletionRequest, request: Request, who: str = Depends(tenant)
    ) -> Response:
        model = await model_for(body.model)
        # Off the event loop: a long prompt takes ~4 ms per 1,000 tokens to tokenize, and the
        # loop meanwhile streams every other request's tokens (benchmarks/frontend_loop.py).
        completion = await asyncio.to_thread(
            build_completion, body, model, _tenant_salt(who, body.cache_salt), settings.limits
        )
        events = merged(
            [run_choice(client().stub, completion, c) for c in completion.choices],
            completion.choices,
        )
        if body.stream:
            return await _streaming_response(request, completion, events)
        await _until_disconnect(request, _drain(events))
        return JSONResponse(_completion_body(completion))

    @app.post(
        "/v1/embeddings",
        response_model=None,
        dependencies=secured,
        responses={
            200: {"model": EmbeddingResponse},
            **error_responses(400, *key_errors, 404, 413, 429, 500, 503),
        },
    )
    async def embeddings(
        body: EmbeddingRequest, request: Request, who: str = Depends(tenant)
    ) -> dict:
        del who
        model = await model_for(body.model)  # decoders embed too (last-token pooling)
        inputs = await asyncio.to_thread(tokenize_prompts, body.input, model, param="input")
        width = model.info.embedding_size
        if body.dimensions is not None and width and body.dimensions > width:
            raise APIError(
                400,
                f"dimensions must be at most {width} for model `{model.name}`",
                param="dimensions",
            )
        if len(inputs) > settings.limits.max_embedding_inputs:
            raise APIError(
                400,
                f"at most {settings.limits.max_embedding_inputs} inputs per request",
                param="input",
            )
        too_long = next((len(i) for i in inputs if len(i) > model.info.max_model_len), None)
        if too_long is not None:
            raise APIError(
                400,
                f"This model's maximum context length is "
                f"{model.info.max_model_len} tokens. However, you requested "
                f"{too_long} tokens in the input for embedding generation. Please "
                "reduce the length of the input.",
                param="input",
                code="context_length_exceeded",
            )
        req = frontend_pb2.EmbedRequest(
            request_id=f"embd-{uuid.uuid4().hex}",
            model=model.name,
            normalize=True,
            dimensions=body.dimensions or 0,
            inputs=[frontend_pb2.TokenIds(ids=ids) for ids in inputs],
        )
        try:
            reply = await _until_disconnect(request, client().stub.Embed(req))
        except grpc.aio.AioRpcError as err:
            raise from_grpc(err) from None
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": _encode_embedding(list(e.values), body.encoding_format),
            }
            for i, e in enumerate(reply.embeddings)
        ]
        return {
            "object": "list",
            "data": data,
            "model": model.name,
            "usage": {
                "prompt_tokens": reply.num_prompt_tokens,
                "total_tokens": reply.num_prompt_tokens,
            },
        }

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


def _encode_embedding(values: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()
    return values


async def _drain(events: AsyncIterator[Completion | object]) -> None:
    async for _ in events:
        pass


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Runs work; a client that goes away cancels it (which aborts its requests).

    Whatever way this returns, the work has finished: a cancelled task is waited for, so
    that it has left (and cleaned up) any generator it was running before the caller goes
    on, perhaps to close that generator."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                await _cancel_and_wait(task)
                raise APIError(499, "client disconnected")
    finally:
        if not task.done():
            await _cancel_and_wait(task)


async def _cancel_and_wait(task: asyncio.Future) -> None:
    """Cancels the task and waits until it is done; its outcome is dropped (asyncio.wait
    never raises it), while a cancellation of the caller itself still propagates."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: a failure while it was being cancelled is not logged


def _choice_body(index: int, text: str, finish: str | None, logprobs: dict | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def _completion_body(completion: Completion) -> dict:
    choices = [
        _choice_body(
            c.index,
            echo_prefix(completion, c) + c.text,
            c.finish_reason,
            c.logprobs.body() if c.logprobs is not None else None,
        )
        for c in completion.choices
    ]
    return {
        "id": completion.id,
        "object": "text_completion",
        "created": completion.created,
        "model": completion.model.name,
        "choices": choices,
        "usage": completion.usage(),
    }


async def _streaming_response(
    request: Request, completion: Completion, events: AsyncIterator
) -> Response:
    # Wait for the first event so that errors (bad prompt, no worker) still get a status code,
    # while noticing a client that leaves before it (queued, or in a long prefill).
    try:
        first = await _until_disconnect(request, anext(events))
    except StopAsyncIteration:
        first = None
    except BaseException:
        await events.aclose()
        raise
    include_usage = bool(
        completion.body.stream_options and completion.body.stream_options.include_usage
    )
    holdback = max(completion.max_stop_len - 1, 0)

    def chunk(choices: list[dict], usage: dict | None = None) -> str:
        body = {
            "id": completion.id,
            "object": "text_completion",
            "created": completion.created,
            "model": completion.model.name,
            "choices": choices,
        }
        if include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    def render(choice) -> str | None:  # noqa: ANN001
        if choice.closed:  # its final chunk went out; later queue entries add nothing
            return None
        text = stream_text(choice, holdback)
        if completion.body.echo and not choice.echoed:
            text = echo_prefix(completion, choice) + text
            choice.echoed = True
        if not text and choice.finish_reason is None:
            return None
        final = choice.finish_reason is not None
        logprobs = None
        if choice.logprobs is not None:
            logprobs = choice.logprobs.take_sent(choice.sent, final)
        choice.closed = final
        return chunk([_choice_body(choice.index, text, choice.finish_reason, logprobs)])

    async def sse() -> AsyncIterator[str]:
        try:
            if first is not None:
                if (out := render(first)) is not None:
                    yield out
                async for choice in events:
                    if (out := render(choice)) is not None:
                        yield out
            if include_usage:
                yield chunk([], completion.usage())
        except APIError as err:
            yield f"data: {json.dumps(err.body())}\n\n"
        finally:
            await events.aclose()
        yield "data: [DONE]\n\n"

    return StreamingResponse(
        sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
