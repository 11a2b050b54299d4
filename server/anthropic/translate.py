"""An Anthropic Messages request as the chat request it asks for: everything past this point
(template, tools, constraints, bounds, generation) is the chat route's (server/routes/chat.py).

The rules:
- `system` (a string or text blocks) is the system message; a text block's `citations` and
  every `cache_control` are dropped (the prefix cache keeps every prompt's blocks anyway).
- A user turn's `tool_result` blocks become `tool` messages answering their `tool_use_id` (a
  failed one, `is_error`, says so in its text: templates know no such flag), its text blocks
  a user message, in the order they come; an assistant turn's text blocks are its content and
  its `tool_use` blocks its calls, their `input` written as the arguments' JSON.
- A conversation that ends with an assistant turn asks to continue it (Anthropic's prefill):
  chat's `continue_final_message`, the reply holding only what follows.
- `tools` are functions with `input_schema` as their parameters; `tool_choice` `auto`, `any`,
  `tool` (a name) and `none` are chat's `auto`, `required`, a named function and `none`;
  `disable_parallel_tool_use` is `parallel_tool_calls: false`. `auto` with no tools asks for
  nothing and is dropped (chat refuses a tool_choice without tools).
- `stop_sequences` are stop strings; `metadata.user_id` is chat's `user` (bounded as it is).
- Refused with a 400 naming them: blocks other than text, tool_use and tool_result (images,
  documents, thinking, ...), a block in a turn of the wrong role, server tools, and the fields
  of NO_OPS set to anything but their no-op values.
- Bounded before any of that is built: the turns (`--max-messages`), the blocks across them,
  system and tool results included (`--max-content-parts`), and each tool_use's `input` as
  the tools are (`--max-tools-chars`, 32 levels); the chat route bounds the rest."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from kvledger.config.frontend import Limits
from server.anthropic.protocol import (
    NO_OPS,
    Block,
    CountTokensRequest,
    CustomTool,
    MessageParam,
    MessagesRequest,
    TextBlock,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
    UnservedBlock,
)
from server.bounds import check_count, check_nested
from server.chat_protocol import ChatCompletionRequest
from server.errors import APIError
from server.sampling import refuse_unless_no_op
from server.tools import MAX_SCHEMA_DEPTH

SERVED_BLOCKS = "text, tool_use and tool_result"
ERROR_PREFIX = "Error: "


def to_chat(body: CountTokensRequest, limits: Limits) -> ChatCompletionRequest:
    """The chat request `body` asks for; a 400 naming what cannot be translated."""
    refuse_no_ops(body)
    check_counts(body, limits)
    messages = _system(body.system)
    for index, message in enumerate(body.messages):
        messages += _turn(message, index, limits)
    prefill = body.messages[-1].role == "assistant"
    if prefill and messages[-1].get("tool_calls"):
        raise APIError(
            400,
            "the last message is an assistant's tool_use: answer it with a tool_result in a "
            "user message",
            param="messages",
        )
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "add_generation_prompt": not prefill,
        "continue_final_message": prefill,
        **_tools(body),
    }
    if isinstance(body, MessagesRequest):
        fields |= _sampling(body)
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as err:  # a value the chat shapes refuse: said as pydantic says it
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(400, f"{where}: {first['msg']}", param=where.split(".")[0]) from None


def refuse_no_ops(body: CountTokensRequest) -> None:
    """A field of Anthropic's this server does not implement, set to anything but a value that
    asks for nothing, is a 400 naming it: a reply that ignored it is not what was asked."""
    for name, no_ops in NO_OPS.items():
        refuse_unless_no_op(name, getattr(body, name, None), no_ops)


def check_counts(body: CountTokensRequest, limits: Limits) -> None:
    """Turns and blocks (system's, each turn's and those inside tool results) counted."""
    check_count(len(body.messages), limits.max_messages, "messages", "messages")
    blocks = len(body.system) if isinstance(body.system, list) else 0
    for message in body.messages:
        if isinstance(message.content, list):
            blocks += len(message.content)
            blocks += sum(_result_parts(b) for b in message.content)
    check_count(blocks, limits.max_content_parts, "messages", "content blocks")


def _result_parts(block: Block) -> int:
    if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
        return len(block.content)
    return 0


def _system(system: str | list[TextBlock] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    return [{"role": "system", "content": [_text_part(b) for b in system]}]


def _text_part(block: TextBlock) -> dict[str, Any]:
    return {"type": "text", "text": block.text}


def _turn(message: MessageParam, index: int, limits: Limits) -> list[dict[str, Any]]:
    """One turn as chat messages (a user turn's tool results split off, in order)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        return [_assistant(message.content, index, limits)]
    out: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        if isinstance(block, ToolResultBlock):
            if texts:
                out.append({"role": "user", "content": texts})
                texts = []
            out.append(_tool_result(block, f"messages[{index}].content[{j}]"))
        elif isinstance(block, TextBlock):
            texts.append(_text_part(block))
        else:
            _refuse_block(block, f"messages[{index}].content[{j}]", "user")
    if texts or not out:
        out.append({"role": "user", "content": texts})
    return out


def _assistant(blocks: list[Block], index: int, limits: Limits) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(_text_part(block))
        elif isinstance(block, ToolUseBlock):
            field = f"messages.{index}.content.{j}.input"
            check_nested(block.input, field, limits.max_tools_chars, MAX_SCHEMA_DEPTH)
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        else:
            _refuse_block(block, f"messages[{index}].content[{j}]", "assistant")
    message: dict[str, Any] = {"role": "assistant", "content": texts or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_result(block: ToolResultBlock, where: str) -> dict[str, Any]:
    if isinstance(block.content, list):
        texts = []
        for k, part in enumerate(block.content):
            if not isinstance(part, TextBlock):
                _refuse_block(part, f"{where}.content[{k}]", "tool_result")
            texts.append(part.text)
        text = "\n".join(texts)
    else:
        text = block.content or ""
    if block.is_error:
        text = ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def _refuse_block(block: Block | UnservedBlock, where: str, role: str) -> None:
    if isinstance(block, UnservedBlock):
        raise APIError(
            400,
            f"{where}: `{block.type[:64]}` blocks are not supported by this server (it serves "
            f"{SERVED_BLOCKS} blocks)",
            param="messages",
        )
    raise APIError(400, f"{where}: a {role} turn cannot hold a `{block.type}` block", "messages")


def _tools(body: CountTokensRequest) -> dict[str, Any]:
    """chat's `tools`, `tool_choice` and `parallel_tool_calls` (those set)."""
    out: dict[str, Any] = {}
    if body.tools:
        out["tools"] = [_function(tool, k) for k, tool in enumerate(body.tools)]
    choice = body.tool_choice
    if isinstance(choice, ToolChoiceAuto) and not body.tools:
        choice = None
    if isinstance(choice, ToolChoiceNone):
        out["tool_choice"] = "none"
    elif isinstance(choice, ToolChoiceAuto | ToolChoiceAny):
        out["tool_choice"] = "auto" if isinstance(choice, ToolChoiceAuto) else "required"
    elif isinstance(choice, ToolChoiceTool):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    if getattr(choice, "disable_parallel_tool_use", None):
        out["parallel_tool_calls"] = False
    return out


def _function(tool: Any, index: int) -> dict[str, Any]:
    if not isinstance(tool, CustomTool):
        raise APIError(
            400,
            f"tools[{index}]: the server tool `{tool.type[:64]}` is not supported by this "
            "server (only custom tools: a name and an input_schema)",
            param="tools",
        )
    function = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _sampling(body: MessagesRequest) -> dict[str, Any]:
    fields = {
        "max_tokens": body.max_tokens,
        "stream": body.stream,
        "stop": body.stop_sequences,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "user": body.metadata.user_id if body.metadata else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


# The chat path's names for what Anthropic calls otherwise, in its error messages.
_RENAMES = (
    (re.compile(r"tools\.(\d+)\.function\.parameters"), r"tools.\1.input_schema"),
    (re.compile(r"tools\.(\d+)\.function\."), r"tools.\1."),
    (re.compile(r"\bstop strings\b"), "stop_sequences"),
)


def in_anthropic_terms(err: APIError) -> APIError:
    """The chat path's error, its message naming Anthropic's fields (`input_schema` for a
    function's `parameters`, `stop_sequences` for stop strings)."""
    message = err.message
    for pattern, name in _RENAMES:
        message = pattern.sub(name, message)
    return APIError(err.status, message, err.param, err.code)
