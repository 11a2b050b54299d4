"""/v1/messages refusals, in the frontend in this process (the stand-in of
test_messages_in_process.py): every error in Anthropic's shape with the OpenAI routes'
statuses, the fields and blocks not served refused by name, the bounds, `x-api-key`, a prefill,
an error mid-stream as an `error` event; and after all of it no block or tracker entry left
(`serve` waits for an idle ledger)."""

from __future__ import annotations

import anthropic
import pytest

from kvledger.config.frontend import Limits
from tests.e2e.messages_stand_in import (
    ASK,
    HELLO,
    MODEL,
    WEATHER,
    ScriptedRunner,
    decode,
    events_of,
    serve,
)
from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sample

BODY = {"model": MODEL, "max_tokens": 8, "messages": ASK}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}


def turn(*blocks: dict) -> list[dict]:
    return [{"role": "user", "content": list(blocks)}]


def deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


REFUSED = [
    ({**BODY, "messages": turn({"type": "text", "text": "see"}, IMAGE)}, "`image` blocks"),
    (
        {
            **BODY,
            "messages": turn({"type": "tool_result", "tool_use_id": "t", "content": [DOCUMENT]}),
        },
        "`document` blocks",
    ),
    ({**BODY, "messages": turn({"type": "thinking", "thinking": "hm"})}, "`thinking` blocks"),
    ({**BODY, "frequency_penalty": 1}, "frequency_penalty: Extra inputs are not permitted"),
    (
        {**BODY, "messages": turn({"type": "text", "text": "x", "colour": 1})},
        "messages.0.content.0.colour: Extra inputs are not permitted",
    ),
    ({**BODY, "thinking": {"type": "enabled", "budget_tokens": 2048}}, "`thinking`"),
    ({**BODY, "output_config": {"effort": "high"}}, "`output_config`"),
    ({k: v for k, v in BODY.items() if k != "max_tokens"}, "max_tokens"),
    ({**BODY, "max_tokens": 0}, "max_tokens"),
    ({**BODY, "temperature": 1.5}, "temperature"),
    ({**BODY, "temperature": "0.5"}, "temperature"),
    ({**BODY, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search"),
    ({**BODY, "tool_choice": {"type": "any"}}, "tool_choice is only allowed when tools"),
    (
        {**BODY, "tools": [{**WEATHER, "input_schema": {"type": "string"}}]},
        "tools.0.input_schema must be the schema of an object",
    ),
    (
        {**BODY, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
        "`nope`",
    ),
    ({**BODY, "stop_sequences": ["s"] * 17}, "stop_sequences"),
    ({**BODY, "stop_sequences": [""]}, "stop"),
    ({**BODY, "messages": turn(*[{"type": "text", "text": "x"}] * 9)}, "8 content parts"),
    (  # the blocks inside a tool result count too
        {
            **BODY,
            "messages": turn(
                {
                    "type": "tool_result",
                    "tool_use_id": "t",
                    "content": [{"type": "text", "text": "x"}] * 8,
                },
            ),
        },
        "at most 8 content blocks",
    ),  # fmt: skip
    (
        {
            **BODY,
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": deep(40),
                        },
                    ],
                },
            ],
        },
        "messages.1.content.0.input nests deeper than 32",
    ),  # fmt: skip
    (
        {
            **BODY,
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
                    ],
                },
            ],
        },
        "answer it with a tool_result",
    ),  # fmt: skip
    ({**BODY, "messages": []}, "messages"),
    ({**BODY, "messages": [{"role": "system", "content": "x"}]}, "role"),
]


def test_refusals_are_400s_in_anthropics_shape_naming_what(scheduler):
    limits = Limits(max_content_parts=8, max_stop_strings=16)

    async def requests(http, _):  # noqa: ANN001, ANN202
        return [await http.post("/v1/messages", json=body) for body, _ in REFUSED]

    replies = serve(scheduler, ScriptedRunner(HELLO), requests, limits=limits)
    for (body, says), reply in zip(REFUSED, replies, strict=True):
        assert reply.status_code == 400, (body, reply.text)
        assert reply.json()["type"] == "error", reply.text
        error = reply.json()["error"]
        assert set(error) == {"type", "message"}
        assert error["type"] == "invalid_request_error"
        assert says in error["message"], (says, error["message"])


