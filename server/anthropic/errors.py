"""Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`, for every answer
under /v1/messages: its clients read no other (the `anthropic` client raises the error class of
the status with this body's message). A leaf module: server/errors.py picks the shape by path.

The statuses are the OpenAI routes' (400 bad input, 401, 404, 413, 429, 503, ...); only the
body differs. Types follow Anthropic's list: a client error with no type of its own (408, 413,
a 499 no client reads) is an `invalid_request_error`; a 503 (no worker, no scheduler) is
`overloaded_error`, Anthropic's name for "try again later"; any other server error `api_error`."""

from __future__ import annotations

PREFIX = "/v1/messages"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_anthropic(path: str) -> bool:
    """`/v1/messages` and every path below it (not `/v1/messagesx`)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}
