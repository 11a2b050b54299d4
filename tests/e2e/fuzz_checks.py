"""The shapes every response of the schema fuzz (tests/e2e/test_schema_fuzz.py) must have,
beyond its schema: OpenAI's error object, Anthropic's under /v1/messages, and each route's
stream events. Importing the module registers the check with schemathesis."""

from __future__ import annotations

import json

import schemathesis

OPENAI_ERROR_FIELDS = {"message", "type", "param", "code"}
# Generating routes and the object their stream's chunks name.
GENERATING = {"/v1/completions": "text_completion", "/v1/chat/completions": "chat.completion.chunk"}
ANTHROPIC = "/v1/messages"  # its routes answer in Anthropic's shapes, take x-api-key too
RESPONSES = "/v1/responses"  # its streams are named events, ended by the whole response


def _body_fields(case) -> set[str]:  # noqa: ANN001
    """Top-level properties of the operation's JSON request body, from the served schema."""
    request_body = case.operation.definition.raw.get("requestBody", {})
    schema = request_body.get("content", {}).get("application/json", {}).get("schema", {})
    name = schema.get("$ref", "").rsplit("/", 1)[-1]
    components = case.operation.schema.raw_schema.get("components", {}).get("schemas", {})
    return set(components.get(name, {}).get("properties", {}))


def _assert_openai_error(body: object, case, status: int, where: str) -> None:  # noqa: ANN001
    assert isinstance(body, dict) and set(body) == {"error"}, f"{where}: {body!r}"
    error = body["error"]
    assert isinstance(error, dict) and set(error) == OPENAI_ERROR_FIELDS, f"{where}: {body!r}"
    assert isinstance(error["message"], str) and error["message"], f"{where}: {body!r}"
    assert isinstance(error["type"], str) and error["type"], f"{where}: {body!r}"
    param = error["param"]
    assert param is None or isinstance(param, str), f"{where}: {body!r}"
    if param is not None:  # names a field of the request body (or an item of one), a path
        field = param.split(".")[0]  # parameter (`model` of /v1/models/{model}) or a query one
        names = _body_fields(case) | set(case.path_parameters or {}) | set(case.query or {})
        assert field in names, f"{where}: param {param!r} is no field: {body!r}"
    assert error["code"] is None or isinstance(error["code"], str), f"{where}: {body!r}"
    if 400 <= status < 500:
        assert error["type"] != "server_error", f"{where}: a client error typed as the server's"


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC or path.startswith(ANTHROPIC + "/")


def _assert_anthropic(response, where: str) -> None:  # noqa: ANN001
    """Anthropic's error shape, {"type": "error", "error": {"type", "message"}}; a stream's
    events each named by an `event:` line, the last `message_stop` or an `error`."""
    content_type = response.headers.get("content-type", [""])[0]
    if response.status_code >= 400:
        body = json.loads(response.content)
        assert body.get("type") == "error", f"{where}: {body!r}"
        assert set(body["error"]) == {"type", "message"}, f"{where}: {body!r}"
        assert body["error"]["message"], f"{where}: {body!r}"
    elif content_type.startswith("text/event-stream") and not response.stream_cut_short:
        text = response.content.decode(errors="replace")
        names = [line[7:] for line in text.split("\n") if line.startswith("event: ")]
        assert names and names[0] == "message_start", f"{where}: {names!r}"
        assert names[-1] in ("message_stop", "error"), f"{where}: {names!r}"


def _assert_responses_stream(response, case, where: str) -> None:  # noqa: ANN001
    """The Responses API's events: each named by an `event:` line and numbered in order, the
    first `response.created`, the last the whole response, or an error (OpenAI's fields
    flat, as the Responses API's `error` event has them)."""
    if response.stream_cut_short:
        return
    chunks = response.content.decode(errors="replace").strip().split("\n\n")
    events = []
    for chunk in chunks:
        name, data = chunk.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert event["type"] == name.removeprefix("event: "), f"{where}: {chunk!r}"
        assert event["sequence_number"] == len(events), f"{where}: {chunk!r}"
        events.append(event)
    assert events[0]["type"] == "response.created", f"{where}: {events[0]!r}"
    last = events[-1]
    if last["type"] == "error":
        error = {k: v for k, v in last.items() if k in OPENAI_ERROR_FIELDS | {"code"}}
        _assert_openai_error({"error": {**error, "type": last["code"]}}, case, 500, where)
    else:
        assert last["type"] in ("response.completed", "response.incomplete"), f"{where}: {last}"


@schemathesis.check
def openai_error_shape(ctx, response, case) -> None:  # noqa: ANN001
    """Every error is JSON in OpenAI's shape: {"error": {"message", "type", "param", "code"}},
    and so is an error that ends a stream; a stream's events are JSON, then `[DONE]`. Under
    /v1/messages, Anthropic's shapes instead."""
    del ctx
    where = f"{case.method} {case.path} -> {response.status_code}"
    if is_anthropic(case.path):
        _assert_anthropic(response, where)
        return
    content_type = response.headers.get("content-type", [""])[0]
    if case.path == RESPONSES and content_type.startswith("text/event-stream"):
        _assert_responses_stream(response, case, where)
        return
    if response.status_code >= 400:
        assert content_type.startswith("application/json"), f"{where}: {content_type!r}"
        _assert_openai_error(json.loads(response.content), case, response.status_code, where)
    elif content_type.startswith("text/event-stream"):
        lines = response.content.decode(errors="replace").split("\n")
        data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        if not response.stream_cut_short:
            assert data and data[-1] == "[DONE]", f"{where}: stream without [DONE]: {data!r}"
        data = data[:-1]  # [DONE], or an event the client stopped reading in the middle
        for event in data:
            chunk = json.loads(event)
            if "error" in chunk:
                _assert_openai_error(chunk, case, 500, f"{where} (in the stream)")
            else:
                assert chunk.get("object") == GENERATING[case.path], f"{where}: {chunk!r}"
