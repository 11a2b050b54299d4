"""Request bodies parsed and validated off the event loop.

FastAPI parses a JSON body and validates it against the route's model on the event loop,
which meanwhile streams every other request's tokens: a few large chat bodies of many empty
messages froze every stream for seconds (docs/performance.md, "Frontend under large
requests"). A route of this class reads the body, then parses and validates it in a thread
(server/offload.py: a bounded number at once) before FastAPI sees it, and hands FastAPI the
validated model, which pydantic takes as it is (an instance of the model is not validated
again). A large body is screened in a child process before that (server/body_screen.py), so
that no parse of it holds the GIL for long. Errors are FastAPI's own: RequestValidationError
with the same `loc`, `type` and `msg`, so clients get the same 400s (server/errors.py)."""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from kvledger.config.frontend import Limits
from server.body_screen import SCREEN_BYTES, screen
from server.errors import APIError
from server.offload import off_loop


class OffLoopBodyRoute(APIRoute):
    """An APIRoute whose JSON body (a pydantic model) is parsed and validated in a thread."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = _body_model(self)
        if model is None:
            return handler

        async def parse_then_handle(request: Request) -> Response:
            raw = await request.body()
            if raw and _is_json(request):
                # Starlette's Request.json() returns what is stored here; FastAPI calls it.
                limits = request.app.state.settings.limits
                request._json = await parsed_off_loop(request, model, raw, limits)
            return await handler(request)

        return parse_then_handle


def parsed(model: type[BaseModel], raw: bytes, limits: Limits) -> Any:
    """The body as a validated model, or FastAPI's RequestValidationError for it. It is
    screened (server/body_screen.py: its lists counted, its values bounded) before pydantic,
    a single call that holds the GIL, sees it."""
    try:
        data = screen(raw, limits)
    except json.JSONDecodeError as err:
        raise invalid_json(err) from None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)]
        raise RequestValidationError(errors, body=data) from None
    except RecursionError:
        raise APIError(400, "The request body is nested too deeply.") from None


def invalid_json(err: json.JSONDecodeError) -> RequestValidationError:
    """FastAPI's own error for a body that is not JSON."""
    error = {
        "type": "json_invalid",
        "loc": ("body", err.pos),
        "msg": "JSON decode error",
        "input": {},
        "ctx": {"error": err.msg},
    }
    return RequestValidationError([error], body=err.doc)


async def parsed_off_loop(
    request: Request, model: type[BaseModel], raw: bytes, limits: Limits
) -> Any:
    """A large body is screened by the child first; then any body is parsed in a thread."""
    if len(raw) > SCREEN_BYTES:
        try:
            await request.app.state.body_screen.check(raw, limits)
        except json.JSONDecodeError as err:
            raise invalid_json(err) from None
    return await off_loop(request, parsed, model, raw, limits)


def _body_model(route: APIRoute) -> type[BaseModel] | None:
    field = route.body_field
    annotation = getattr(getattr(field, "field_info", None), "annotation", None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _is_json(request: Request) -> bool:
    """FastAPI's rule for parsing a body as JSON: no content type, or application/json (or
    a `+json` subtype)."""
    content_type = request.headers.get("content-type")
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )
