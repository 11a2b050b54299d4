"""A Responses request as the chat request it asks for: everything past this point (template,
tools, constraints, bounds, generation) is the chat route's (server/routes/chat.py).

The rules:
- The conversation is the stored one `previous_response_id` names (its input items and its
  output, server/responses_api/store.py), then `input` (a string is one user message).
- `instructions` is the first, system, message; it is this request's only: a previous
  response's instructions are not carried over (OpenAI's rule).
- A message item is a chat message of its role (`developer` is the system turn, as on the chat
  route), its input_text / output_text parts its text parts. `function_call` items are the
  calls of the assistant message before them (a new one if none is), a `function_call_output`
  a `tool` message answering its `call_id`.
- Function `tools` are chat's functions, `tool_choice` chat's (`{"type": "function", "name"}`
  a named function); `text.format` is chat's `response_format`; `max_output_tokens` its
  `max_tokens`.
- Refused with a 400 naming them: item, part, tool and tool_choice types other than those,
  and the fields of NO_OPS set to anything but their no-op values.
- Bounded before any of that is built: the items, stored ones included (`--max-messages`),
  their content parts (`--max-content-parts`), and `metadata` as OpenAI bounds it (16 pairs,
  keys of 64 characters, values of 512); the chat route bounds the rest."""

from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvledger.config.frontend import Limits
from server.bounds import check_count
from server.chat_protocol import ChatCompletionRequest
from server.errors import APIError
from server.responses_api.protocol import (
    NO_OPS,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionTool,
    Item,
    MessageItem,
    ResponsesRequest,
    TextFormat,
    TextPart,
    Unserved,
)
from server.sampling import refuse_unless_no_op

ITEMS = TypeAdapter(list[Item])
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512


def items_of(body: ResponsesRequest, history: list[dict[str, Any]]) -> list[Any]:
    """The conversation's items: the stored ones (validated again, as any input), then the
    request's own."""
    own: list[Any]
    if body.input is None:
        own = []
    elif isinstance(body.input, str):
        own = [MessageItem(role="user", content=body.input)]
    else:
        own = list(body.input)
    return ITEMS.validate_python(history, strict=False) + own if history else own


def to_chat(body: ResponsesRequest, items: list[Any], limits: Limits) -> ChatCompletionRequest:
    """The chat request `body` asks for over the conversation `items`; a 400 naming what
    cannot be translated."""
    for name, no_ops in NO_OPS.items():
        refuse_unless_no_op(name, getattr(body, name), no_ops)
    check_metadata(body.metadata)
    if not items:
        raise APIError(400, "input is required (or a previous_response_id)", param="input")
    check_count(len(items), limits.max_messages, "input", "input items (stored ones included)")
    parts = sum(len(c) for i in items if isinstance(c := getattr(i, "content", None), list))
    check_count(parts, limits.max_content_parts, "input", "content parts")
    messages = [{"role": "system", "content": body.instructions}] if body.instructions else []
    for index, item in enumerate(items):
        _add(messages, item, f"input[{index}]")
    fields: dict[str, Any] = {"model": body.model, "messages": messages, **_sampling(body)}
    fields |= _tools(body)
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as err:  # a value the chat shapes refuse: said as pydantic says it
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise in_responses_terms(APIError(400, f"{where}: {first['msg']}", where)) from None


def check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    check_count(len(metadata), METADATA_PAIRS, "metadata", "metadata pairs")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY or len(value) > METADATA_VALUE:
            raise APIError(
                400,
                f"metadata keys are at most {METADATA_KEY} characters and values at most "
                f"{METADATA_VALUE}",
                param="metadata",
            )


def _add(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if isinstance(item, MessageItem):
        messages.append({"role": item.role, "content": _content(item.content, where)})
    elif isinstance(item, FunctionCallItem):
        call = {"id": item.call_id, "type": "function"}
        call["function"] = {"name": item.name, "arguments": item.arguments}
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": None}
            messages.append(last)
        last.setdefault("tool_calls", []).append(call)
    elif isinstance(item, FunctionCallOutputItem):
        text = item.output if isinstance(item.output, str) else _joined(item.output, where)
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
    else:
        _refuse(item, where, "input items", "message, function_call and function_call_output")


def _content(content: str | list[Any], where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": _text(part, f"{where}.content[{k}]")} for k, part in
            enumerate(content)]  # fmt: skip


def _joined(parts: list[Any], where: str) -> str:
    return "\n".join(_text(part, f"{where}.output[{k}]") for k, part in enumerate(parts))


def _text(part: Any, where: str) -> str:
    if not isinstance(part, TextPart):
        _refuse(part, where, "content parts", "input_text and output_text")
    return part.text


def _refuse(value: Unserved, where: str, what: str, served: str) -> None:
    kind = (value.type or "(no type)")[:64]
    raise APIError(
        400,
        f"{where}: `{kind}` {what} are not supported by this server (it serves {served})",
        param=where.split("[")[0],
    )


def _tools(body: ResponsesRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if body.tools:
        out["tools"] = [_function(tool, f"tools[{k}]") for k, tool in enumerate(body.tools)]
    choice = body.tool_choice
    if choice == "auto" and not body.tools:
        choice = None  # asks for nothing (chat refuses a tool_choice without tools)
    if isinstance(choice, str):
        out["tool_choice"] = choice
    elif isinstance(choice, FunctionChoice):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif isinstance(choice, Unserved):
        _refuse(choice, "tool_choice", "tool choices", "none, auto, required and function")
    if body.parallel_tool_calls is not None:
        out["parallel_tool_calls"] = body.parallel_tool_calls
    return out


def _function(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, FunctionTool):
        _refuse(tool, where, "tools", "function tools")
    function = {"name": tool.name, "parameters": tool.parameters}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _sampling(body: ResponsesRequest) -> dict[str, Any]:
    fields = {
        "max_tokens": body.max_output_tokens,
        "stream": body.stream,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "user": body.user,
        "response_format": _format(body.text.format if body.text else None),
    }
    return {k: v for k, v in fields.items() if v is not None}


def _format(fmt: TextFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": fmt.name, "description": fmt.description, "schema": fmt.schema_}
    schema["strict"] = fmt.strict
    return {
        "type": "json_schema",
        "json_schema": {k: v for k, v in schema.items() if v is not None},
    }


# The chat path's names for what the Responses API calls otherwise, in its error messages.
_RENAMES = (
    (re.compile(r"\btools\.(\d+)\.function\."), r"tools.\1."),
    (re.compile(r"\btools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
    (re.compile(r"\bresponse_format\.json_schema\."), "text.format."),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\bmessages\b"), "input"),
)


def in_responses_terms(err: APIError) -> APIError:
    """The chat path's error, its message and param naming the Responses API's fields
    (`input` for messages: its indices count the instructions' message too)."""
    message, param = err.message, err.param
    for pattern, name in _RENAMES:
        message = pattern.sub(name, message)
        param = pattern.sub(name, param) if param else param
    return APIError(err.status, message, param, err.code)
