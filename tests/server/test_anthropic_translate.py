"""An Anthropic Messages request as the chat request it asks for (server/anthropic/translate.py),
and the decoder's parts as content blocks and their stream events (server/anthropic/view.py)."""

from __future__ import annotations

import json

import pytest

from kvledger.config.frontend import Limits
from server.anthropic.protocol import CountTokensRequest, MessagesRequest
from server.anthropic.translate import in_anthropic_terms, to_chat
from server.anthropic.view import Blocks
from server.errors import APIError
from server.tool_parser import CallPart

LIMITS = Limits()
TOOL = {"name": "f", "input_schema": {"type": "object"}}


def chat(**body):  # noqa: ANN003, ANN201
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]} | body
    return to_chat(MessagesRequest.model_validate(body), LIMITS)


def test_system_turns_and_tools_become_chats():
    request = chat(
        system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "looking"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": [1]}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "bad",
                 "is_error": True},
                {"type": "text", "text": "and?"},
            ]},
        ],
        tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"], temperature=0.5, top_k=3, metadata={"user_id": "u"},
    )  # fmt: skip
    roles = [m.role for m in request.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    assert [p.text for p in request.messages[0].content] == ["a", "b"]
    call = request.messages[2].tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "toolu_1", "f", {"x": [1]},
    )  # fmt: skip
    assert request.messages[3].content == "r1\nr2" and request.messages[3].tool_call_id == "toolu_1"
    assert request.messages[4].content == "Error: bad"
    assert request.tool_choice == "required" and request.parallel_tool_calls is False
    assert request.tools[0].function.parameters == {"type": "object"}
    assert (request.stop, request.temperature, request.top_k, request.user) == (
        ["END"], 0.5, 3, "u",
    )  # fmt: skip
    assert request.add_generation_prompt and not request.continue_final_message


def test_a_last_assistant_turn_is_a_prefill_and_choices_map():
    prefill = chat(
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}]
    )
    assert prefill.continue_final_message and not prefill.add_generation_prompt
    named = chat(tools=[TOOL], tool_choice={"type": "tool", "name": "f"})
    assert named.tool_choice.function.name == "f"
    assert chat(tools=[TOOL], tool_choice={"type": "none"}).tool_choice == "none"
    assert chat(tool_choice={"type": "auto"}).tool_choice is None  # no tools: asks nothing
    prompt_only = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    counted = to_chat(CountTokensRequest.model_validate(prompt_only), LIMITS)
    assert counted.max_tokens is None and not counted.stream


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "`thinking`"),
        ({"speed": "fast"}, "`speed`"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "`bash_20250124`"),
        ({"messages": [{"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "t"}]}]}, "cannot hold a `tool_result`"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_refused_by_name(body, says):
    with pytest.raises(APIError) as caught:
        chat(**body)
    assert caught.value.status == 400 and says in caught.value.message


def test_chat_names_become_anthropics_in_messages():
    error = APIError(400, "tools.0.function.parameters must be ...; tools.1.function.name", "tools")
    assert in_anthropic_terms(error).message == "tools.0.input_schema must be ...; tools.1.name"


def test_blocks_whole_and_streamed_agree():
    blocks = Blocks()
    events = blocks.add(["I will ", "call."])
    events += blocks.add([CallPart(0, '{"a": ', "call_abc", "f"), CallPart(0, "1}")])
    events += blocks.add([CallPart(1, "{}", "call_def", "g"), "done"])
    events += blocks.close()
    assert blocks.content() == [
        {"type": "text", "text": "I will call."},
        {"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "toolu_def", "name": "g", "input": {}},
        {"type": "text", "text": "done"},
    ]
    kinds = [(e["type"], e["index"]) for e in events]
    assert kinds == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0),
        ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
        ("content_block_delta", 1), ("content_block_stop", 1), ("content_block_start", 2),
        ("content_block_delta", 2), ("content_block_stop", 2), ("content_block_start", 3),
        ("content_block_delta", 3), ("content_block_stop", 3),
    ]  # fmt: skip
    partial = "".join(e["delta"]["partial_json"] for e in events if e.get("index") == 1
                      and e["type"] == "content_block_delta")  # fmt: skip
    assert json.loads(partial) == {"a": 1}
    cut = Blocks()
    cut.add([CallPart(0, '{"a": ', "call_x", "f")])
    assert cut.content()[0]["input"] == {}  # cut short by max_tokens
