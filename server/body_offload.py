"""Request bodies parsed and validated off the event loop.

FastAPI parses a JSON body and validates it against the route's model on the event loop,
which meanwhile streams every other request's tokens: a few large chat bodies of many empty
messages froze every stream for seconds (docs/performance.md, "Frontend under large
requests"). A route of this class reads the body, then parses and validates it in a thread
(server/offload.py: a bounded number at once) before FastAPI sees it, and hands FastAPI the
validated model, which pydantic takes as it is (an instance of the model is not validated
again). Errors are FastAPI's own: RequestValidationError with the
same `loc`, `type` and `msg`, so clients get the same 400s (server/errors.py)."""

from __future__ import annotations

import email.message
import json
import json.scanner
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from kvledger.config.frontend import Limits
from server.errors import APIError
from server.offload import off_loop
from server.prebound import prebound


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
                request._json = await off_loop(request, parsed, model, raw, limits)
            return await handler(request)

        return parse_then_handle


def parsed(model: type[BaseModel], raw: bytes, limits: Limits) -> Any:
    """The body as a validated model, or FastAPI's RequestValidationError for it. Its lists
    are counted (server/prebound.py) before pydantic, a single call that holds the GIL, sees
    them."""
    try:
        data = _decode(raw)
    except json.JSONDecodeError as err:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", err.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": err.msg},
                }
            ],
            body=err.doc,
        ) from None
    except (RecursionError, UnicodeDecodeError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else "not UTF-8 text"
        raise APIError(400, f"The request body is not valid JSON: {why}.") from None
    prebound(data, limits)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)]
        raise RequestValidationError(errors, body=data) from None
    except RecursionError:
        raise APIError(400, "The request body is nested too deeply.") from None


def _decode(raw: bytes) -> Any:
    """Bodies up to SMALL_BODY_BYTES: json.loads (one short C call). Larger ones: the same
    decoder with Python's own scanner, so that the thread parsing them lets the event loop
    run every few milliseconds (the C scanner holds the GIL for the whole body); their
    strings are still read by the C string scanner."""
    if len(raw) <= SMALL_BODY_BYTES:
        return json.loads(raw)
    text = raw.decode(json.detect_encoding(raw))
    return _PYTHON_DECODER.decode(text)


def _python_decoder() -> json.JSONDecoder:
    decoder = json.JSONDecoder()
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


SMALL_BODY_BYTES = 512 * 1024
_PYTHON_DECODER = _python_decoder()


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