def test_other_errors_keep_the_openai_routes_statuses(scheduler):
    limits = Limits(max_request_body_bytes=4096)

    async def requests(http, _):  # noqa: ANN001, ANN202
        return {
            404: await http.post("/v1/messages", json={**BODY, "model": "no-such-model"}),
            405: await http.get("/v1/messages"),
            413: await http.post("/v1/messages", json={**BODY, "system": "x" * 5000}),
            400: await http.post("/v1/messages", content=b"{not json"),
            "unrouted": await http.post("/v1/messages/batches", json=BODY),
            "no-op values": await http.post(
                "/v1/messages",
                json={**BODY, "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"},
                      "service_tier": "standard_only", "cache_control": {"type": "ephemeral"}},
                headers={"anthropic-version": "2023-06-01", "anthropic-beta": "x"},
            ),
        }  # fmt: skip

    replies = serve(scheduler, ScriptedRunner(HELLO), requests, limits=limits)
    expected = {404: "not_found_error", 405: "invalid_request_error",
                413: "invalid_request_error", 400: "invalid_request_error"}  # fmt: skip
    for status, kind in expected.items():
        reply = replies[status]
        assert reply.status_code == status, reply.text
        assert reply.json()["error"]["type"] == kind, reply.text
    unrouted = replies["unrouted"]
    assert unrouted.status_code == 404 and unrouted.json()["type"] == "error"
    assert "/v1/messages/batches is not served" in unrouted.json()["error"]["message"]
    assert replies["no-op values"].status_code == 200, replies["no-op values"].text


def test_the_key_may_come_as_x_api_key(scheduler):
    async def requests(http, client):  # noqa: ANN001, ANN202
        out = {}
        for name, headers in {
            "x-api-key": {"x-api-key": "sesame"},
            "bearer": {"Authorization": "Bearer sesame"},
            "wrong": {"x-api-key": "nope"},
            "none": {},
        }.items():
            out[name] = await http.post("/v1/messages", json=BODY, headers=headers)
        chat = {"model": MODEL, "messages": ASK, "max_tokens": 2}
        out["chat"] = await http.post(
            "/v1/chat/completions", json=chat, headers={"x-api-key": "sesame"}
        )
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await client.messages.create(model=MODEL, max_tokens=2, messages=ASK)
        out["client"] = caught.value
        return out

    out = serve(scheduler, ScriptedRunner(HELLO), requests, api_key=["sesame"])
    assert out["x-api-key"].status_code == 200 and out["bearer"].status_code == 200
    assert out["chat"].status_code == 200
    for name in ("wrong", "none"):
        assert out[name].status_code == 401
        assert out[name].json()["error"]["type"] == "authentication_error"
    assert out["client"].body["error"]["type"] == "authentication_error"


def test_a_final_assistant_turn_is_continued(scheduler):
    """Anthropic's prefill: the reply holds what follows the assistant's text, which the
    prompt ends with (no new assistant turn is opened)."""
    runner = ScriptedRunner(" friend.")
    prefill = [*ASK, {"role": "assistant", "content": "Hello there,"}]

    async def requests(http, _):  # noqa: ANN001, ANN202
        return await http.post("/v1/messages", json={**BODY, "messages": prefill})

    reply = serve(scheduler, runner, requests)
    assert reply.json()["content"] == [{"type": "text", "text": " friend."}], reply.text
    assert decode(runner.prompts[-1]).endswith("Hello there,")


class FailingRunner(ScriptedRunner):
    """Fails the step that would write the script's fourth token."""

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        if any(c.sample and c.end_pos - c.num_prompt_tokens >= 3 for c in chunks):
            raise RuntimeError("the device fell over")
        return super().execute(chunks)


def test_an_error_mid_stream_is_an_error_event(scheduler):
    async def requests(http, _):  # noqa: ANN001, ANN202
        return await http.post("/v1/messages", json={**BODY, "max_tokens": 16, "stream": True})

    reply = serve(scheduler, FailingRunner(HELLO), requests)
    assert reply.status_code == 200
    events = events_of(reply.text)
    assert events[0][0] == "message_start"
    name, data = events[-1]
    assert name == "error" and data["error"]["type"] == "api_error"
    assert "message_stop" not in [n for n, _ in events]
