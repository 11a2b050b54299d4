"""OpenAI's /v1/responses, the frontend in this process over a real scheduler service and a
stand-in worker that writes a scripted reply in SmolLM2's tokens: the response and its usage,
the stream's events in order, the official `openai` client's create, stream and retrieve,
conversations continued by previous_response_id (also by another frontend over the same
database: a restart or a replica), function calls and their outputs, GET, input_items, DELETE,
tenants kept apart, and every refusal in OpenAI's shape."""

from __future__ import annotations

import json

import openai
import pytest

from kvledger.config.frontend import ResponsesStoreOptions
from tests.e2e.messages_stand_in import CALL_TAG, HELLO, MODEL, ScriptedRunner, decode, serve

ASK = "What is the weather like in Paris?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def openai_client(http_client):  # noqa: ANN001, ANN201
    return openai.AsyncOpenAI(
        base_url="http://t/v1", api_key="k", http_client=http_client, max_retries=0
    )


def stored_in(tmp_path, **more):  # noqa: ANN001, ANN003, ANN201
    options = ResponsesStoreOptions(responses_store=str(tmp_path / "r.sqlite3"), **more)
    return {"responses": options, "sdk": openai_client}


def events_of(text: str) -> list[dict]:
    """A stream's events' data, each checked to be named by its type and numbered in order."""
    out = []
    for chunk in text.strip().split("\n\n"):
        name_line, data_line = chunk.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name_line.removeprefix("event: ")
        assert data["sequence_number"] == len(out)
        out.append(data)
    return out


