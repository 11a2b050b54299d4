"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}; under Anthropic's
/v1/messages every error, an unserved path's 404 included, in Anthropic's shape
(server/anthropic/errors.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from server.anthropic.errors import error_body, is_anthropic

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = "1"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}

GRPC_TO_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.ALREADY_EXISTS: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.CANCELLED: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 503,
}


class APIError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": error_type(self.status),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: Mapping[str, str] | None = None, path: str = "") -> JSONResponse:
        """In OpenAI's shape; under /v1/messages (`path`) in Anthropic's, the only one its
        clients read (server/anthropic/errors.py)."""
        merged = dict(headers or {})
        if self.status in (429, 503):
            merged["Retry-After"] = RETRY_AFTER_SECONDS
        body = error_body(self.status, self.message) if is_anthropic(path) else self.body()
        return JSONResponse(body, status_code=self.status, headers=merged or None)


def error_type(status: int) -> str:
    """OpenAI's error type for a status; any other client error is an invalid request."""
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error, whatever its status: OpenAI's shape."""

    error: ErrorDetail


_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "required": True,
        "schema": {"type": "string"},
    }
}
_ERROR_DESCRIPTIONS = {
    400: "Invalid request: a malformed body, or a value out of range.",
    401: "Missing or wrong API key.",
    404: "Unknown model.",
    413: "Request body too large.",
    429: "The scheduler's queue is full.",
    500: "The worker failed the request.",
    503: "No worker serves the model, or the scheduler is unavailable.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for a route's error statuses (FastAPI's `responses=`)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {
            "model": ErrorResponse,
            "description": _ERROR_DESCRIPTIONS[status],
        }
        if status in (429, 503):
            entry["headers"] = _RETRY_AFTER
        responses[status] = entry
    return responses


def scheduler_unreachable(err: grpc.aio.AioRpcError) -> bool:
    """The call failed because the scheduler could not be reached (the transport's
    UNAVAILABLE), not by the scheduler's own answer ("no worker for model ... is up")."""
    return err.code() == grpc.StatusCode.UNAVAILABLE and "no worker" not in (err.details() or "")


def from_grpc(err: grpc.aio.AioRpcError) -> APIError:
    code = err.code()
    status = GRPC_TO_HTTP.get(code, 500)
    details = err.details() or code.name
    if scheduler_unreachable(err):
        # gRPC's details name the scheduler's address and the transport's error: for the log,
        # not for clients
        log.warning("scheduler unavailable: %s", details)
        details = "the scheduler is unavailable; retry later"
    elif status >= 500 and code != grpc.StatusCode.UNAVAILABLE:
        log.warning("scheduler error %s: %s", code.name, details)
        details = "internal error in the scheduler"
    return APIError(status, details)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        # Its loc is ("body", <character offset>): a position, not a parameter.
        position = first.get("loc", ("body", 0))[-1]
        reason = first.get("ctx", {}).get("error", "invalid JSON")
        return f"The request body is not valid JSON: {reason} (character {position}).", None
    loc = list(first.get("loc", ()))
    if loc and loc[0] in ("body", "query", "path"):  # where it came, not the field's name
        loc = loc[1:]
    loc = [str(p) for p in loc if not _union_tag(p)]
    param = ".".join(loc) or None
    msg = _telling(exc.errors(), first).get("msg", "invalid request")
    return (f"{param}: {msg}" if param else msg), param


# A union member whose shape the value does not have says only "not this type": the error
# from a member the value does fit (a list of token ids holding -1) says what is wrong.
_SHAPE_MISMATCH = {"string_type", "list_type", "dict_type", "model_type"}


def _telling(errors: list[dict[str, Any]], first: dict[str, Any]) -> dict[str, Any]:
    """Among the errors of the first error's field, the one that says most."""
    field = first.get("loc", ())[:2]
    same = [e for e in errors if e.get("loc", ())[:2] == field]
    return next((e for e in same if e.get("type") not in _SHAPE_MISMATCH), first)


_TYPE_NAMES = {"str", "int", "float", "bool", "bytes", "list", "dict", "none"}


def _union_tag(part: object) -> bool:
    """pydantic names the member of a union an error came from in its loc (`prompt.str`,
    `prompt.list[constrained-int]`): a type, not a parameter the client sent."""
    if not isinstance(part, str):
        return False
    return part in _TYPE_NAMES or not part.isidentifier()


# What an unmatched path's 404 lists (an OpenAI route kvledger does not serve, such as
# /v1/audio/speech, is named as such rather than a bare "Not Found").
SERVED_ROUTES = (
    "served: /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages, "
    "/v1/messages/count_tokens, "
    "/v1/embeddings, /rerank, /v1/rerank, /v2/rerank, /score, /v1/score, /v1/models, "
    "/tokenize, /detokenize, /tokenizer_info, /health, /version, /metrics"
)


def unserved_route(path: str) -> JSONResponse:
    """The 404 of a path no route matches, naming it and what is served. Under /v1/messages
    it comes in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`), so
    that the `anthropic` client raises its NotFoundError with the message rather than
    failing to read the body; elsewhere in OpenAI's."""
    message = f"{path} is not served by this server ({SERVED_ROUTES})"
    return APIError(404, message).response(path=path)


METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> str:
    """Every method some route serves at the request's path (one path may have several
    routes: GET and DELETE /v1/responses/{id}). Asked of each route by `matches`, its public
    test, since app.routes may hold included routers rather than their routes."""
    scope = request.scope
    allowed = [
        method
        for method in METHODS
        if any(r.matches({**scope, "method": method})[0] == Match.FULL for r in request.app.routes)
    ]
    return ", ".join(allowed)


def install_error_handlers(app: FastAPI) -> None:
    """Every error answered in the shape of the API its path belongs to (APIError.response)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param=param).response(path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Keeps the exception's headers: a 405 must say which methods are allowed (`Allow`).
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":  # no route matched
            return unserved_route(request.url.path)
        error = APIError(exc.status_code, message)
        headers = exc.headers
        if exc.status_code == 405:  # Starlette's names the first route's methods only
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return error.response(headers=headers, path=request.url.path)

    @app.exception_handler(grpc.aio.AioRpcError)
    async def _grpc(request: Request, exc: grpc.aio.AioRpcError) -> JSONResponse:
        return from_grpc(exc).response(path=request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, but still an answer in OpenAI's shape (Starlette's default is plain text);
        # Starlette re-raises the exception after this response, so its traceback is logged.
        error = APIError(500, "The server had an error while processing your request.")
        return error.response(path=request.url.path)
