"""Anthropic's /v1/messages, the frontend in this process over a real scheduler service and a
stand-in worker that writes a scripted reply in SmolLM2's tokens (its GGUF file's tokenizer and
ChatML template): text, stop reasons, usage with the prefix cache's hit, the stream's events in
order, and tool_use / tool_result round trips (the calls parsed by the chat path's decoders),
through raw HTTP and the official `anthropic` client."""

from __future__ import annotations

import json

import pytest

from tests.e2e.messages_stand_in import (
    ASK,
    CALL_TAG,
    HELLO,
    MODEL,
    WEATHER,
    ScriptedRunner,
    decode,
    encode,
    events_of,
    serve,
)


def test_a_text_reply_its_usage_and_its_stream(scheduler):
    body = {"model": MODEL, "max_tokens": 32, "messages": ASK}

    async def requests(http, _):  # noqa: ANN001, ANN202
        first = await http.post("/v1/messages", json=body)
        again = await http.post("/v1/messages", json=body)
        counted = await http.post(
            "/v1/messages/count_tokens", json={"model": MODEL, "messages": ASK}
        )
        streamed = await http.post("/v1/messages", json={**body, "stream": True})
        return first, again, counted, streamed

    first, again, counted, streamed = serve(scheduler, ScriptedRunner(HELLO), requests)
    assert first.status_code == 200, first.text
    reply = first.json()
    assert reply["id"].startswith("msg_") and reply["type"] == "message"
    assert (reply["role"], reply["model"]) == ("assistant", MODEL)
    assert reply["content"] == [{"type": "text", "text": HELLO}]
    assert (reply["stop_reason"], reply["stop_sequence"]) == ("end_turn", None)
    prompt = counted.json()["input_tokens"]
    usage = reply["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == prompt
    assert usage["output_tokens"] == len(encode(HELLO)) + 1  # and the EOS
    cached = again.json()["usage"]
    assert cached["cache_read_input_tokens"] > 0 and cached["cache_creation_input_tokens"] == 0
    assert cached["input_tokens"] + cached["cache_read_input_tokens"] == prompt
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = events_of(streamed.text)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] == prompt
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == HELLO
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == usage["output_tokens"]


def test_stop_sequences_and_max_tokens(scheduler):
    body = {"model": MODEL, "max_tokens": 32, "messages": ASK}

    async def requests(http, _):  # noqa: ANN001, ANN202
        stopped = await http.post("/v1/messages", json={**body, "stop_sequences": ["there"]})
        stream = {**body, "stop_sequences": ["there"], "stream": True}
        streamed = await http.post("/v1/messages", json=stream)
        short = await http.post("/v1/messages", json={**body, "max_tokens": 2})
        return stopped, streamed, short

    stopped, streamed, short = serve(scheduler, ScriptedRunner(HELLO), requests)
    reply = stopped.json()
    assert reply["content"] == [{"type": "text", "text": "Hello "}]
    assert (reply["stop_reason"], reply["stop_sequence"]) == ("stop_sequence", "there")
    delta = events_of(streamed.text)[-2][1]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "there"}
    reply = short.json()
    assert reply["stop_reason"] == "max_tokens" and reply["usage"]["output_tokens"] == 2


def test_a_tool_use_then_its_tool_result(scheduler):
    """`auto`: the call parsed from the text is a tool_use block, whole and streamed (its input
    as input_json_delta); answered with a tool_result, the prompt carries call and result."""
    body = {"model": MODEL, "max_tokens": 64, "messages": ASK, "tools": [WEATHER]}
    runner = ScriptedRunner(CALL_TAG)

    async def requests(http, _):  # noqa: ANN001, ANN202
        called = await http.post("/v1/messages", json=body)
        streamed = await http.post("/v1/messages", json={**body, "stream": True})
        use = called.json()["content"][0]
        turns = [
            *ASK,
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use["id"], "content": "18 C, sunny"},
            ]},
        ]  # fmt: skip
        answered = await http.post("/v1/messages", json={**body, "messages": turns})
        return called, streamed, answered

    called, streamed, answered = serve(scheduler, runner, requests)
    reply = called.json()
    assert reply["stop_reason"] == "tool_use", reply
    (use,) = reply["content"]
    assert use["type"] == "tool_use" and use["id"].startswith("toolu_")
    assert (use["name"], use["input"]) == ("get_weather", {"city": "Paris"})
    events = events_of(streamed.text)
    (start,) = [d for n, d in events if n == "content_block_start"]
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert answered.status_code == 200, answered.text
    prompt = decode(runner.prompts[-1])
    assert "get_weather" in prompt and '"city": "Paris"' in prompt  # the tools and the call
    assert "<|im_start|>tool\n18 C, sunny<|im_end|>" in prompt  # SmolLM2's: a turn of its own


@pytest.mark.parametrize(
    ("choice", "script"),
    [
        ({"type": "any"}, '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
        ({"type": "tool", "name": "get_weather"}, '{"city": "Paris"}'),
    ],
)
def test_the_anthropic_client_round_trips_a_forced_call(scheduler, choice, script):
    """`any` and a named tool force a call (constrained, as chat's `required` and named)."""

    async def requests(_, client):  # noqa: ANN001, ANN202
        called = await client.messages.create(
            model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER], tool_choice=choice
        )
        use = called.content[0]
        turns = [
            *ASK,
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id,
                 "content": [{"type": "text", "text": "18 C"}]},
            ]},
        ]  # fmt: skip
        async with client.messages.stream(
            model=MODEL, max_tokens=64, messages=turns, tools=[WEATHER]
        ) as stream:
            final = await stream.get_final_message()
        return called, final

    called, final = serve(scheduler, ScriptedRunner(script), requests)
    assert called.stop_reason == "tool_use"
    (use,) = called.content
    assert (use.type, use.name, use.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert final.stop_reason == "end_turn"  # the script is no tag without a forced call
    assert final.content[0].type == "text"


def test_the_anthropic_client_creates_and_streams_text(scheduler):
    async def requests(_, client):  # noqa: ANN001, ANN202
        created = await client.messages.create(
            model=MODEL, max_tokens=32, system="Be brief.", messages=ASK,
            extra_body={"temperature": 0.5, "top_k": 5},
        )  # fmt: skip
        async with client.messages.stream(model=MODEL, max_tokens=32, messages=ASK) as stream:
            texts = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
        return created, texts, final

    created, texts, final = serve(scheduler, ScriptedRunner(HELLO), requests)
    assert created.content[0].text == HELLO and created.stop_reason == "end_turn"
    assert "".join(texts) == HELLO
    assert final.content[0].text == HELLO and final.usage.output_tokens > 0