def test_a_response_its_stream_and_what_is_stored(scheduler, tmp_path):
    body = {"model": MODEL, "input": ASK, "instructions": "Be brief.", "metadata": {"k": "v"}}

    async def requests(http, _):  # noqa: ANN001, ANN202
        made = await http.post("/v1/responses", json=body)
        rid = made.json()["id"]
        streamed = await http.post("/v1/responses", json={**body, "stream": True})
        read = await http.get(f"/v1/responses/{rid}")
        listed = await http.get(f"/v1/responses/{rid}/input_items", params={"order": "asc"})
        deleted = await http.delete(f"/v1/responses/{rid}")
        gone = await http.get(f"/v1/responses/{rid}")
        again = await http.delete(f"/v1/responses/{rid}")
        return made, streamed, read, listed, deleted, gone, again

    runner = ScriptedRunner(HELLO)
    made, streamed, read, listed, deleted, gone, again = serve(
        scheduler, runner, requests, **stored_in(tmp_path)
    )
    assert made.status_code == 200, made.text
    reply = made.json()
    assert reply["id"].startswith("resp_") and reply["object"] == "response"
    assert (reply["status"], reply["model"], reply["store"]) == ("completed", MODEL, True)
    assert reply["instructions"] == "Be brief." and reply["metadata"] == {"k": "v"}
    (message,) = reply["output"]
    assert message["type"] == "message" and message["status"] == "completed"
    assert message["content"][0]["type"] == "output_text"
    assert message["content"][0]["text"] == HELLO
    usage = reply["usage"]
    assert usage["input_tokens"] == len(runner.prompts[0])
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    prompt = decode(runner.prompts[0])
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert f"<|im_start|>user\n{ASK}<|im_end|>" in prompt

    events = events_of(streamed.text)
    names = [e["type"] for e in events]
    assert names[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress"
    assert "".join(e["delta"] for e in events if "delta" in e) == HELLO
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == HELLO
    assert final["usage"]["input_tokens_details"]["cached_tokens"] > 0  # the same prompt again

    assert read.status_code == 200 and read.json() == reply
    items = listed.json()
    assert [i["role"] for i in items["data"]] == ["user"]  # instructions are not an item
    assert items["data"][0]["content"] == ASK and items["first_id"] == items["data"][0]["id"]
    assert deleted.json() == {"id": reply["id"], "object": "response", "deleted": True}
    assert gone.status_code == 404 and again.status_code == 404
    assert gone.json()["error"]["type"] == "not_found_error"


def test_the_openai_client_creates_streams_and_continues(scheduler, tmp_path):
    """A conversation continued by previous_response_id: the prompt holds the earlier turn and
    the reply, its prefix from the prefix cache; earlier instructions are not carried over."""

    async def requests(_, client):  # noqa: ANN001, ANN202
        first = await client.responses.create(model=MODEL, input=ASK, instructions="Be brief.")
        async with client.responses.stream(
            model=MODEL, input="And tomorrow?", previous_response_id=first.id,
            instructions="Be kind.",
        ) as stream:  # fmt: skip
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            text = "".join(deltas)
            second = await stream.get_final_response()
        read = await client.responses.retrieve(second.id)
        third = await client.responses.create(
            model=MODEL, input="Thanks.", previous_response_id=second.id, instructions="Be kind."
        )
        return first, text, second, read, third

    runner = ScriptedRunner(HELLO)
    first, text, second, read, third = serve(scheduler, runner, requests, **stored_in(tmp_path))
    assert first.output_text == HELLO and text == HELLO and second.output_text == HELLO
    assert second.previous_response_id == first.id and read.id == second.id
    earlier, later = (decode(p) for p in runner.prompts[:2])
    assert "Be brief." in earlier and "Be brief." not in later and "Be kind." in later
    assert f"<|im_start|>assistant\n{HELLO}<|im_end|>" in later
    assert later.endswith("<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n")
    assert decode(runner.prompts[2]).startswith(later + HELLO)
    cached = third.usage.input_tokens_details.cached_tokens
    assert cached >= len(runner.prompts[1]) // 4 * 4 > 0  # the second prompt's whole blocks


def test_another_frontend_continues_from_the_same_database(scheduler, tmp_path):
    """A restarted frontend (or a replica) over the same file continues the conversation."""
    runner = ScriptedRunner(HELLO)
    settings = stored_in(tmp_path)

    async def begin(http, _):  # noqa: ANN001, ANN202
        return (await http.post("/v1/responses", json={"model": MODEL, "input": ASK})).json()

    first = serve(scheduler, runner, begin, **settings)

    async def go_on(http, _):  # noqa: ANN001, ANN202
        body = {"model": MODEL, "input": "More?", "previous_response_id": first["id"]}
        return (await http.post("/v1/responses", json=body)).json()

    second = serve(scheduler, runner, go_on, **settings)
    assert second["status"] == "completed", second
    assert decode(runner.prompts[1]).startswith(decode(runner.prompts[0]) + HELLO)


def test_a_function_call_then_its_output(scheduler, tmp_path):
    """`auto`: the call parsed from the text is a function_call item, whole and streamed (its
    arguments as deltas); its output answers it in the next request's input."""
    body = {"model": MODEL, "input": ASK, "tools": [WEATHER], "store": False}
    runner = ScriptedRunner(CALL_TAG)

    async def requests(http, _):  # noqa: ANN001, ANN202
        called = await http.post("/v1/responses", json=body)
        streamed = await http.post("/v1/responses", json={**body, "stream": True})
        call = called.json()["output"][0]
        answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "18 C"}
        turns = [{"role": "user", "content": ASK}, call, answer]
        answered = await http.post("/v1/responses", json={**body, "input": turns})
        gone = await http.get(f"/v1/responses/{called.json()['id']}")
        return called, streamed, answered, gone

    called, streamed, answered, gone = serve(scheduler, runner, requests, **stored_in(tmp_path))
    reply = called.json()
    assert reply["store"] is False and gone.status_code == 404  # store: false keeps nothing
    (call,) = reply["output"]
    assert call["type"] == "function_call" and call["status"] == "completed"
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    events = events_of(streamed.text)
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "function_call" and added["item"]["arguments"] == ""
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert json.loads("".join(deltas)) == {"city": "Paris"} == json.loads(done["arguments"])
    assert answered.status_code == 200, answered.text
    prompt = decode(runner.prompts[-1])
    assert '"city": "Paris"' in prompt and "<|im_start|>tool\n18 C<|im_end|>" in prompt


