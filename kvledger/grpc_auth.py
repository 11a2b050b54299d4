"""A bearer token on gRPC calls: the frontend sends it with every call, the scheduler checks it.

The scheduler's frontend-facing service (Generate, Embed, Abort, ListModels,
ResetPrefixCache) returns users' tokens, flushes every tenant's cache and shows model paths,
so only frontends holding `--frontend-auth-token` may call it. The gRPC health service stays
open for probes. Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)

HEADER = "authorization"


def bearer(token: str) -> str:
    return f"Bearer {token}"


class _Bearer:
    def __init__(self, token: str) -> None:
        self._metadata = ((HEADER, bearer(token)),)

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = tuple(details.metadata or ()) + self._metadata
        return details._replace(metadata=metadata)


class _UnaryUnaryBearer(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return await continuation(self._with_token(client_call_details), request)


class _UnaryStreamBearer(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return await continuation(self._with_token(client_call_details), request)


def bearer_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors adding the token to every unary and server-streaming call. (An aio
    channel files an interceptor under the first call kind it implements only: one each.)"""
    return [_UnaryUnaryBearer(token), _UnaryStreamBearer(token)]


class BearerServerInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to the services named by `prefix` that lack the token (UNAUTHENTICATED),
    counting each refusal through `on_refused`."""

    def __init__(self, token: str, prefix: str, on_refused: Callable[[str], None]) -> None:
        self._expected = bearer(token).encode()
        self._prefix = prefix
        self._on_refused = on_refused

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefix):
            return handler
        given = dict(details.invocation_metadata or ()).get(HEADER, "")
        if isinstance(given, str) and hmac.compare_digest(given.encode(), self._expected):
            return handler
        log.warning("call to %s refused: no valid frontend token", details.method)
        self._on_refused(details.method)
        return _refusal(handler)


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad frontend token")

    async def refuse_stream(_request: Any, context: grpc.aio.ServicerContext):  # noqa: ANN202
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad frontend token")
        yield  # pragma: no cover - abort raises

    codecs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **codecs)
    return grpc.unary_unary_rpc_method_handler(refuse, **codecs)
