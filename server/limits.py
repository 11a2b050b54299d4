"""Request limits, checked before any model work (their values: `Limits`,
kvledger/config/frontend.py)."""

from __future__ import annotations

import asyncio

from prometheus_client import Counter
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvledger.config.frontend import Limits
from server.errors import APIError
from server.protocol import SamplingRequest


def check_sampling_limits(body: SamplingRequest, limits: Limits, num_prompts: int) -> None:
    """n, prompts x n and stop strings within this server's limits (`prompt` for completions'
    list of prompts; chat has one)."""
    if num_prompts > limits.max_prompts_per_request:
        raise APIError(
            400, f"at most {limits.max_prompts_per_request} prompts per request", param="prompt"
        )
    if body.n > limits.max_n:
        raise APIError(400, f"n must be at most {limits.max_n}", param="n")
    if num_prompts * body.n > limits.max_prompts_per_request:
        raise APIError(
            400, f"prompts x n must be at most {limits.max_prompts_per_request}", param="n"
        )
    stops = body.stop_strings
    if len(stops) > limits.max_stop_strings:
        raise APIError(400, f"at most {limits.max_stop_strings} stop strings", param="stop")
    if any(not s or len(s) > limits.max_stop_string_length for s in stops):
        raise APIError(
            400,
            f"stop strings must be 1 to {limits.max_stop_string_length} characters long",
            param="stop",
        )


class BodySizeLimit:
    """ASGI middleware: 413 for a body over the limit, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = APIError(413, f"the request body is larger than {self.max_bytes} bytes")
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await too_big.response(path=scope.get("path", ""))(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # An HTTPException passes through FastAPI's body parsing as itself.
                    raise HTTPException(413, too_big.message)
            return message

        await self.app(scope, limited, send)


def body_timeout_message(seconds: float) -> str:
    return f"the request body did not arrive within {seconds:g} s of its headers"


class BodyDeadline:
    """ASGI middleware: a request body still arriving `seconds` after the app got the request
    (its headers) is refused with a 408 in OpenAI's shape and `Connection: close`, which has
    the server close the connection once the 408 is sent. FastAPI reads a body before it
    starts any response, so the 408 always has a response to be. Once the body is in, the
    app's later `receive` (waiting for the client to leave) is not timed. A body the app
    never reads is the server's to time out (`server.connections`)."""

    def __init__(self, app: ASGIApp, seconds: float, timeouts: Counter | None = None) -> None:
        self.app = app
        self.seconds = seconds
        self.timeouts = timeouts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.seconds
        body_done = False

        async def timed() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                if self.timeouts is not None:
                    self.timeouts.labels("body").inc()
                # An HTTPException passes through FastAPI's body parsing as itself.
                raise HTTPException(
                    408, body_timeout_message(self.seconds), headers={"Connection": "close"}
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        await self.app(scope, timed, send)