def test_max_output_tokens_leaves_it_incomplete(scheduler, tmp_path):
    async def requests(http, _):  # noqa: ANN001, ANN202
        body = {"model": MODEL, "input": ASK, "max_output_tokens": 2}
        return (
            await http.post("/v1/responses", json=body),
            await http.post("/v1/responses", json={**body, "stream": True}),
        )

    made, streamed = serve(scheduler, ScriptedRunner(HELLO), requests, **stored_in(tmp_path))
    reply = made.json()
    assert reply["status"] == "incomplete"
    assert reply["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply["output"][0]["status"] == "incomplete" and reply["usage"]["output_tokens"] == 2
    last = events_of(streamed.text)[-1]
    assert last["type"] == "response.incomplete" and last["response"]["status"] == "incomplete"


REFUSED = [
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "`reasoning` input items"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input",
        "`input_image` content parts",
    ),
    ({"tools": [{"type": "web_search"}]}, "tools", "`web_search` tools"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice", "`file_search` tool choices"),
    ({"background": True}, "background", "not supported"),
    ({"truncation": "auto"}, "truncation", "not supported"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id", "not found"),
    ({"max_output_tokens": 0}, "max_output_tokens", "greater than or equal to 1"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 7}}}},
     "text.format", ""),
    ({"metadata": {"k" * 65: "v"}}, "metadata", "64 characters"),
    ({"input": []}, "input", "input is required"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "param", "said"), REFUSED)
def test_refusals_name_the_field(scheduler, tmp_path, change, param, said):
    async def requests(http, _):  # noqa: ANN001, ANN202
        refused = await http.post("/v1/responses", json={"model": MODEL, "input": ASK, **change})
        served = await http.post("/v1/responses", json={"model": MODEL, "input": ASK})
        return refused, served

    refused, served = serve(scheduler, ScriptedRunner(HELLO), requests, **stored_in(tmp_path))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and said in error["message"]
    assert (error["param"] or "").startswith(param), error
    assert served.status_code == 200  # and the server goes on serving


def test_stored_responses_are_the_tenants_that_made_them(scheduler, tmp_path):
    keys = {"api_key": ["key-a", "key-b"]}

    async def requests(http, _):  # noqa: ANN001, ANN202
        a, b = ({"Authorization": f"Bearer {k}"} for k in keys["api_key"])
        made = await http.post("/v1/responses", json={"model": MODEL, "input": ASK}, headers=a)
        rid = made.json()["id"]
        body = {"model": MODEL, "input": "more", "previous_response_id": rid}
        return (
            await http.get(f"/v1/responses/{rid}", headers=a),
            await http.get(f"/v1/responses/{rid}", headers=b),
            await http.post("/v1/responses", json=body, headers=b),
            await http.delete(f"/v1/responses/{rid}", headers=b),
            await http.get(f"/v1/responses/{rid}", headers=a),
        )

    own, other, continued, deleted, still = serve(
        scheduler, ScriptedRunner(HELLO), requests, **stored_in(tmp_path), **keys
    )
    assert own.status_code == 200 and still.status_code == 200
    assert other.status_code == 404 and deleted.status_code == 404
    assert continued.status_code == 400 and "not found" in continued.json()["error"]["message"]


def test_nothing_is_stored_when_the_store_is_off(scheduler):
    async def requests(http, _):  # noqa: ANN001, ANN202
        ask = {"model": MODEL, "input": ASK}
        return (
            await http.post("/v1/responses", json=ask),
            await http.post("/v1/responses", json={**ask, "store": True}),
        )

    off = {"responses": ResponsesStoreOptions(responses_store="off")}
    default, forced = serve(scheduler, ScriptedRunner(HELLO), requests, **off)
    assert default.status_code == 200 and default.json()["store"] is False
    assert forced.status_code == 400 and forced.json()["error"]["param"] == "store"
