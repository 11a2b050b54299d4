"""Tools, tool calls and tool results in the prompt.

A chat template that reads `tools` (ChatTemplate.reads_tools) gets them as transformers
passes them: `tools` as OpenAI's list, and each assistant call's `arguments` as an object.

A template that does not (SmolLM2's plain ChatML, tiny-llama's) gets the Hermes format that
Qwen2.5 and Hermes models are trained on, written into the messages it does render:
- the tools go into the system message (one is added first when there is none), as JSON
  lines inside `<tools></tools>`, with the instruction to answer with
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (server/tool_parser.py reads it);
- an assistant message's calls follow its content, each as such a tag;
- a run of `tool` messages becomes one user message, each result inside
  `<tool_response></tool_response>`; or, for a template whose model reads them better so
  (results_as_tool_turns: SmolLM2's), each result is a turn of role `tool`.
Otherwise only the roles system, user and assistant reach such a template."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from kvledger.config.frontend import Limits
from server.bounds import check_count, check_names
from server.chat_protocol import ChatMessage
from server.chat_template import ChatTemplate, ChatTemplateError
from server.errors import APIError
from server.tool_protocol import FunctionDefinition

TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def check_tool_messages(messages: list[ChatMessage], limits: Limits) -> None:
    """Tool results name the call they answer; only assistant messages carry calls, whose
    ids and names are bounded as names are, and which count as content parts."""
    calls = 0
    for i, message in enumerate(messages):
        if message.role == "tool" and not message.tool_call_id:
            raise APIError(
                400, f"messages[{i}]: a tool message needs its tool_call_id",
                param=f"messages.{i}.tool_call_id",
            )  # fmt: skip
        check_names(limits, tool_call_id=message.tool_call_id)
        if message.tool_calls and message.role != "assistant":
            raise APIError(
                400, f"messages[{i}]: only assistant messages carry tool_calls",
                param=f"messages.{i}.tool_calls",
            )  # fmt: skip
        for call in message.tool_calls or []:
            check_names(limits, tool_call_id=call.id, name=call.function.name)
        calls += len(message.tool_calls or [])
    check_count(calls, limits.max_content_parts, "messages", "content parts and tool calls")


# Templates known by a phrase of their own text whose models get tool results as `tool` turns:
# SmolLM2-Instruct's (its SFT data, smol-smoltalk, holds no function calling).
TOOL_TURN_TEMPLATES = ("named SmolLM, trained by Hugging Face",)


def results_as_tool_turns(template: ChatTemplate) -> bool:
    """Whether tool results reach this template as turns of their own role, `tool` (else as
    one user turn of `<tool_response>` tags, as Hermes-trained models read them). Only for a
    template known by its own text (TOOL_TURN_TEMPLATES) that renders such a turn: a model
    trained on no tool format copies a user turn of tags back as its answer, where it
    answers a `tool` turn (docs/tools.md)."""
    known = any(phrase in template.source for phrase in TOOL_TURN_TEMPLATES)
    return known and _renders_tool_turns(template.source)


@lru_cache(maxsize=16)
def _renders_tool_turns(source: str) -> bool:
    """Whether a `tool` message renders as a turn naming its role, its text inside."""
    probe = "kvledger-probe-result"
    try:
        text = ChatTemplate(source).render(
            [{"role": "user", "content": "q"}, {"role": "tool", "content": probe}],
            add_generation_prompt=False,
        )
    except ChatTemplateError:
        return False
    before = text.partition(probe)[0]
    return probe in text and "tool" in before[-len(probe) :]


def tool_dicts(functions: tuple[FunctionDefinition, ...]) -> list[dict[str, Any]]:
    """The tools as OpenAI's request lists them (and templates read them)."""
    return [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in functions]


def with_parsed_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a template that reads tools: each call's arguments as an object, as transformers'
    templates expect them."""
    out = []
    for message in messages:
        if "tool_calls" in message:
            message = dict(message)
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _arguments(c)}}
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


def hermes_messages(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    escape: Callable[[str], str],
    tool_turns: bool = False,
) -> list[dict[str, Any]]:
    """The messages with tools, calls and results written in the Hermes format (results as
    `tool` turns with `tool_turns`). The messages' strings are already escaped
    (server/plain_content.py); `escape` escapes the tools' JSON, so the tags the server writes
    are the only markup."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "tool" and tool_turns:
            out.append({"role": "tool", "content": message.get("content", "")})
        elif role == "tool":
            result = f"<tool_response>\n{message.get('content', '')}\n</tool_response>"
            if out and out[-1].get("_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "_results": True})
        elif role == "assistant" and message.get("tool_calls"):
            out.append({**_without(message, "tool_calls"), "content": _calls_text(message)})
        else:
            out.append(_without(message, "tool_call_id"))
    out = [_without(m, "_results") for m in out]
    if tools:
        block = TOOLS_INTRO + "\n".join(escape(_dumps(t)) for t in tools) + TOOLS_OUTRO
        if out and out[0]["role"] == "system" and out[0].get("content"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        elif out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _calls_text(message: dict[str, Any]) -> str:
    tags = []
    for call in message["tool_calls"]:
        body = {"name": call["function"]["name"], "arguments": _arguments(call)}
        tags.append(f"<tool_call>\n{_dumps(body)}\n</tool_call>")
    content = message.get("content") or ""
    return "\n".join([content, *tags] if content else tags)


def _arguments(call: dict[str, Any]) -> dict[str, Any] | str:
    """The call's arguments as an object; text that is not one (OpenAI takes any string, and
    a call cut short by max_tokens comes back so) stays the string it is."""
    text = call["function"]["arguments"]
    try:
        arguments = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return arguments if isinstance(arguments, dict) else text


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _without(message: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != key}
