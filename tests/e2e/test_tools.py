"""Tool calls on the real model (SmolLM2 from its GGUF file), through the official openai
client and LangChain against `kvledger serve`:

- a named function's arguments, over seeds and temperatures, always parse and validate
  against its parameters schema (constrained decoding), finish_reason `stop` as OpenAI's;
- `required` calls one or more of the tools, each call's arguments valid, `tool_calls`;
- `auto`: the text, or the calls parsed from it (the Hermes format);
- streaming and non-streaming give the same content and calls, in OpenAI's delta shape;
- a conversation with the calls and their results round-trips (and renders them);
- bad tools and tool_choice are 400s naming the parameter;
- LangChain's `bind_tools` round trip.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from kvledger.models import SMOLLM2
from tests.serving import start_serve

pytestmark = pytest.mark.timeout(900)  # the real model on a loaded 2-core machine

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather of a city.",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {"name": "add", "description": "Adds two integers.", "parameters": ADD},
    },
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
MAX_TOKENS = 48  # every call of the tools fits: the city is bounded, the rest enumerated


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = start_serve(
        tmp_path_factory.mktemp("tools"), "--model", SMOLLM2, "--num-kv-blocks", "512",
        timeout=600,
    )  # fmt: skip
    yield served
    served.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=600)


def ask(client, messages=ASK, **kw):  # noqa: ANN001, ANN003, ANN201
    kw = {"tools": TOOLS, "max_tokens": MAX_TOKENS, "temperature": 0} | kw
    return client.chat.completions.create(model=SMOLLM2, messages=messages, **kw)


def valid_calls(message) -> list[tuple[str, dict]]:  # noqa: ANN001
    """The message's calls, each with arguments that parse and validate."""
    out = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        out.append((call.function.name, arguments))
    return out


@pytest.mark.parametrize(("temperature", "seed"), [(0, None), (0.8, 1), (1.3, 2)])
def test_named_call_arguments_validate(client, temperature, seed):
    reply = ask(client, tool_choice=NAMED, temperature=temperature, seed=seed, n=2)
    for choice in reply.choices:
        assert choice.finish_reason == "stop"  # OpenAI's for a named function
        assert choice.message.content is None
        ((name, arguments),) = valid_calls(choice.message)
        assert name == "get_weather"
    greedy = ask(client, tool_choice=NAMED).choices[0].message
    assert valid_calls(greedy)[0][1]["city"] == "Paris"


@pytest.mark.parametrize(("temperature", "seed"), [(0, None), (1.0, 3)])
def test_required_calls_one_of_the_tools(client, temperature, seed):
    """One call (parallel_tool_calls false): SmolLM2, free to add calls, may repeat its call
    until max_tokens runs out."""
    reply = ask(
        client, tool_choice="required", temperature=temperature, seed=seed, n=2,
        parallel_tool_calls=False,
    )  # fmt: skip
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(valid_calls(choice.message)) == 1  # among the tools, arguments valid


def test_required_calls_in_parallel_each_valid(client):
    (choice,) = ask(client, tool_choice="required", max_tokens=96).choices
    calls = valid_calls_but_a_cut_last(choice)
    assert calls and all(name in SCHEMAS for name, _ in calls)


def valid_calls_but_a_cut_last(choice) -> list[tuple[str, dict]]:  # noqa: ANN001
    """Every call valid, but the last when max_tokens cut it."""
    if choice.finish_reason == "length":
        choice.message.tool_calls = choice.message.tool_calls[:-1]
    assert choice.finish_reason in ("tool_calls", "length")
    return valid_calls(choice.message)


def streamed(client, **kw):  # noqa: ANN003, ANN201
    """A stream's content, calls (name, arguments text) and finish reason, its deltas
    checked against OpenAI's shape on the way."""
    content, calls, finish = "", {}, None
    for chunk in ask(client, stream=True, **kw):
        (choice,) = chunk.choices
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:  # a call's first delta: id, type and name
                assert delta.id.startswith("call_") and delta.type == "function"
                calls[delta.index] = [delta.function.name, ""]
            else:
                assert delta.id is None and delta.function.name is None
            calls[delta.index][1] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return content or None, [tuple(calls[i]) for i in sorted(calls)], finish


def whole(client, **kw):  # noqa: ANN003, ANN201
    (choice,) = ask(client, **kw).choices
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content, calls, choice.finish_reason


FEW_SHOT = [
    {"role": "user", "content": "What is the weather like in Rome today?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": '{"city": "Rome", "unit": "celsius"}',
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 24 celsius"},
    {"role": "assistant", "content": "It is sunny in Rome, 24 degrees celsius."},
    *ASK,
]


@pytest.mark.parametrize(
    "kw",
    [
        {"tool_choice": NAMED},
        {"tool_choice": "required", "temperature": 1.0, "seed": 5},
        {"tool_choice": "auto", "messages": FEW_SHOT},
        {"tool_choice": "auto"},
    ],
    ids=["named", "required", "auto-calls", "auto-text"],
)
def test_streaming_equals_non_streaming(client, kw):
    assert streamed(client, **kw) == whole(client, **kw)


def test_auto_gives_text_or_valid_calls(client):
    """SmolLM2-135M, shown the Hermes format and a call in it, answers in text at greedy (it
    was not trained on this format); whatever it writes is text or parsed, valid calls."""
    for temperature, seed in ((0, None), (1.0, 7)):
        (choice,) = ask(client, FEW_SHOT, tool_choice="auto", temperature=temperature,
                        seed=seed).choices  # fmt: skip
        if choice.message.tool_calls:
            assert choice.finish_reason in ("tool_calls", "length")
            valid_calls(choice.message)
        else:
            assert choice.finish_reason in ("stop", "length") and choice.message.content


def test_a_conversation_with_results_round_trips(client, served):
    call = ask(client, tool_choice=NAMED).choices[0].message
    conversation = [
        *ASK,
        call.model_dump(exclude_none=True),  # as the client got it: content null, tool_calls
        {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "rain, 12 celsius"},
    ]
    reply = ask(client, conversation, tool_choice="none")
    (choice,) = reply.choices
    assert choice.message.tool_calls is None and choice.message.content
    assert "tool_response" not in choice.message.content  # the result is not echoed back
    ids = httpx.post(f"{served.url}/tokenize", json={"model": SMOLLM2, "messages": conversation})
    text = httpx.post(
        f"{served.url}/detokenize", json={"model": SMOLLM2, "tokens": ids.json()["tokens"]}
    ).json()["prompt"]
    arguments = call.tool_calls[0].function.arguments
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>' in text
    assert "</tool_call>\ntool\nrain, 12 celsius\n" in text  # its own turn (markers dropped)


BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "no-such-type"}}}}}]},
        "tools.0.function.parameters",
    ),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": NAMED, "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages.1.tool_call_id"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param"), BAD)
def test_bad_tools_are_400s_naming_the_parameter(served, client, extra, param):
    body = {"model": SMOLLM2, "messages": ASK, "tools": TOOLS, "max_tokens": 4} | extra
    reply = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(**body)


def test_langchain_bind_tools_round_trip(served):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, unit: str) -> str:
        """The current weather of a city, in celsius or fahrenheit."""
        return f"sunny, 20 {unit}"

    llm = ChatOpenAI(
        model=SMOLLM2, base_url=f"{served.url}/v1", api_key="x", temperature=0,
        max_tokens=MAX_TOKENS, max_retries=0,
    )  # fmt: skip
    messages = [HumanMessage(ASK[0]["content"])]
    called = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}
    messages += [called, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = llm.bind_tools([get_weather]).invoke(messages)
    assert isinstance(answer.content, str)
